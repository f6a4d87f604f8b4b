"""Whole-or-nothing output (bayes_safe.io): a write that fails leaves nothing behind, a run replaces
its output directory as a whole, and scratch directories of dead processes are cleared."""

import errno
import os
import subprocess
import sys
import textwrap

import pytest

from bayes_safe import io
from bayes_safe.io import (
    atomic_output_dir,
    atomic_write,
    atomic_write_bytes,
    atomic_write_text,
    check_free_space,
    check_output_path,
    clear_stale_scratch,
    exchange_paths,
)


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield 0o027
    os.umask(old)


def _tree(root):
    """``{relative path: content}`` of the files under ``root`` (directories as ``None``)."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_text()) for p in sorted(root.rglob("*"))}


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ---------------------------------------------------------------------------------------------- files
def test_atomic_write_keeps_the_suffix_and_replaces_whole(tmp_path):
    target = tmp_path / "sub" / "figure.png"
    seen = []

    def write(tmp):
        seen.append(tmp.suffix)
        tmp.write_bytes(b"new")

    atomic_write(target, write)
    assert target.read_bytes() == b"new" and seen == [".png"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["figure.png"]


def test_outputs_follow_the_umask_like_ordinary_files(tmp_path, umask_027):
    atomic_write_text(tmp_path / "a.txt", "x")
    assert oct((tmp_path / "a.txt").stat().st_mode & 0o777) == oct(0o666 & ~umask_027)
    with atomic_output_dir(tmp_path / "run", replace=True) as tmp:
        (tmp / "models").mkdir()
        atomic_write_text(tmp / "models" / "m.json", "{}")
    assert oct((tmp_path / "run").stat().st_mode & 0o777) == oct(0o777 & ~umask_027)
    assert oct((tmp_path / "run" / "models").stat().st_mode & 0o777) == oct(0o777 & ~umask_027)
    assert oct((tmp_path / "run" / "models" / "m.json").stat().st_mode & 0o777) == oct(0o666 & ~umask_027)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "report.md"
    atomic_write_text(target, "old")

    def half_written(tmp):
        tmp.write_text("half")
        raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError, match="crash mid-write"):
        atomic_write(target, half_written)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]


def test_a_failed_write_removes_the_directories_it_created(tmp_path):
    with pytest.raises(RuntimeError):
        atomic_write(tmp_path / "a" / "b" / "x.txt", lambda tmp: (_ for _ in ()).throw(RuntimeError("no")))
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_is_refused_before_writing(tmp_path, monkeypatch):
    monkeypatch.setattr(io, "_free_bytes", lambda path: 10)
    with pytest.raises(OSError, match="not enough free space") as exc:
        atomic_write_bytes(tmp_path / "trace.nc", b"x" * 100)
    assert exc.value.errno == errno.ENOSPC
    with pytest.raises(OSError) as exc:
        check_free_space(tmp_path / "not" / "yet", 100)
    assert exc.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------------------- directories
def test_a_failed_run_adds_nothing_to_the_output_directory(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError), atomic_output_dir(out) as tmp:
        (tmp / "results.json").write_text("{}")
        raise ValueError("study crashed")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_a_failed_run_removes_the_parents_it_created(tmp_path):
    with pytest.raises(ValueError), atomic_output_dir(tmp_path / "a" / "b" / "run", replace=True) as tmp:
        (tmp / "x").write_text("")
        raise ValueError("crashed")
    assert list(tmp_path.iterdir()) == []


def test_replace_swaps_the_whole_directory(tmp_path):
    out = tmp_path / "run"
    (out / "models").mkdir(parents=True)
    (out / "trace.nc").write_text("old trace")
    (out / "models" / "old.json").write_text("old model")
    (out / "only-in-the-old-run.txt").write_text("old")
    with atomic_output_dir(out, replace=True) as tmp:
        assert tmp.name == "run" and tmp.parent.parent == tmp_path and tmp.parent.name.startswith(".run.tmp-")
        (tmp / "models").mkdir()
        (tmp / "trace.nc").write_text("new trace")
        (tmp / "models" / "new.json").write_text("new model")
    assert _tree(out) == {"models": None, "models/new.json": "new model", "trace.nc": "new trace"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # the old directory and the scratch are gone


def test_a_crash_inside_the_block_leaves_the_old_directory_intact(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "trace.nc").write_text("old trace")
    (out / "models").mkdir()
    (out / "models" / "m.json").write_text("old model")
    before = _tree(out)
    with pytest.raises(RuntimeError, match="killed"), atomic_output_dir(out, replace=True) as tmp:
        (tmp / "trace.nc").write_text("half of the new trace")
        raise RuntimeError("killed mid-run")
    assert _tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_later_run_leaves_no_file_of_the_earlier_one(tmp_path):
    out = tmp_path / "run"
    for run, files in enumerate([("a.txt", "models/m1.json"), ("b.txt",)]):
        with atomic_output_dir(out, replace=True) as tmp:
            for name in files:
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                (tmp / name).write_text(str(run))
    assert _tree(out) == {"b.txt": "1"}


def test_merge_keeps_the_other_files(tmp_path):
    out = tmp_path / "study"
    out.mkdir()
    (out / "study.sqlite").write_text("db")
    (out / "report.md").write_text("old")
    with atomic_output_dir(out) as tmp:
        (tmp / "report.md").write_text("new")
    assert _tree(out) == {"report.md": "new", "study.sqlite": "db"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study"]


def test_replace_without_an_atomic_exchange_renames_aside(tmp_path, monkeypatch):
    monkeypatch.setattr(io, "exchange_paths", lambda a, b: False)
    out = tmp_path / "run"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with atomic_output_dir(out, replace=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert _tree(out) == {"new.txt": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_the_fallback_interrupted_between_its_two_renames_is_completed_by_the_next_run(tmp_path):
    # the state a kill leaves between `rename(out, scratch/.old)` and `rename(scratch/run, out)`
    scratch = tmp_path / f".run.tmp-{_dead_pid()}-0a1b2c3d"
    (scratch / ".old").mkdir(parents=True)
    (scratch / ".old" / "old.txt").write_text("old")
    (scratch / "run").mkdir()
    (scratch / "run" / "new.txt").write_text("new")
    assert clear_stale_scratch(tmp_path / "run") == [scratch]
    assert _tree(tmp_path / "run") == {"new.txt": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_exchange_paths_swaps_two_directories(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "in-a").write_text("")
    (b / "in-b").write_text("")
    if not exchange_paths(a, b):
        pytest.skip("no renameat2(RENAME_EXCHANGE) here")
    assert [p.name for p in a.iterdir()] == ["in-b"] and [p.name for p in b.iterdir()] == ["in-a"]
    with pytest.raises(FileNotFoundError):
        exchange_paths(a, tmp_path / "missing")


def test_stale_scratch_of_a_dead_process_is_removed_and_a_live_ones_kept(tmp_path):
    out = tmp_path / "run"
    dead = tmp_path / f".run.tmp-{_dead_pid()}-deadbeef"
    live = tmp_path / f".run.tmp-{os.getppid()}-cafe0000"
    other = tmp_path / f".runs.tmp-{_dead_pid()}-deadbeef"  # another output's scratch
    not_ours = tmp_path / ".run.tmp-keepme"  # no pid: not a name this module writes
    for d in (dead, live, other, not_ours):
        (d / "run").mkdir(parents=True)
        (d / "run" / "half.nc").write_text("")
    with atomic_output_dir(out, replace=True) as tmp:
        (tmp / "trace.nc").write_text("new")
    assert not dead.exists()
    assert live.exists() and other.exists() and not_ours.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name, not_ours.name, "run"])


def test_an_output_under_a_file_or_over_a_file_fails_before_the_body(tmp_path):
    (tmp_path / "FILE").write_text("")
    ran = []
    for out, message in ((tmp_path / "FILE" / "run", "is a file"), (tmp_path / "FILE", "is not a directory")):
        with pytest.raises(NotADirectoryError, match=message), atomic_output_dir(out, replace=True):
            ran.append(out)
        with pytest.raises(NotADirectoryError, match=f"--out: .*{message}"):
            check_output_path(out, "--out")
    assert ran == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE"]


# ----------------------------------------------------------------------------------------- the trace
def _small_trace():
    import torch

    from bayes_safe.trace import Trace

    T, R, M = 4, 2, 2
    z = torch.zeros(T, R, M, dtype=torch.float64)
    return Trace(torch.zeros(T, R, dtype=torch.long), torch.zeros(T, R, dtype=torch.long), z, z, z,
                 torch.ones(T, R, dtype=torch.float64), torch.ones(T, R, dtype=torch.float64),
                 torch.zeros(T, R, dtype=torch.bool), ["reward", "cost"], 0.1, [0, 1])


def test_trace_to_netcdf_is_atomic(tmp_path, monkeypatch):
    from bayes_safe.trace import Trace

    trace, path = _small_trace(), tmp_path / "trace.nc"
    trace.to_netcdf(path)
    assert Trace.from_netcdf(path).regret.tolist() == trace.regret.tolist()
    assert [p.name for p in tmp_path.iterdir()] == ["trace.nc"]
    old = path.read_bytes()
    monkeypatch.setattr(io, "_free_bytes", lambda p: 0)
    with pytest.raises(OSError, match="not enough free space") as exc:
        trace.to_netcdf(path)
    assert exc.value.errno == errno.ENOSPC
    assert path.read_bytes() == old and [p.name for p in tmp_path.iterdir()] == ["trace.nc"]


def test_a_failing_disk_write_of_the_trace_raises_instead_of_crashing(tmp_path):
    """h5py crashes (SIGSEGV) when a file write fails; the trace is built in memory, so a file-size
    limit (EFBIG, as a full disk) is a plain OSError even without the space check."""
    script = textwrap.dedent(f"""
        import errno, resource, signal, sys
        sys.path.insert(0, {str(os.path.dirname(__file__))!r})
        from test_io import _small_trace
        from bayes_safe import io
        io.check_free_space = lambda *a, **k: None  # as if the check could not see the limit
        trace = _small_trace()
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))
        try:
            trace.to_netcdf({str(tmp_path / "trace.nc")!r})
        except OSError as exc:
            print("OSError", exc.errno == errno.EFBIG)
    """)
    out = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "OSError True"
    assert list(tmp_path.iterdir()) == []
