"""Signals and orphans (issue 14, finding 4): SIGTERM and SIGKILL of a running ``bayes-safe tune``.

Real processes: the study process and the worker processes and ``multiprocessing`` resource
tracker it starts carry a marker in their environment, by which the test finds every one of
them in ``/proc``. After the signal none may be alive 5 s later; then ``tune resume``
completes the study, re-running every abandoned trial exactly once and losing nothing completed.
"""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from _tune_process import start_tune, wait_for_trials

from bayes_safe.cli import main
from bayes_safe.tuning import Study

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

TARGET = 5
# all Sobol trials (fast generation), small A/B tests: about 1 s per trial once a worker is warm
ARGS = ["--users", "600", "--batches", "2", "--warmup", "300", "--model-epochs", "1", "--sobol", str(TARGET),
        "--parallel", "2", "--trials", str(TARGET)]
MARKER = "BAYES_SAFE_SIGNAL_TEST"


def _marked(token: str) -> list[int]:
    """The pids of live processes whose environment holds ``MARKER=token`` (zombies excluded)."""
    needle = f"{MARKER}={token}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
        except OSError:  # gone, or not ours
            continue
        pids.append(int(entry.name))
    return pids


def _start(out: Path, token: str):
    env = {**os.environ, MARKER: token}
    return start_tune(["video-upload", *ARGS, "--out", str(out)], env=env)


def _stored(db: Path) -> tuple[dict, dict, Study]:
    study = Study.load(db)
    return {i: t.status.name for i, t in study.experiment.trials.items()}, study.observed(), study


def _signal_mid_study(tmp_path, sig: int):
    """Start a study, wait until a trial completed and others are in flight, send ``sig`` to the
    study process only; return what is needed to check the aftermath."""
    out, token = tmp_path / "study", uuid.uuid4().hex
    proc, lines = _start(out, token)
    try:
        wait_for_trials(proc, lines, 1, timeout=90)
        time.sleep(0.2)  # the next trial is generated and submitted: two in flight
        family = _marked(token)
        assert proc.pid in family and len(family) >= 4, f"expected the study, 2 workers and the resource tracker: {family}"
        sent = time.monotonic()
        os.kill(proc.pid, sig)  # the study process only: what it started must go with it
        status = proc.wait(timeout=30)
        # every process of the study is gone within 5 s of the signal
        alive = _marked(token)
        while alive and time.monotonic() - sent < 5:
            time.sleep(0.1)
            alive = _marked(token)
        gone_after = time.monotonic() - sent
        assert not alive, f"processes of the study alive 5 s after {signal.Signals(sig).name}: {alive}"
    finally:
        for pid in _marked(token):  # a failing test leaves nothing behind
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
    time.sleep(0.2)
    return out, status, "".join(lines), gone_after


def _check_resume(out: Path, before: dict, observed_before: dict) -> None:
    """``tune resume`` finishes the study: each abandoned trial re-run exactly once, nothing lost."""
    completed_before = {i for i, s in before.items() if s == "COMPLETED"}
    assert main(["tune", "resume", "--out", str(out)]) == 0
    status, observed, study = _stored(out / "study.sqlite")
    trials = study.experiment.trials
    # nothing completed before the signal was lost or changed
    assert all(status[i] == "COMPLETED" and observed[i] == observed_before[i] for i in completed_before)
    abandoned = [i for i, s in status.items() if s == "ABANDONED"]
    assert abandoned, status
    for i in abandoned:
        assert i not in observed and trials[i].run_metadata.get("interrupted")
        params = dict(trials[i].arm.parameters)
        later = [j for j, t in trials.items() if j > i and status[j] == "COMPLETED" and dict(t.arm.parameters) == params]
        assert len(later) == 1, f"trial {i} re-run {len(later)} times: {status}"
    assert "RUNNING" not in status.values() and "FAILED" not in status.values()
    assert sum(s == "COMPLETED" for s in status.values()) == TARGET
    # resume kept the study's parallelism (stored when the first run started, before any crash)
    assert study.properties["parallel"] == 2 and study.properties["sessions"][-1]["parallel"] == 2
    assert (out / "report.md").exists() and "RUNNING" not in (out / "trials.csv").read_text()


@pytest.mark.slow  # (moved to the slow job: the default run's 15-minute budget)
def test_sigterm_stops_the_study_and_its_workers_and_resume_reruns_the_abandoned_trials(tmp_path):
    out, status, log, _ = _signal_mid_study(tmp_path, signal.SIGTERM)
    assert status == 143, log
    assert "interrupted by SIGTERM" in log and f"continue with: bayes-safe tune resume --out {out}" in log, log
    before, observed, study = _stored(out / "study.sqlite")
    # the trials in flight were marked abandoned by the study process itself: nothing left RUNNING
    assert "RUNNING" not in before.values(), before
    abandoned = [i for i, s in before.items() if s == "ABANDONED"]
    assert abandoned and all(study.experiment.trials[i].run_metadata["error"] == "interrupted by SIGTERM"
                             for i in abandoned), before
    assert study.properties["sessions"][-1]["stopped_by"] == "SIGTERM"
    _check_resume(out, before, observed)


# slow job: a SIGKILL of a study is also covered by test_tuning_crash in the default run
@pytest.mark.slow
def test_sigkill_leaves_no_orphan_and_resume_reruns_the_abandoned_trials(tmp_path):
    out, status, log, gone_after = _signal_mid_study(tmp_path, signal.SIGKILL)
    assert status == -signal.SIGKILL, log
    assert gone_after < 2, f"the workers outlived the study process by {gone_after:.1f} s"
    before, observed, _ = _stored(out / "study.sqlite")
    assert "RUNNING" in before.values(), before  # in flight at the kill: settled by resume
    _check_resume(out, before, observed)


def test_watchdog_ends_a_worker_whose_parent_died_without_the_kernel_signal():
    """The fallback where ``PR_SET_PDEATHSIG`` is unavailable: the watchdog thread on the parent pid."""
    child = ("import sys, time; from bayes_safe.tuning import runners; runners.sys.platform = 'other'; "
             "runners._die_with_parent(int(sys.argv[1])); print('armed', flush=True); time.sleep(60)")
    parent = ("import subprocess, sys, os; c = subprocess.Popen([sys.executable, '-c', sys.argv[1], str(os.getpid())], "
              "stdout=subprocess.PIPE, text=True); assert c.stdout.readline().strip() == 'armed'; print(c.pid, flush=True); "
              "os.kill(os.getpid(), 9)")
    proc = subprocess.run([sys.executable, "-c", parent, child], check=False, capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pid = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 3
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert not Path(f"/proc/{pid}").exists(), "the orphaned worker outlived its parent by 3 s"
    finally:
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)
