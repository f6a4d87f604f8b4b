"""Trials on a real Dask distributed cluster (a LocalCluster on loopback)."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import distributed  # the [dask] extra; make test installs [all]
import pytest

from bayes_safe.tuning import ABTest, Study, VideoUploadProblem
from bayes_safe.tuning.runners import DaskRunner
from bayes_safe.tuning.study import InfrastructureError


@pytest.mark.slow  # (the slow job: the default run's 15-minute budget)
def test_study_runs_trials_on_a_dask_cluster(tmp_path):
    ab = ABTest(VideoUploadProblem(warmup=300, model={"nn_epochs": 1, "nn_min_steps": 20}), n_users=300, batches=2)
    study = Study(ab, storage=tmp_path / "s.sqlite", sobol_trials=3, seed=0)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, worker_dashboard_address=None) as cluster:
        events = []
        summary = study.run(trials=3, parallel=2, scheduler=cluster.scheduler_address, progress=events.append)
    assert study.counts() == {"COMPLETED": 3}
    assert summary["runner"].startswith("Dask scheduler tcp://127.0.0.1")
    workers = {t.run_metadata["worker"] for t in study.experiment.trials.values()}
    assert all(int(w.rsplit(":", 1)[1]) != os.getpid() for w in workers)  # evaluated in the workers
    # a trial's numbers do not depend on where it ran
    trial = study.experiment.trials[0]
    local = ab.evaluate(dict(trial.arm.parameters), seed=trial.run_metadata["seed"])
    assert study.observed()[0]["q_1080p_change"] == pytest.approx(local["q_1080p_change"])


def test_unreachable_scheduler_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot connect to the Dask scheduler at 'tcp://127.0.0.1:9'"):
        DaskRunner("tcp://127.0.0.1:9", timeout=2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # (moved to the slow job: the default run's 15-minute budget)
def test_losing_the_scheduler_stops_the_study_without_failing_trials_and_resume_reruns_them(tmp_path):
    """Issue 14, finding 7: a scheduler killed mid-study is an infrastructure failure, not trial failures."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "start_new_session": True}
    scheduler = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                  "--port", str(port), "--no-dashboard"], **quiet)
    worker = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
                               "--no-dashboard", "--no-nanny"], **quiet)
    db = tmp_path / "s.sqlite"
    try:
        ab = ABTest(VideoUploadProblem(warmup=300, model={"nn_epochs": 1, "nn_min_steps": 20}), n_users=300, batches=2)
        study = Study(ab, storage=db, sobol_trials=3, seed=0)
        events = []

        def kill_scheduler_once_trials_run():
            deadline = time.monotonic() + 60
            while sum(e["event"] == "started" for e in events) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)  # submitted; a fresh Dask worker takes seconds to import and run the first trial
            scheduler.kill()

        threading.Thread(target=kill_scheduler_once_trials_run, daemon=True).start()
        with pytest.raises(InfrastructureError, match=f"lost the Dask scheduler at {address}") as info:
            study.run(trials=3, parallel=2, scheduler=address, progress=events.append)
        assert "no trial failed" in str(info.value)
        assert not any(e["event"] == "failed" for e in events)
    finally:
        for proc in (scheduler, worker):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    # the trials in flight are abandoned (never modelled), none failed; nothing is left RUNNING
    study = Study.load(db)
    status = {i: t.status.name for i, t in study.experiment.trials.items()}
    abandoned = sorted(info.value.abandoned)
    assert abandoned and {i for i, s in status.items() if s == "ABANDONED"} == set(abandoned), status
    assert "FAILED" not in status.values() and "RUNNING" not in status.values(), status
    assert all(address in study.experiment.trials[i].run_metadata["error"] for i in abandoned)
    assert [i for i, _ in study.pending_reruns()] == abandoned
    # resume (here without a cluster) re-runs each abandoned trial exactly once and completes the study
    summary = study.run(trials=3, inline=True)
    status = {i: t.status.name for i, t in study.experiment.trials.items()}
    assert summary["counts"].get("COMPLETED") == 3 and "FAILED" not in status.values()
    for i in abandoned:
        params = dict(study.experiment.trials[i].arm.parameters)
        reruns = [t for j, t in study.experiment.trials.items() if j > i and dict(t.arm.parameters) == params]
        assert len(reruns) == 1 and reruns[0].status.name == "COMPLETED" and reruns[0].run_metadata["rerun_of"] == i
    assert study.pending_reruns() == []
