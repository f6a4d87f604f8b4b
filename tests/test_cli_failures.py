"""Command-line failures are one line, with an exit status and nothing left behind (issue 14, finding 9).

A failure the user can fix (``--out`` under a regular file, a corrupt model file, a full disk) is
one line ``bayes-safe CMD: error: ...`` naming the argument, status 2; anything else is one line
``bayes-safe CMD: internal error: ...``, status 1, with the traceback under ``--debug``. Either way
``--out`` is as it was and no scratch directory remains. Most tests run the real ``bayes-safe``
script in a subprocess.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bayes_safe import cli

SCRIPT = Path(sys.executable).with_name("bayes-safe")
SMALL_RUN = ["--problem", "daulton2019", "--policy", "ts-asc", "--replications", "2", "--horizon", "10",
             "--no-progress"]


def _bayes_safe(args, cwd, preexec_fn=None, timeout=600) -> subprocess.CompletedProcess:
    env = {**os.environ, "MPLBACKEND": "Agg"}
    return subprocess.run([str(SCRIPT), *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=preexec_fn, env=env, check=False)


def _one_error_line(result: subprocess.CompletedProcess, command: str, *needles: str) -> str:
    err = result.stderr
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"bayes-safe {command}: error: "), err
    for needle in needles:
        assert needle in lines[0], err
    return lines[0]


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A small ``simulate`` run (in-process: the subprocesses are the commands under test)."""
    out = tmp_path_factory.mktemp("simulated") / "run"
    assert cli.main(["simulate", *SMALL_RUN, "--out", str(out)]) == 0
    return out


# ------------------------------------------------------------------------------ --out under a regular file
@pytest.mark.parametrize("argv", [
    ["simulate", *SMALL_RUN],
    ["study", "run", "clucb-synthetic", "--quick"],
    ["tune", "video-upload", "--trials", "2"],
])
def test_out_under_a_regular_file_fails_before_any_work(tmp_path, argv):
    (tmp_path / "FILE").write_text("")
    start = time.perf_counter()
    result = _bayes_safe([*argv, "--out", "FILE/run"], cwd=tmp_path)
    seconds = time.perf_counter() - start
    assert result.returncode == 2, result.stderr
    command = " ".join(argv[:2]) if argv[0] == "study" else argv[0]
    _one_error_line(result, command, "--out", "FILE", "is a file")
    assert seconds < 3, f"took {seconds:.1f} s: the check must come before the run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE"]


# -------------------------------------------------------------------------- diagnose on corrupt model files
def _corrupt_safetensors(models: Path) -> str:
    path = min(models.glob("*.safetensors"))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path.name


def _corrupt_json(models: Path) -> str:
    path = min(p for p in models.glob("*.json") if p.name != "policy.json")
    path.write_text(path.read_text()[:40])
    return path.name


def _bad_format_json(models: Path) -> str:
    path = min(p for p in models.glob("*.json") if p.name != "policy.json")
    path.write_text(json.dumps({"format": "something else"}))
    return path.name


@pytest.mark.parametrize("corrupt", [_corrupt_safetensors, _corrupt_json, _bad_format_json])
def test_diagnose_on_a_corrupt_model_file_is_one_line(tmp_path, run_dir, corrupt):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    name = corrupt(run / "models")
    before = _tree(run)
    result = _bayes_safe(["diagnose", "run"], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    _one_error_line(result, "diagnose", name)
    assert _tree(run) == before  # no diagnostics/, no scratch directory
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


# ----------------------------------------------------------------------------------------------- full disk
def _file_size_limit(nbytes: int):
    def set_limit():  # in the child: writes above nbytes fail with EFBIG, as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.RLIM_INFINITY))
    return set_limit


@pytest.mark.parametrize("limit, when", [
    (30_000, "while writing"),   # the trace fits, the figure does not: a write fails during the commit
    (2_000, "before the run"),   # the trace does not fit: refused by the space check
])
def test_a_full_disk_is_one_line_and_leaves_the_old_run(tmp_path, run_dir, limit, when):
    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    (out / "from-the-old-run.txt").write_text("old")
    before = _tree(out)
    result = _bayes_safe(["simulate", *SMALL_RUN, "--out", "run"], cwd=tmp_path, preexec_fn=_file_size_limit(limit))
    assert result.returncode == 2, result.stderr
    line = _one_error_line(result, "simulate", "--out")
    assert ("File too large" in line) if when == "while writing" else ("file-size limit" in line), line
    assert _tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no scratch directory left


def test_a_full_disk_while_writing_the_trace_in_process(tmp_path, monkeypatch, capsys):
    from bayes_safe.trace import Trace

    def full(self, path):
        Path(path).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Trace, "to_netcdf", full)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        cli.main(["simulate", *SMALL_RUN, "--out", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"bayes-safe simulate: error: --out: cannot write {out}: No space left on device"]
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------ internal errors
def _boom(args):
    raise RuntimeError("boom\nsecond line")


def test_an_unexpected_error_is_one_line_with_status_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "_simulate", _boom)
    assert cli.main(["simulate", *SMALL_RUN, "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "bayes-safe simulate: internal error: RuntimeError: boom second line (run with --debug to see the traceback)"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback(tmp_path, monkeypatch, capsys, where):
    monkeypatch.setattr(cli, "_simulate", _boom)
    argv = ["simulate", *SMALL_RUN, "--out", str(tmp_path / "run")]
    argv = ["--debug", *argv] if where == "before" else [*argv, "--debug"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "_boom" in err
    assert err.strip().splitlines()[-1] == "bayes-safe simulate: internal error: RuntimeError: boom second line"


def test_an_interrupt_is_one_line_with_status_130(tmp_path, monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_simulate", interrupted)
    assert cli.main(["simulate", *SMALL_RUN, "--out", str(tmp_path / "run")]) == 130
    assert capsys.readouterr().err == "bayes-safe simulate: interrupted\n"
