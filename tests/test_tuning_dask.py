"""Trials on a real Dask distributed cluster (a LocalCluster on loopback)."""

import os

import pytest

from bayes_safe.tuning import ABTest, Study, VideoUploadProblem
from bayes_safe.tuning.runners import DaskRunner

distributed = pytest.importorskip("distributed")


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
