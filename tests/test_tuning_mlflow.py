"""MLflow tracking of tuning studies (issue 18): every finished trial logged, read back with
MLflow's own client from a file store and from a real ``mlflow server`` started here; crash
and resume neither lose nor double a trial; bad ``--mlflow`` values are one-line errors.

Tiny A/B tests (300 users, a one-epoch model, 2 replicates) keep the file to about a minute.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from bayes_safe.cli import main
from bayes_safe.tuning import ABTest, Study, VideoUploadProblem
from bayes_safe.tuning.tracking import (
    MlflowTracker,
    Tracker,
    TrialRecord,
    check_mlflow_uri,
    resolve_mlflow_uri,
)

TINY_PROBLEM = {"warmup": 300, "model": {"nn_epochs": 1, "nn_min_steps": 20}}
TINY_CLI = ["--users", "300", "--batches", "2", "--warmup", "300", "--model-epochs", "1", "--replicates", "2",
            "--sobol", "2", "--no-compare"]


def tiny_ab() -> ABTest:
    return ABTest(VideoUploadProblem(**TINY_PROBLEM), n_users=300, batches=2, compare=(), replicates=2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True)
def _file_store_allowed(monkeypatch):
    """MLflow 3 refuses its file store unless MLFLOW_ALLOW_FILE_STORE; the tracker sets it around its own
    calls only, so the tests' own readers need it too."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


@pytest.fixture(scope="module", autouse=True)
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server on 127.0.0.1 (SQLite backend), started as the module starts so it
    boots while the file-store tests run; stopped (its process group) at the end."""
    root = tmp_path_factory.mktemp("mlflow_server")
    port = _free_port()
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    cmd = [str(mlflow_cli), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--default-artifact-root", str(root / "artifacts")]
    if not mlflow_cli.exists():  # only the server test needs it; it fails saying so
        yield {"uri": None, "proc": None, "log": None, "missing": str(mlflow_cli)}
        return
    log = open(root / "server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = {"uri": f"http://127.0.0.1:{port}", "proc": proc, "log": root / "server.log"}
    yield server
    with_group = True
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        with_group = False
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        if with_group:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    log.close()


def _wait_for(server, timeout: float = 120.0) -> str:
    if server.get("missing"):
        pytest.fail(f"no {server['missing']}: `mlflow server` needs the full mlflow package (pip install -e '.[all,dev]')")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server["proc"].poll() is not None:
            pytest.fail(f"mlflow server exited with {server['proc'].returncode}: {server['log'].read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(server["uri"] + "/health", timeout=2) as r:
                if r.status == 200:
                    return server["uri"]
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"mlflow server did not answer within {timeout:g} s: {server['log'].read_text()[-2000:]}")


def _runs(uri: str, experiment: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment!r} at {uri}"
    return client.search_runs([exp.experiment_id], max_results=1000)


def _assert_runs_match_study(runs, study: Study) -> None:
    """Every finished trial is exactly one FINISHED run whose parameters, metrics (mean and SEM of every
    metric), feasibility and timings equal what the study stores."""
    observed = study.observed()
    by_trial = {}
    for run in runs:
        assert run.data.tags["bayes_safe.study_uid"] == study.uid
        trial = int(run.data.tags["bayes_safe.trial"])
        assert trial not in by_trial, f"trial {trial} logged twice"
        by_trial[trial] = run
    assert sorted(by_trial) == sorted(observed)
    for idx, metrics in observed.items():
        run, trial = by_trial[idx], study.experiment.trials[idx]
        assert run.info.status == "FINISHED"
        assert run.info.run_name == f"trial {idx}"
        assert run.data.tags["bayes_safe.study"] == study.name
        assert run.data.tags["bayes_safe.node"] == trial.run_metadata["node"]
        for name, value in trial.arm.parameters.items():
            assert float(run.data.params[name]) == value, name
        assert int(run.data.params["seed"]) == study.trial_seed(idx)
        assert int(run.data.params["replicates"]) == 2
        assert len(metrics) > 10  # every metric, not only the modelled ones
        stored = trial.run_metadata["metrics"]  # full precision (Ax's data table keeps 10 digits)
        assert set(stored) == set(metrics)
        for name, (mean, sem) in metrics.items():
            assert run.data.metrics[name] == stored[name][0], name
            assert run.data.metrics[f"{name}_sem"] == stored[name][1], name
            assert run.data.metrics[name] == pytest.approx(mean, rel=1e-9, abs=1e-12), name
            assert run.data.metrics[f"{name}_sem"] == pytest.approx(sem, rel=1e-9, abs=1e-12), name
        assert run.data.metrics["feasible"] == float(study.is_feasible(metrics))
        assert run.data.metrics["sim_seconds"] == trial.run_metadata["sim_seconds"]
        # Ax's store keeps whole seconds: the record uses them, live or loaded
        completed, started = (t.replace(microsecond=0) for t in (trial.time_completed, trial.time_run_started))
        assert run.data.metrics["wall_seconds"] == (completed - started).total_seconds()
        assert run.info.end_time == round(1000 * completed.timestamp())
        assert run.info.start_time == round(1000 * started.timestamp())


@pytest.fixture(scope="module")
def crashed_then_tracked(tmp_path_factory):
    """A study that ran 2 trials untracked (as if the process died after Ax saved them, before the
    tracker logged them), then resumed with a file-store tracker to 3 trials."""
    root = tmp_path_factory.mktemp("tracked")
    db = root / "study.sqlite"
    study = Study(tiny_ab(), storage=db, sobol_trials=2, seed=3)
    study.run(trials=2, inline=True)
    tracker = MlflowTracker(root / "mlruns")
    events = []

    def progress(event):
        if event["event"] == "completed":  # what the store holds when the trial is reported complete
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
                event["in_store"] = sorted(int(r.data.tags["bayes_safe.trial"]) for r in _runs(tracker.uri, resumed.name)
                                           if r.info.status == "FINISHED")
        events.append(event)

    resumed = Study.load(db, ab_test=tiny_ab(), tracker=tracker)
    resumed.run(trials=3, inline=True, progress=progress)
    return {"root": root, "db": db, "study": resumed, "tracker": tracker, "events": events}


def test_file_store_holds_every_trial_as_the_study_stores_it(crashed_then_tracked):
    study, tracker = crashed_then_tracked["study"], crashed_then_tracked["tracker"]
    assert tracker.uri == (crashed_then_tracked["root"] / "mlruns").resolve().as_uri()
    # the two trials finished before the tracker existed were logged as the run started, the third live
    tracked = [e for e in crashed_then_tracked["events"] if e["event"] == "tracked"]
    assert tracked and tracked[0]["logged"] == [0, 1]
    assert study.tracking == {"logged": [0, 1, 2], "failed": {}}
    # trial 2 is in the store as soon as it completes, not at the end of the run
    assert [e["in_store"] for e in crashed_then_tracked["events"] if e["event"] == "completed"] == [[0, 1, 2]]
    _assert_runs_match_study(_runs(tracker.uri, study.name), study)
    # mlflow's own search_runs (a DataFrame) agrees
    import mlflow

    mlflow.set_tracking_uri(tracker.uri)
    try:
        df = mlflow.search_runs(experiment_names=[study.name])
    finally:
        mlflow.set_tracking_uri(None)
    assert sorted(df["tags.bayes_safe.trial"].astype(int)) == [0, 1, 2]
    obs = study.observed()
    for _, row in df.iterrows():
        i = int(row["tags.bayes_safe.trial"])
        assert row["metrics.q_1080p_change"] == pytest.approx(obs[i]["q_1080p_change"][0], rel=1e-9)
        assert row["metrics.reliability_change_sem"] == pytest.approx(obs[i]["reliability_change"][1], rel=1e-9)


def test_resume_never_logs_a_trial_twice_and_replaces_an_unfinished_run(crashed_then_tracked):
    from mlflow import MlflowClient

    db, uri = crashed_then_tracked["db"], crashed_then_tracked["tracker"].uri
    study = Study.load(db, ab_test=tiny_ab(), tracker=MlflowTracker(uri))
    assert study.track() == {"logged": [], "already": 3, "failed": {}}
    # a crash between creating trial 1's run and terminating it: the next sync replaces that run
    client = MlflowClient(uri)
    old = {int(r.data.tags["bayes_safe.trial"]): r for r in _runs(uri, study.name)}
    client.set_terminated(old[1].info.run_id, status="RUNNING")
    again = Study.load(db, ab_test=tiny_ab(), tracker=MlflowTracker(uri))
    assert again.track()["logged"] == [1]
    runs = _runs(uri, study.name)
    assert old[1].info.run_id not in {r.info.run_id for r in runs}
    _assert_runs_match_study(runs, again)


class _Flaky:
    """A Tracker whose store is down for trial 1."""

    def __init__(self):
        self.records: dict[int, TrialRecord] = {}

    def open(self, study, study_uid, description):
        self.description = dict(description)

    def log_trial(self, record):
        if record.trial == 1:
            raise ConnectionError("store down")
        if record.trial in self.records:
            return False
        self.records[record.trial] = record
        return True

    def close(self):
        pass


def test_a_failing_tracker_never_stops_the_study_and_is_reported(crashed_then_tracked):
    flaky = _Flaky()
    assert isinstance(flaky, Tracker)
    study = Study.load(crashed_then_tracked["db"], ab_test=tiny_ab(), tracker=flaky)
    events = []
    out = study.track(progress=events.append)
    assert out["logged"] == [0, 2] and list(out["failed"]) == [1] and "store down" in out["failed"][1]
    assert [e["trial"] for e in events if e["event"] == "tracking_failed"] == [1]
    record = flaky.records[2]
    assert record.status == "COMPLETED" and record.study_uid == study.uid
    assert record.metrics == study.observed()[2]
    assert flaky.description["objective"] == "q_1080p_change"
    with pytest.raises(TypeError, match="tracker: expected"):
        Study.load(crashed_then_tracked["db"], ab_test=tiny_ab(), tracker=object())


@pytest.mark.long
def test_a_real_tracking_server_receives_a_running_study(mlflow_server, tmp_path):
    uri = _wait_for(mlflow_server)
    with MlflowTracker(uri, experiment="bayes_safe server test") as tracker:
        study = Study(tiny_ab(), storage=tmp_path / "s.sqlite", sobol_trials=2, seed=5, tracker=tracker)
        study.run(trials=2, inline=True)
    assert study.tracking == {"logged": [0, 1], "failed": {}}
    _assert_runs_match_study(_runs(uri, "bayes_safe server test"), study)
    # the server's REST API itself (no MLflow client): runs/search with the study's uid
    exp = json.load(urllib.request.urlopen(
        f"{uri}/api/2.0/mlflow/experiments/get-by-name?experiment_name=bayes_safe%20server%20test", timeout=10))
    body = json.dumps({"experiment_ids": [exp["experiment"]["experiment_id"]],
                       "filter": f"tags.`bayes_safe.study_uid` = '{study.uid}'"}).encode()
    req = urllib.request.Request(f"{uri}/api/2.0/mlflow/runs/search", data=body, headers={"Content-Type": "application/json"})
    runs = json.load(urllib.request.urlopen(req, timeout=10))["runs"]
    assert len(runs) == 2
    q = {int({t["key"]: t["value"] for t in r["data"]["tags"]}["bayes_safe.trial"]):
         {m["key"]: m["value"] for m in r["data"]["metrics"]}["q_1080p_change"] for r in runs}
    assert q == {i: study.experiment.trials[i].run_metadata["metrics"]["q_1080p_change"][0] for i in (0, 1)}


@pytest.mark.long  # two command-line studies with their reports: 36 s at load average 3
def test_the_command_line_tracks_to_the_study_directory_and_resume_continues(tmp_path, capsys):
    out = tmp_path / "t"
    assert main(["tune", "video-upload", *TINY_CLI, "--trials", "2", "--mlflow", "--no-progress", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    store = (out / "mlruns").resolve().as_uri()
    assert f"every finished trial is logged to {store}" in text and "mlflow: 2 trial(s) logged this run" in text
    # resume tracks to the stored file store inside the study's directory without being asked again
    assert main(["tune", "resume", "--out", str(out), "--trials", "3", "--no-progress"]) == 0
    assert "mlflow: 1 trial(s) logged this run" in capsys.readouterr().out
    study = Study.load(out / "study.sqlite")
    _assert_runs_match_study(_runs(store, study.name), study)


@pytest.mark.parametrize("value, message", [
    ("ftp://host/x", "unsupported scheme 'ftp'"),
    ("http://", "names no host"),
    ("http://user:secret@127.0.0.1:5000", "credentials in the URI are not accepted"),
    ("http://127.0.0.1:{closed}", "cannot reach an MLflow tracking server"),
    ("{file}", "exists and is not a directory"),
    ("{full_dir}", "neither empty nor an MLflow file store"),
    ("sqlite://", "names no database file"),
])
def test_bad_mlflow_values_are_one_line_errors_before_any_work(tmp_path, capsys, value, message):
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("x")
    value = value.format(closed=_free_port(), file=tmp_path / "a.txt", full_dir=tmp_path / "full")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main(["tune", "video-upload", *TINY_CLI, "--trials", "2", "--mlflow", value, "--out", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("bayes-safe tune: error: --mlflow: ") and message in err, err
    assert "secret" not in err
    assert not out.exists()  # nothing written


def test_missing_mlflow_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    with pytest.raises(SystemExit) as exc:
        main(["tune", "video-upload", *TINY_CLI, "--mlflow", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1, err
    assert "pip install 'bayes-safe[mlflow]'" in err
    assert not (tmp_path / "o").exists()


def test_resolve_mlflow_uri_forms(tmp_path):
    assert resolve_mlflow_uri(None, tmp_path / "d") == (tmp_path / "d").resolve().as_uri()
    assert resolve_mlflow_uri("", tmp_path / "d") == (tmp_path / "d").resolve().as_uri()
    assert resolve_mlflow_uri(str(tmp_path / "x")) == (tmp_path / "x").resolve().as_uri()
    assert resolve_mlflow_uri((tmp_path / "x").as_uri()) == (tmp_path / "x").resolve().as_uri()
    assert resolve_mlflow_uri("http://127.0.0.1:5000/") == "http://127.0.0.1:5000"
    assert resolve_mlflow_uri("sqlite:////tmp/m.db") == "sqlite:////tmp/m.db"
    with pytest.raises(ValueError, match="^mlflow: .*got no value"):
        resolve_mlflow_uri(None)
    with pytest.raises(ValueError, match="local path"):
        resolve_mlflow_uri("file://otherhost/x")
    check_mlflow_uri(resolve_mlflow_uri(tmp_path / "new" / "store"))  # a new path under a writable directory
    assert not (tmp_path / "new").exists()


def test_resume_tracks_again_only_inside_the_study_directory(tmp_path):
    from types import SimpleNamespace

    from bayes_safe.tuning.cli import _tracking_uri

    args = SimpleNamespace(mlflow=None, out=tmp_path)
    own = (tmp_path / "mlruns").resolve().as_uri()
    assert _tracking_uri(args, {"mlflow": own}) == (own, None)
    assert _tracking_uri(args, {}) == (None, None)
    # a store elsewhere (a server, another directory) is never used unless named again
    for elsewhere in ("http://203.0.113.5:5000", (tmp_path.parent / "x").resolve().as_uri()):
        uri, note = _tracking_uri(args, {"mlflow": elsewhere})
        assert uri is None and f"--mlflow {elsewhere}" in note
    args.mlflow = "http://127.0.0.1:5000"
    assert _tracking_uri(args, {"mlflow": own}) == ("http://127.0.0.1:5000", None)

