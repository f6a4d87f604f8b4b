"""Issue 28: consent before code, and the command line's smaller safety items.

Through real ``bayes-safe`` processes (the console script, else ``python -m bayes_safe.cli``):

* a study of your own problem stores its ``module:Class``; ``tune resume`` and ``Study.load``
  import it (run its code) only with consent (``--trust-source`` or the same ``--problem``;
  ``trust_source=``). The bundle a study came with holds a module whose import writes a marker
  file: without consent the marker is never written, the refusal (exit 2, one line) names the
  module, the class and the file, and the database is untouched;
* a ``tune`` killed in its power pilot resumes with ``tune resume --out DIR`` as documented;
* a ``--benchmark`` that does not fit the logs is refused before ``study.sqlite`` exists;
* the scratch directory a SIGKILL leaves beside ``--out`` is removed by the next run as it
  starts its work (not only when it reaches its own write);
* ``simulate`` refuses, before allocating, a run whose tensors cannot fit in memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _tune_process import one_error_line

ROOT = Path(__file__).resolve().parents[1]

BUNDLE_MODULE = textwrap.dedent('''
    import os
    import pathlib
    import time

    import torch

    from bayes_safe.envs import Constraint, Problem, Units

    # what a received module could do on import: here, leave a mark
    pathlib.Path(__file__).with_name("imported.marker").write_text("imported")


    class EmailTiming(Problem):
        name = "email-timing"
        metric_names = ("click", "unsubscribe")
        constraints = (Constraint.relative("unsubscribe", at_most=1.02),)
        noise_std = (0.5, 0.5)

        def __init__(self, seed=0, times=3, features=4):
            self.seed, self.times, self.features = seed, times, features
            g = torch.Generator().manual_seed(seed)
            d = times * features
            self.w_click = 0.3 * torch.randn(d, generator=g, dtype=torch.float64)
            self.w_unsub = 0.3 * torch.randn(d, generator=g, dtype=torch.float64)

        def draw(self, n, generator):
            pilot = os.environ.get("PILOT_MARKER")
            if pilot and n > 1:  # the power pilot's first batch (probes draw one unit): hold it there
                pathlib.Path(pilot).write_text("pilot")
                time.sleep(300)
            users = torch.randn(n, self.features, generator=generator, dtype=torch.float64)
            eye = torch.eye(self.times, dtype=torch.float64)
            features = (eye[None, :, :, None] * users[:, None, None, :]).reshape(n, self.times, -1)
            uniforms = torch.rand(n, 2, generator=generator, dtype=torch.float64)
            return Units(features, torch.zeros(n, dtype=torch.long), context=uniforms)

        def expected(self, units, actions):
            x = units.features[torch.arange(len(units)), actions]
            return torch.stack([torch.sigmoid(x @ self.w_click - 1.0), torch.sigmoid(x @ self.w_unsub - 2.5)], -1)

        def outcomes(self, units, actions):
            return (units.context < self.expected(units, actions)).double()
''')

#: the smallest study the command line runs: one Sobol trial of one replicate, 200 units per arm
SMALL = ["--users", "200", "--batches", "2", "--sobol", "1", "--trials", "1", "--replicates", "1", "--no-rerun",
         "--no-progress"]


def _command() -> list[str]:
    script = Path(sys.executable).with_name("bayes-safe")
    return [str(script)] if script.exists() else [sys.executable, "-m", "bayes_safe.cli"]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PILOT_MARKER")}
    return {**env, "PYTHONWARNINGS": "ignore", **extra}


def bayes_safe(*args, cwd: Path, timeout: float = 300, **extra_env) -> subprocess.CompletedProcess:
    return subprocess.run([*_command(), *map(str, args)], check=False, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=_env(**extra_env))


def start(*args, cwd: Path, **extra_env) -> subprocess.Popen:
    return subprocess.Popen([*_command(), *map(str, args)], cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, env=_env(**extra_env))


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the process and its workers, and reap it (a zombie would still own its pid)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wait_for(condition, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        if proc is not None:
            assert proc.poll() is None, f"the process ended (status {proc.returncode}) before {what}"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """A received bundle: the problem module and a finished one-trial study of it in ``study/``."""
    root = tmp_path_factory.mktemp("bundle")
    (root / "email_problem.py").write_text(BUNDLE_MODULE)
    made = bayes_safe("tune", "custom", "--problem", "email_problem:EmailTiming", *SMALL, "--out", "study", cwd=root)
    assert made.returncode == 0, made.stdout + made.stderr
    assert (root / "study" / "study.sqlite").is_file()
    return root


@pytest.fixture
def received(bundle, tmp_path) -> Path:
    """A fresh copy of the bundle, its marker removed (the copy is what each test resumes)."""
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy, ignore=shutil.ignore_patterns("__pycache__", "imported.marker", "*.lock"))
    return copy


# ---------------------------------------------------------------------- consent before code
def test_resume_without_consent_imports_nothing_and_names_module_class_and_file(received):
    db = received / "study" / "study.sqlite"
    before = digest(db)
    refused = bayes_safe("tune", "resume", "--out", "study", cwd=received)
    line = one_error_line(refused, "--trust-source", "'email_problem'", "EmailTiming",
                          str(received / "email_problem.py"), "current directory", "--problem email_problem:EmailTiming")
    assert "nothing was imported" in line
    assert not (received / "imported.marker").exists()  # the module's code never ran
    assert digest(db) == before
    # another class named is no consent either
    other = bayes_safe("tune", "resume", "--out", "study", "--problem", "email_problem:Other", cwd=received)
    one_error_line(other, "--problem", "email_problem:EmailTiming, not email_problem:Other")
    assert not (received / "imported.marker").exists()
    assert digest(db) == before


def test_resume_with_trust_source_imports_and_runs(received):
    done = bayes_safe("tune", "resume", "--out", "study", "--trust-source", "--no-rerun", "--no-progress", cwd=received)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (received / "imported.marker").exists()
    assert "confirmed by --trust-source" in done.stdout and str(received / "email_problem.py") in done.stdout
    assert (received / "study" / "report.md").is_file()


STUDY_LOAD = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    from bayes_safe.tuning import Study

    out = {}
    try:
        Study.load("study/study.sqlite")
    except ValueError as exc:
        out["refused"] = str(exc)
    out["marker_after_refusal"] = Path("imported.marker").exists()
    out["wrong_name"] = None
    try:
        Study.load("study/study.sqlite", trust_source="email_problem:Other")
    except ValueError as exc:
        out["wrong_name"] = str(exc)
    out["marker_after_wrong_name"] = Path("imported.marker").exists()
    study = Study.load("study/study.sqlite", trust_source=True)
    out["completed"] = study.counts().get("COMPLETED", 0)
    out["marker_after_consent"] = Path("imported.marker").exists()
    print(json.dumps(out))
''')


def test_study_load_in_python_needs_consent_too(received):
    # `python -c` puts the current directory first on sys.path itself: the stored name is still refused
    proc = subprocess.run([sys.executable, "-c", STUDY_LOAD], cwd=received, capture_output=True, text=True,
                          timeout=300, env=_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for needle in ("trust_source", "'email_problem'", "EmailTiming", str(received / "email_problem.py")):
        assert needle in out["refused"], out["refused"]
    assert out["marker_after_refusal"] is False
    assert "not email_problem:Other" in out["wrong_name"] and out["marker_after_wrong_name"] is False
    assert out["completed"] == 1 and out["marker_after_consent"] is True


# ---------------------------------------------------------------------- killed in the power pilot
@pytest.mark.slow  # (moved to the slow job: the default run's 15-minute budget)
def test_tune_killed_in_its_power_pilot_resumes_as_documented(tmp_path):
    (tmp_path / "email_problem.py").write_text(BUNDLE_MODULE)
    pilot = tmp_path / "pilot.marker"
    proc = start("tune", "custom", "--problem", "email_problem:EmailTiming", *SMALL, "--out", "study", cwd=tmp_path,
                 PILOT_MARKER=str(pilot))
    try:
        wait_for(pilot.exists, 120, "the power pilot", proc)
    finally:
        kill(proc)
    # as documented (no --trials: the stored target); consent here by naming the same class again
    resumed = bayes_safe("tune", "resume", "--out", "study", "--problem", "email_problem:EmailTiming", "--no-rerun",
                         "--no-progress", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "confirmed by --problem" in resumed.stdout
    assert "target 1 completed trials" in resumed.stdout
    assert (tmp_path / "study" / "report.md").is_file()


# ---------------------------------------------------------------------- --benchmark before any file
def test_benchmark_of_other_logs_is_refused_before_the_study_exists(tmp_path):
    out = tmp_path / "out"
    refused = bayes_safe("tune", "logged-data", "--source", "synthetic", "--rows", "2000", "--trials", "1",
                         "--benchmark", "obd-critical", "--out", out, cwd=tmp_path)
    one_error_line(refused, "--benchmark", "unknown domain 'all'")
    assert not out.exists()  # no study.sqlite, no directory


# ---------------------------------------------------------------------- scratch of a killed run
def _scratch(parent: Path) -> list[Path]:
    return sorted(p for p in parent.iterdir() if p.name.startswith(".sim.tmp-"))


def test_scratch_left_by_a_sigkill_is_removed_by_the_next_run_as_it_starts(tmp_path):
    small = ["simulate", "--problem", "daulton2019", "--policy", "ts", "--replications", "2", "--horizon", "50",
             "--no-progress", "--out", "sim"]
    for _attempt in range(3):  # catch the run while it writes its output (a scratch directory beside --out)
        proc = start(*small, cwd=tmp_path)
        try:
            wait_for(lambda p=proc: bool(_scratch(tmp_path)) or p.poll() is not None, 120, "the output's scratch")
        finally:
            kill(proc)
        if _scratch(tmp_path):
            break
    left = _scratch(tmp_path)
    assert left, "the run was never caught while writing"
    # the next run: a long one, killed in its simulation, long before it writes anything
    proc = start("simulate", "--problem", "daulton2019", "--policy", "ts", "--replications", "2", "--horizon",
                 "5000000", "--no-progress", "--out", "sim", cwd=tmp_path)
    try:
        wait_for(lambda: not any(p.exists() for p in left), 60, "the leftover scratch to be removed", proc)
        assert proc.poll() is None  # removed by the run as it started, not by a finished write
    finally:
        kill(proc)
    assert _scratch(tmp_path) == []


# ---------------------------------------------------------------------- simulate: memory before allocating
@pytest.mark.parametrize("args, option", [
    (["--problem", "daulton2019", "--replications", "1000000000"], "--replications"),
    (["--problem", "kazerouni2017", "--replications", "1000", "--horizon", "100000000"], "--horizon"),
])
def test_simulate_refuses_a_run_that_cannot_fit_in_memory(tmp_path, args, option):
    start_time = time.monotonic()
    refused = bayes_safe("simulate", *args, "--policy", "ts", "--no-progress", "--out", tmp_path / "sim", cwd=tmp_path,
                         timeout=60)
    assert time.monotonic() - start_time < 30
    line = one_error_line(refused, option, "--replications", "--horizon", "GB of memory", "available")
    assert "the trace" in line
    assert not (tmp_path / "sim").exists()


def test_simulate_of_your_own_problem_refuses_before_building_its_models(tmp_path):
    (tmp_path / "email_problem.py").write_text(BUNDLE_MODULE)
    start_time = time.monotonic()
    refused = bayes_safe("simulate", "--problem", "email_problem:EmailTiming", "--policy", "ts-asc", "--replications",
                         "2000000000", "--no-progress", "--out", "sim", cwd=tmp_path, timeout=60)
    assert time.monotonic() - start_time < 30
    one_error_line(refused, "--replications", "GB of memory")
    assert not (tmp_path / "sim").exists()
