"""Issue 29: tuning studies on a real PostgreSQL server (the ``postgres_server`` fixture, tests/postgres.py).

The command-line items run through real ``bayes-safe`` processes: a study on ``--storage
postgresql://...`` tracked to MLflow in the same database, refused to a second process while it
runs (advisory lock), SIGKILLed mid-run (the lock is free again), resumed without losing or
doubling a finished trial; and a server that does not answer is one line naming the option and
``host:port`` before any work. The Python API (``Study(storage=url)``, ``Study.load``, the lock)
runs in this process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from _tune_process import ROOT, check_reruns, one_error_line, start_tune, wait_for_trials

from bayes_safe.tuning import ABTest, Study, VideoUploadProblem
from bayes_safe.tuning.storage import display_url, engine_url, study_lock

#: the smallest study the other tuning tests run (300 users per arm, no vanilla TS), without the outcome
#: constraint (no power pilot) nor the report's re-run of the best point
TINY_CLI = ["--users", "300", "--batches", "2", "--warmup", "300", "--model-epochs", "1", "--replicates", "2",
            "--no-compare", "--no-rerun", "--constraint", "none"]
NAME = "video-upload"


def bayes_safe(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bayes_safe.cli", *map(str, args)], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tables(url: str) -> set[str]:
    import sqlalchemy

    engine = sqlalchemy.create_engine(engine_url(url))
    try:
        with engine.connect() as conn:
            return set(sqlalchemy.inspect(conn).get_table_names())
    finally:
        engine.dispose()


def _snapshot(url: str) -> dict[str, list]:
    """Every row of Ax's trial, data and metric tables (a re-save changes ids and timestamps)."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(engine_url(url))
    try:
        with engine.connect() as conn:
            return {t: [tuple(r) for r in conn.execute(sqlalchemy.text(f"SELECT * FROM {t} ORDER BY id"))]
                    for t in ("trial_v2", "data_v2", "metric_v2", "experiment_v2")}
    finally:
        engine.dispose()


def _stored(url: str, name: str = NAME) -> tuple[dict, dict, Study]:
    study = Study.load(url, name=name)
    return {i: t.status.name for i, t in study.experiment.trials.items()}, study.observed(), study


def _lock_is_free(url: str, name: str, wait: float = 10.0) -> bool:
    """Take and release the study's lock, retrying while the server has not yet noticed a dead holder."""
    deadline = time.monotonic() + wait
    while True:
        try:
            with study_lock(url, name):
                return True
        except ValueError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)


def test_urls_are_opened_with_psycopg_and_shown_without_password():
    assert engine_url("postgresql://bayes:s3cret@db.example:5433/studies") == "postgresql+psycopg://bayes:s3cret@db.example:5433/studies"
    assert engine_url("postgresql+psycopg2://u@h/d") == "postgresql+psycopg2://u@h/d"  # a named driver is kept
    assert engine_url("sqlite:////tmp/s.sqlite") == "sqlite:////tmp/s.sqlite"
    assert "s3cret" not in display_url("postgresql://bayes:s3cret@db.example:5433/studies")


@pytest.mark.slow  # 30 s: a real study killed and resumed (the Python API test covers the lock in the default run)
def test_cli_study_on_postgresql_is_locked_survives_sigkill_and_resumes_with_mlflow_in_the_same_database(
        postgres_server, tmp_path):
    url = postgres_server.url()
    out = tmp_path / "study"
    # a large target (all Sobol: about a second per trial) so the study is still running when the second process comes
    proc, lines = start_tune(["video-upload", *TINY_CLI, "--sobol", "200", "--trials", "200", "--parallel", "2",
                              "--storage", url, "--mlflow", url, "--out", str(out)])
    try:
        wait_for_trials(proc, lines, 2)
        # a second process on the same study while the first runs: refused before it writes anything
        second = bayes_safe("tune", "resume", "--storage", url, "--out", tmp_path / "second", "--no-progress")
        assert proc.poll() is None, "the first study ended before the second process tried: the test proves nothing"
        one_error_line(second, f"another process is running study '{NAME}'",
                       f"bayes_safe pid {proc.pid}")
        with pytest.raises(ValueError, match="another process is running"), study_lock(url, NAME):
            pass
        time.sleep(0.3)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the study process and its workers
        proc.wait(timeout=30)
    proc.reader.join(timeout=5)
    assert _lock_is_free(url, NAME), "the advisory lock outlived the killed study"

    reported = {int(line.split("] trial ")[1].split()[0]) for line in lines if "] trial " in line}
    status, observed, _ = _stored(url)
    completed = {i for i, s in status.items() if s == "COMPLETED"}
    interrupted = {i for i, s in status.items() if s == "RUNNING"}
    # (before Study.load stopped re-saving what it read, the refused second process had written its
    # snapshot over the running study here: a trial reported completed was RUNNING again)
    assert reported <= completed, "a trial reported completed was not in the database"
    assert interrupted, f"expected a trial running at the kill, got {status}"
    target = len(completed) + len(interrupted)  # room for one re-run of each interrupted trial (they go first)

    resumed = bayes_safe("tune", "resume", "--storage", url, "--out", out, "--trials", target, "--mlflow", url,
                         "--no-rerun", "--no-progress")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming study '{NAME}' ({url})" in resumed.stdout
    assert "Traceback" not in resumed.stderr

    status2, observed2, study = _stored(url)
    # nothing finished before the kill was lost or changed
    assert all(status2[i] == "COMPLETED" and observed2[i] == observed[i] for i in completed)
    # the interrupted trials are abandoned (never modelled) and run again exactly once
    check_reruns(study, interrupted, status2, observed2)
    assert sum(s == "COMPLETED" for s in status2.values()) == target and "RUNNING" not in status2.values()
    df = study.experiment.lookup_data().df
    per_trial = df[df.metric_name == "q_1080p_change"].groupby("trial_index").size()
    assert set(per_trial.index) == set(observed2) and (per_trial == 1).all()
    assert (out / "report.md").is_file()

    # MLflow, read back through the same URI: every completed trial exactly once, none twice after the crash
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=url)
    experiment = client.get_experiment_by_name(NAME)
    runs = [r for r in client.search_runs([experiment.experiment_id], max_results=1000)
            if r.data.tags.get("bayes_safe.study_uid") == study.uid]
    trials = [int(r.data.tags["bayes_safe.trial"]) for r in runs]
    assert sorted(trials) == sorted(set(trials)), "a trial was logged twice"
    assert set(trials) == set(observed2)
    for run in runs:
        i = int(run.data.tags["bayes_safe.trial"])
        assert run.info.status == "FINISHED"
        assert run.data.metrics["q_1080p_change"] == pytest.approx(observed2[i]["q_1080p_change"][0])
    assert {"experiment_v2", "trial_v2", "experiments", "runs"} <= _tables(url)  # Ax's and MLflow's tables side by side


def test_python_api_creates_loads_resumes_and_locks_a_study_on_postgresql(postgres_server):
    url = postgres_server.url()
    with pytest.raises(ValueError, match="holds no study"):
        Study.load(url)
    assert _tables(url) == set(), "looking for a study created tables"

    ab = ABTest(VideoUploadProblem(warmup=300, model={"nn_epochs": 1, "nn_min_steps": 20}), n_users=300, batches=2,
                compare=(), replicates=2)
    study = Study(ab, name="api", storage=url, sobol_trials=3, seed=0)
    study.run(trials=2, inline=True)
    with pytest.raises(ValueError, match="already exists"):
        Study(ab, name="api", storage=url, sobol_trials=3, seed=0)

    before = _snapshot(url)
    loaded = Study.load(url)  # the only study in the database
    assert _snapshot(url) == before, "loading a study wrote to its database"
    assert loaded.name == "api" and loaded.uid == study.uid
    assert loaded.counts() == {"COMPLETED": 2} and loaded.observed() == study.observed()
    loaded.run(trials=3, inline=True)
    again = Study.load(url, name="api")
    assert again.counts() == {"COMPLETED": 3} and again.properties["sessions"][-1]["trials_completed"] == 1
    assert all(again.observed()[i] == study.observed()[i] for i in (0, 1))

    # one study runs in one process; another study in the same database is not held up
    with study_lock(url, "api"):
        with (pytest.raises(ValueError, match=rf"another process is running study 'api'.*bayes_safe pid {os.getpid()}"),
              study_lock(url, "api")):
            pass
        with pytest.raises(ValueError, match="another process is running"):
            loaded.run(trials=4, inline=True)
        with study_lock(url, "other"):
            pass
    assert Study.load(url).counts() == {"COMPLETED": 3}  # the refused run wrote nothing
    assert _lock_is_free(url, "api", wait=0)


@pytest.mark.slow  # moved to the slow job to keep the default run under 15 minutes (2026-11-28)
def test_a_database_that_does_not_answer_is_one_line_naming_the_option_and_host_port(postgres_server, tmp_path):
    closed = _free_port()
    dead = f"postgresql://bayes:s3cret@127.0.0.1:{closed}/studies"
    missing = postgres_server.url().rsplit("/", 1)[0] + "/no_such_db"
    runs = {
        "new": (["tune", "video-upload", *TINY_CLI, "--trials", "2", "--storage", dead, "--out", tmp_path / "new"],
                ["--storage", f"127.0.0.1:{closed}", "cannot open the database", "Connection refused"]),
        "resume": (["tune", "resume", "--storage", dead, "--out", tmp_path / "resume"],
                   ["--storage", f"127.0.0.1:{closed}", "cannot open the database"]),
        "database": (["tune", "video-upload", *TINY_CLI, "--trials", "2", "--storage", missing, "--out", tmp_path / "database"],
                     ["--storage", f"127.0.0.1:{postgres_server.port}", 'database "no_such_db" does not exist']),
        "mlflow": (["tune", "video-upload", *TINY_CLI, "--trials", "2", "--mlflow", f"postgresql://bayes@127.0.0.1:{closed}/m",
                    "--out", tmp_path / "mlflow"],
                   ["--mlflow", f"127.0.0.1:{closed}", "cannot open the database"]),
    }
    procs = {key: subprocess.Popen([sys.executable, "-m", "bayes_safe.cli", *map(str, args)], cwd=ROOT, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for key, (args, _) in runs.items()}
    for key, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=120)
        done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
        one_error_line(done, *runs[key][1])
        assert "s3cret" not in stdout + stderr
        assert not (tmp_path / key).exists(), f"{key}: the output directory was created before the check"
