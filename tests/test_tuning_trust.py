"""Issue 14, findings 3 and 8: `tune resume` checks before it writes, and `tune logged-data`
checks its file source before the study exists.

Every input is written by the test. Each bad input is run through the real command line (a
subprocess) and asserts: exit status 2, exactly one line on stderr naming the argument, and
nothing new in `--out` or in the database (directory listings, SQLite table lists and bytes
compared before and after).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from _tune_process import one_error_line

from bayes_safe.offline import skill_routing_logs

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = "context_columns=x0,x1,x2"


def bayes_safe(*args, cwd=None, timeout=300, umask=None) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("bayes-safe")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "bayes_safe.cli"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([*cmd, *map(str, args)], check=False, cwd=cwd or ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env, umask=-1 if umask is None else umask)


def listing(path: Path) -> list[str] | None:
    """Every file and directory under ``path`` (``None`` when ``path`` does not exist)."""
    if not path.exists():
        return None
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def tables(db: Path) -> list[str]:
    uri = "file:" + str(db) + "?mode=ro"
    with sqlite3.connect(uri, uri=True) as conn:
        return sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    """A small, valid CSV of logs (the synthetic skill-routing generator, written with pandas)."""
    path = tmp_path_factory.mktemp("logs") / "logs.csv"
    skill_routing_logs(n=1_500, seed=1).to_dataframe().to_csv(path)
    return path


def foreign_sqlite(path: Path) -> Path:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, email TEXT)")
        conn.execute("INSERT INTO customers (email) VALUES ('a@example.org')")
    return path


# ---------------------------------------------------------------------- finding 8: the source first
def _bad_sources(tmp: Path, logs: Path) -> dict[str, tuple[Path, list[str], list[str]]]:
    """name -> (file, extra arguments, words the error line must contain)."""
    import pandas as pd

    df = pd.read_csv(logs, index_col=0)
    no_reward = tmp / "no_reward.csv"
    df.drop(columns=["reward"]).to_csv(no_reward)
    empty = tmp / "empty.csv"
    empty.write_bytes(b"")
    binary = tmp / "binary.csv"
    binary.write_bytes(bytes(range(256)) * 40)
    header_only = tmp / "header_only.csv"
    header_only.write_text(",".join(df.columns) + "\n")
    bad_rows = tmp / "bad_propensity.csv"
    df.assign(propensity=-1.0).to_csv(bad_rows)
    text = tmp / "notes.txt"
    text.write_text("x0,x1\n1,2\n")
    return {
        "missing column": (no_reward, ["--column", CONTEXT], ["--source", "no_reward.csv", "reward"]),
        "missing named column": (logs, ["--column", "context_columns=x0,nope"], ["--source", "nope"]),
        "empty file": (empty, ["--column", CONTEXT], ["--source", "empty"]),
        "not a CSV": (binary, ["--column", CONTEXT], ["--source", "not a CSV"]),
        "header only": (header_only, ["--column", CONTEXT], ["--source", "no rows"]),
        "invalid rows": (bad_rows, ["--column", CONTEXT], ["--source", "propensit"]),
        "not a .csv": (text, ["--column", CONTEXT], ["--source", ".csv"]),
        "unknown column argument": (logs, ["--column", CONTEXT, "--column", "actoin_column=action"],
                                    ["--column", "actoin_column"]),
        "no context columns": (logs, [], ["--column", "context_columns"]),
        "benchmark without logging probabilities": (logs, ["--column", CONTEXT, "--benchmark", "critical"],
                                                    ["--source", "logging_prob_columns"]),
        "missing file": (tmp / "nowhere.csv", ["--column", CONTEXT], ["--source", "nowhere.csv"]),
    }


BAD_SOURCES = ["missing column", "missing named column", "empty file", "not a CSV", "header only", "invalid rows",
               "not a .csv", "unknown column argument", "no context columns",
               "benchmark without logging probabilities", "missing file"]


@pytest.mark.parametrize("case", BAD_SOURCES)
def test_bad_file_source_fails_in_one_line_before_the_study(case, tmp_path, logs):
    source, extra, needles = _bad_sources(tmp_path, logs)[case]
    method = ["--method", "minimax"] if "--benchmark" in extra else ["--method", "ips"]
    out = tmp_path / "run"
    proc = bayes_safe("tune", "logged-data", "--source", source, *extra, *method, "--trials", "2", "--out", out)
    one_error_line(proc, *needles)
    assert not out.exists()  # no study.sqlite, no directory
    # an --out that already exists keeps exactly what it held
    out.mkdir()
    (out / "notes.md").write_text("mine\n")
    before = listing(out)
    proc = bayes_safe("tune", "logged-data", "--source", source, *extra, *method, "--out", out)
    one_error_line(proc, *needles)
    assert listing(out) == before


def test_unreachable_scheduler_fails_before_the_study(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "run"
    proc = bayes_safe("tune", "logged-data", "--rows", "2000", "--scheduler", f"tcp://127.0.0.1:{port}", "--out", out)
    one_error_line(proc, "--scheduler", f"127.0.0.1:{port}")
    assert not out.exists()


def test_relative_source_is_stored_resolved(tmp_path, logs, monkeypatch):
    from bayes_safe.tuning import LoggedDataProblem

    monkeypatch.chdir(logs.parent)
    problem = LoggedDataProblem(source=logs.name, options={"context_columns": ["x0", "x1"]}, method="ips")
    assert problem.source == str(logs.resolve())
    assert problem.config()["source"] == str(logs.resolve())
    monkeypatch.chdir(tmp_path)  # the stored config reads the same file from anywhere
    again = LoggedDataProblem(**{k: v for k, v in problem.config().items() if k != "name"})
    assert again.source == problem.source


def test_python_api_checks_the_file_source(tmp_path, logs):
    from bayes_safe.tuning import LoggedDataProblem

    (tmp_path / "empty.csv").write_bytes(b"")
    with pytest.raises(ValueError, match=r"^source: .*empty\.csv is empty"):
        LoggedDataProblem(source=tmp_path / "empty.csv", options={"context_columns": ["x0"]}, method="ips")
    with pytest.raises(ValueError, match=r"^source: .*no column\(s\) \['nope'\]"):
        LoggedDataProblem(source=logs, options={"context_columns": ["x0"], "reward_column": "nope"}, method="ips")
    with pytest.raises(ValueError, match=r"^options: unknown column argument\(s\) \['colour'\]"):
        LoggedDataProblem(source=logs, options={"context_columns": ["x0"], "colour": "red"}, method="ips")


# ---------------------------------------------------------------------- finding 3: resume reads first
def test_resume_refuses_a_foreign_sqlite_and_keeps_its_tables(tmp_path):
    """Security: `tune resume --storage` at an unrelated database creates no table in it."""
    db = foreign_sqlite(tmp_path / "crm.sqlite")
    before, sha = tables(db), digest(db)
    assert before == ["customers"]
    out = tmp_path / "run"
    proc = bayes_safe("tune", "resume", "--storage", db, "--out", out, "--trials", "2")
    one_error_line(proc, "--storage", "crm.sqlite", "no bayes_safe study")
    assert tables(db) == ["customers"]
    assert digest(db) == sha
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crm.sqlite"]  # no -journal, no .lock


def test_python_api_load_of_a_foreign_sqlite_creates_no_table(tmp_path):
    from bayes_safe.tuning import Study, storage

    db = foreign_sqlite(tmp_path / "crm.sqlite")
    sha = digest(db)
    assert storage.experiment_names(storage.resolve_url(db)) == []
    with pytest.raises(ValueError, match="holds no study"):
        Study.load(db)
    with pytest.raises(ValueError, match="no bayes_safe study"):
        storage.stored_studies(storage.resolve_url(db))
    assert tables(db) == ["customers"] and digest(db) == sha


@pytest.mark.parametrize("kind", ["empty file", "text file", "ax tables only"])
def test_resume_refuses_a_database_without_a_bayes_safe_study(kind, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    db = out / "study.sqlite"
    if kind == "empty file":
        db.write_bytes(b"")
    elif kind == "text file":
        db.write_text("not a database\n" * 100)
    else:
        from bayes_safe.tuning import storage

        storage.connect(storage.resolve_url(db))  # Ax's tables, no experiment
    before, sha = listing(out), digest(db)
    proc = bayes_safe("tune", "resume", "--out", out)
    one_error_line(proc, "--out", "study.sqlite")
    assert listing(out) == before and digest(db) == sha


@pytest.mark.parametrize("where", ["--out", "--storage"])
def test_resume_of_a_missing_database_is_an_error_not_a_new_study(where, tmp_path):
    out = tmp_path / "run"
    args = ["--out", out] if where == "--out" else ["--storage", tmp_path / "missing.sqlite", "--out", out]
    proc = bayes_safe("tune", "resume", *args)
    one_error_line(proc, where, "no study database")
    assert listing(tmp_path) == []


def _stored_study(out: Path, source: Path):
    """A logged-data study (no trial run yet) in ``out/study.sqlite`` reading ``source``."""
    from bayes_safe.tuning import ABTest, LoggedDataProblem, Study

    problem = LoggedDataProblem(source=source, options={"context_columns": ["x0", "x1", "x2"]}, method="ips",
                                epochs=1, n_boot=10)
    out.mkdir(parents=True, exist_ok=True)
    Study(ABTest(problem), storage=out / "study.sqlite", sobol_trials=1, seed=0)
    return out / "study.sqlite"


def _point_source_at(db: Path, path: Path) -> None:
    """Edit the stored configuration the way a sender of a study could."""
    with sqlite3.connect(db) as conn:
        (raw,) = conn.execute("SELECT properties FROM experiment_v2").fetchone()
        props = json.loads(raw)
        props["bayes_safe_tuning"]["ab_test"]["problem"]["source"] = str(path)
        conn.execute("UPDATE experiment_v2 SET properties = ?", (json.dumps(props),))


def _dump(db: Path) -> list[str]:
    with sqlite3.connect("file:" + str(db) + "?mode=ro", uri=True) as conn:
        return list(conn.iterdump())


def test_resume_asks_before_reading_a_stored_source_outside_the_study(tmp_path, logs):
    out = tmp_path / "received"
    inside = out / "logs.csv"
    out.mkdir()
    inside.write_bytes(logs.read_bytes())
    db = _stored_study(out, inside)
    secret = tmp_path / "elsewhere" / "secret.csv"  # "any CSV on the machine"
    secret.parent.mkdir()
    secret.write_bytes(logs.read_bytes())
    _point_source_at(db, secret)
    before, dump = listing(out), _dump(db)

    proc = bayes_safe("tune", "resume", "--out", out, "--trials", "1")
    line = one_error_line(proc, "--trust-source", str(secret), "outside the study's directory")
    assert f"--source {secret}" in line
    assert listing(out) == before and _dump(db) == dump

    other = tmp_path / "other.csv"
    other.write_bytes(logs.read_bytes())
    proc = bayes_safe("tune", "resume", "--out", out, "--source", other, "--trials", "1")
    one_error_line(proc, "--source", str(secret), str(other))
    assert listing(out) == before and _dump(db) == dump


@pytest.mark.slow  # moved to the slow job to keep the default run under 15 minutes (2026-11-28)
def test_resume_reads_a_source_inside_the_study_directory(tmp_path, logs):
    """The rule's other side: logs inside the study's directory resume without a flag, from any
    cwd; the outputs follow the umask (none is forced to 0644)."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "logs.csv").write_bytes(logs.read_bytes())
    _stored_study(out, out / "logs.csv")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    proc = bayes_safe("tune", "resume", "--out", out, "--trials", "1", "--no-progress", cwd=elsewhere, umask=0o027)
    assert proc.returncode == 0, proc.stderr
    assert f"logs: {out / 'logs.csv'} (inside the study's directory)" in proc.stdout
    for name in ("report.md", "trials.csv", "best.json", "study.json"):
        assert (out / name).stat().st_mode & 0o777 == 0o640, name


def test_trust_rule():
    from bayes_safe.tuning.cli import check_resume_trust

    def props(source, benchmark=None, **options):
        return {"ab_test": {"problem": {"name": "logged-data", "source": source, "benchmark": benchmark,
                                        "options": options}}}

    url = "sqlite:////data/study/study.sqlite"
    assert check_resume_trust(props("/data/study/logs.csv"), url) == [
        "logs: /data/study/logs.csv (inside the study's directory)"]
    assert check_resume_trust(props("synthetic", seed=0), url) == []
    with pytest.raises(ValueError, match=r"^--trust-source: .* logs from /home/u/x\.csv"):
        check_resume_trust(props("/home/u/x.csv"), url)
    with pytest.raises(ValueError, match=r"^--trust-source: .* logs from /data/x\.csv"):  # ../ resolved
        check_resume_trust(props("/data/study/../x.csv"), url)
    assert "confirmed by --trust-source" in check_resume_trust(props("/home/u/x.csv"), url, trust=True)[0]
    assert "confirmed by --source" in check_resume_trust(props("/home/u/x.csv"), url, source="/home/u/x.csv")[0]
    with pytest.raises(ValueError, match=r"^--source: the study reads its logs from /home/u/x\.csv, not /home/u/y\.csv"):
        check_resume_trust(props("/home/u/x.csv"), url, source="/home/u/y.csv")
    with pytest.raises(ValueError, match=r"^--source: this study does not read a logs file"):
        check_resume_trust(props("synthetic"), url, source="/home/u/x.csv")
    # a benchmark JSON and an Open Bandit directory follow the same rule; --source does not confirm them
    with pytest.raises(ValueError, match=r"^--trust-source: .* constraint benchmark from /etc/b\.json"):
        check_resume_trust(props("/data/study/logs.csv", benchmark="/etc/b.json"), url, source="/data/study/logs.csv")
    with pytest.raises(ValueError, match=r"^--trust-source: .* Open Bandit directory from /srv/obd"):
        check_resume_trust(props("open-bandit", directory="/srv/obd"), url)
    # a server database has no directory: every stored path is confirmed
    with pytest.raises(ValueError, match="named by a server database"):
        check_resume_trust(props("/data/study/logs.csv"), "postgresql://u@h/db")


def test_storage_and_study_agree_on_the_property_key():
    from bayes_safe.tuning import storage, study

    assert storage.PROPERTY_KEY == study.PROPERTY_KEY
