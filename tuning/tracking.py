"""Experiment tracking of tuning studies: every finished trial logged as it finishes.

The study's own database (``study.sqlite``, Ax's store) is the record the study resumes from;
a tracker is a copy of every finished trial in a tool people already browse (MLflow). The
layers: models and policies know nothing of tuning, ``Study`` knows only the small
``Tracker`` protocol below, and ``MlflowTracker`` is the one implementation, which imports
``mlflow`` when it is built (the ``[mlflow]`` extra, ``mlflow-skinny``; a missing package is a
one-line error naming the extra).

What a trial's record holds (``TrialRecord``): its parameters, every metric's mean and
standard error, whether its observed means meet the outcome constraints (``feasible``), its
seed, generation node and timings (simulation, candidate generation, start to completion).
``Study`` builds the record from what the database holds, so a trial logged live and a trial
logged later (after a crash, or by ``Study.track``) are logged identically.

Crash safety and idempotence: a trial is logged right after Ax has saved it as completed (or
failed). A run that starts (``Study.run``) first logs every finished trial the tracker does
not have yet, so a crash between the database's save and the tracker's loses nothing; the
tracker knows each trial by the study's ``uid`` and the trial index (run tags), so a resumed
study never logs a trial twice. In MLflow a trial is one run: created, then its parameters,
metrics and tags in one ``log_batch``, then terminated (``FINISHED``, or ``FAILED`` for a
failed trial). A run left unterminated by a crash in between is deleted and logged again.

Where it goes (``resolve_mlflow_uri``): a directory or ``file:`` URI is an MLflow file store
(the command line's default is ``OUT/mlruns``); ``http(s)://host:port`` is a tracking server
(``mlflow server``; credentials come from ``MLFLOW_TRACKING_USERNAME`` / ``..._PASSWORD``,
never from the URI, since the URI is stored with the study); ``sqlite:///``,
``postgresql://``, ``mysql://`` and ``mssql://`` are MLflow's SQL stores (they need the full
``mlflow`` package). A server SQL store is contacted before any work (``check_mlflow_uri``: one
line naming the option and ``host:port``); a plain ``postgresql://`` store is opened with psycopg
3 (``postgresql+psycopg://``, as the study's own ``--storage``; the stored URI stays as given),
and it can be the very database that holds the study (MLflow's tables and Ax's do not collide).
MLflow 3 keeps its file store in "maintenance mode" and refuses it unless
``MLFLOW_ALLOW_FILE_STORE`` is true: the tracker sets that variable around its own calls
only, for a file store.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Self, runtime_checkable

__all__ = ["MlflowTracker", "Tracker", "TrialRecord", "check_mlflow_uri", "resolve_mlflow_uri"]

#: run tags that identify a trial (the idempotence key is study uid + trial index)
TAG_STUDY = "bayes_safe.study"
TAG_UID = "bayes_safe.study_uid"
TAG_TRIAL = "bayes_safe.trial"
#: MLflow's SQL stores (SQLAlchemy URLs) the tracker accepts besides files and servers
SQL_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
#: log_batch limits of the MLflow REST API
_MAX_METRICS, _MAX_PARAMS, _MAX_TAGS = 1000, 100, 100
#: seconds to wait for a tracking server to answer the check made before the study starts
CHECK_TIMEOUT = 10.0
#: a tracking server's retries during a study (at most about 30 s per call); environment
#: variables the user set win
HTTP_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


@dataclass(frozen=True)
class TrialRecord:
    """One finished trial, as a tracker logs it.

    Attributes:
        study: the study's name; ``study_uid`` its unique id (stored with the study).
        trial: the trial's index; ``status`` ``"COMPLETED"`` or ``"FAILED"``.
        parameters: the parameterization.
        metrics: ``{metric: (mean, sem)}`` (empty for a failed trial).
        feasible: whether the observed means meet every outcome constraint (``None``: the study
            has none, or the trial failed).
        seed, node, replicates, rerun_of: the trial's seed, its generation node (``Sobol``,
            ``BoTorch``, ``rerun``), A/B tests per trial, the abandoned trial it re-runs.
        timings: seconds: ``sim_seconds`` (the A/B tests), ``gen_seconds`` (Ax's candidate),
            ``wall_seconds`` (start to completion), when known.
        started, finished: Unix times in seconds, when known.
        error: why a failed trial failed.
    """

    study: str
    study_uid: str
    trial: int
    status: str
    parameters: Mapping[str, object]
    metrics: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    feasible: bool | None = None
    seed: int | None = None
    node: str | None = None
    replicates: int | None = None
    rerun_of: int | None = None
    timings: Mapping[str, float] = field(default_factory=dict)
    started: float | None = None
    finished: float | None = None
    error: str | None = None


@runtime_checkable
class Tracker(Protocol):
    """What ``Study`` needs from an experiment tracker.

    ``open`` is called once before the first trial is logged (with the study's name, uid and
    a description), ``log_trial`` for every finished trial (it returns ``False`` when the
    trial was already logged: it must be idempotent by ``(study_uid, trial)``), ``close`` when
    the owner is done with it (``Study`` never closes a tracker it was given).
    """

    def open(self, study: str, study_uid: str, description: Mapping[str, str]) -> None: ...

    def log_trial(self, record: TrialRecord) -> bool: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------------- URIs
def _kind(uri: str) -> str:
    scheme = urllib.parse.urlsplit(uri).scheme.lower()
    if scheme in ("http", "https"):
        return "server"
    if scheme.split("+")[0] in SQL_SCHEMES:
        return "sql"
    return "file"


def resolve_mlflow_uri(value: str | os.PathLike | None, default_dir: str | os.PathLike | None = None,
                       option: str = "mlflow") -> str:
    """The tracking URI for ``value``; ``ValueError`` naming ``option`` when it is not one.

    ``None`` (or ``""`` from ``--mlflow`` with no value) means a file store in ``default_dir``;
    a path or ``file:`` URI is a file store (made absolute); ``http(s)://host[:port][/path]``
    is a tracking server; ``sqlite:///...``, ``postgresql://...``, ``mysql://...``,
    ``mssql://...`` are MLflow's SQL stores. Nothing is created or contacted here.
    """
    lead = f"{option}: "
    expected = ("expected a directory, a file: URI, http(s)://host:port of an MLflow tracking server, "
                "or sqlite:///PATH")
    if value is None or (isinstance(value, str) and not value.strip()):
        if default_dir is None:
            raise ValueError(f"{lead}{expected}, got no value")
        return Path(default_dir).expanduser().resolve().as_uri()
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(f"{lead}{expected}, got {type(value).__name__}")
    text = value.strip()
    parts = urllib.parse.urlsplit(text)
    scheme = parts.scheme.lower()
    if len(scheme) == 1:  # a Windows drive letter, C:\...
        scheme = ""
    if scheme in ("http", "https"):
        if not parts.hostname:
            raise ValueError(f"{lead}{expected}; {text!r} names no host")
        if parts.username or parts.password:
            raise ValueError(f"{lead}credentials in the URI are not accepted (the URI is stored with the study): "
                             "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD instead, "
                             f"got {_hide_password(text)!r}")
        try:
            parts.port  # noqa: B018 - validates the port
        except ValueError:
            raise ValueError(f"{lead}{expected}; {text!r} has an invalid port") from None
        if parts.query or parts.fragment:
            raise ValueError(f"{lead}{expected}; {text!r} has a query or fragment")
        return text.rstrip("/")
    if scheme.split("+")[0] in SQL_SCHEMES:
        if scheme.startswith("sqlite") and not parts.path.strip("/"):
            raise ValueError(f"{lead}{expected}; {text!r} names no database file (sqlite:////abs/path/mlflow.db)")
        if parts.password:
            raise ValueError(f"{lead}a password in the URI is not accepted (the URI is stored with the study): "
                             f"use the database's own credential file, got {_hide_password(text)!r}")
        return text
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{lead}{expected}; a file: URI must name a local path, got {text!r}")
        path = Path(urllib.parse.unquote(parts.path))
    elif scheme:
        raise ValueError(f"{lead}{expected}; unsupported scheme {scheme!r} in {text!r}")
    else:
        path = Path(text)
    return path.expanduser().resolve().as_uri()


def _hide_password(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    user = f"{parts.username}:***@" if parts.username else ":***@"
    netloc = user + host + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _file_store_path(uri: str) -> Path:
    return Path(urllib.parse.unquote(urllib.parse.urlsplit(uri).path))


def is_mlflow_file_store(path: Path) -> bool:
    """An MLflow file store: experiment folders with ``meta.yaml`` (``0`` is the default), ``.trash``."""
    for child in path.iterdir():
        if child.name in (".trash", "models") or (child.is_dir() and (child / "meta.yaml").is_file()):
            return True
    return False


def check_mlflow_uri(uri: str, option: str = "mlflow", timeout: float = CHECK_TIMEOUT) -> None:
    """Check, before any work, that a resolved tracking URI can be written (``ValueError`` naming
    ``option`` and the expected form otherwise): a file store's directory is new, empty or an
    MLflow file store; a tracking server answers MLflow's REST API within ``timeout`` seconds; a
    server SQL store (``postgresql://``) accepts a connection."""
    lead = f"{option}: "
    kind = _kind(uri)
    if kind == "sql":
        from .storage import check_server

        check_server(uri, what=option)  # SQLite: nothing; a server: one connection (host:port named)
        return
    if kind == "file":
        path = _file_store_path(uri)
        if os.path.lexists(path) and not path.is_dir():
            raise ValueError(f"{lead}{path} exists and is not a directory; expected a directory for an MLflow file store")
        if path.is_dir() and any(path.iterdir()) and not is_mlflow_file_store(path):
            raise ValueError(f"{lead}{path} is a directory that is neither empty nor an MLflow file store; "
                             "expected a new or empty directory, or an existing MLflow file store")
        base = path
        while not base.exists():
            base = base.parent
        if not base.is_dir():
            raise ValueError(f"{lead}{base} is a file, so {path} cannot be created; expected a path under a directory")
        if not os.access(base, os.W_OK | os.X_OK):
            raise ValueError(f"{lead}cannot write in {base} (permission denied); expected a writable directory")
        return
    if kind == "server":
        # one plain request, no retries: MLflow's client retries an unreachable server for minutes
        query = urllib.parse.urlencode({"experiment_name": "bayes_safe connectivity check"})
        url = f"{uri}/api/2.0/mlflow/experiments/get-by-name?{query}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:  # http(s) only: checked above
                body = response.read()
        except urllib.error.HTTPError as exc:
            body = exc.read()
            if exc.code == 404 and b"RESOURCE_DOES_NOT_EXIST" in body:
                return  # the server answered: no such experiment
            raise ValueError(f"{lead}{uri} answered HTTP {exc.code} to MLflow's REST API; expected an MLflow tracking "
                             "server (mlflow server --host HOST --port PORT)") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ValueError(f"{lead}cannot reach an MLflow tracking server at {uri} ({reason}); expected a running "
                             "server (mlflow server --host HOST --port PORT)") from None
        try:
            json.loads(body or b"{}")
        except ValueError:
            raise ValueError(f"{lead}{uri} did not answer as an MLflow tracking server (not JSON); expected "
                             "http(s)://host:port of `mlflow server`") from None


# ---------------------------------------------------------------------- MLflow
def _client_uri(uri: str) -> str:
    """The URI MLflow opens: a plain ``postgresql://`` store through psycopg 3 (see the module docstring)."""
    if _kind(uri) == "sql":
        from .storage import engine_url

        return engine_url(uri)
    return uri


@contextlib.contextmanager
def _quiet_sql_store():
    """MLflow announces at INFO, on stderr, that it creates (migrates) an SQL store's tables: the
    study's output keeps to its own lines."""
    import logging

    loggers = [logging.getLogger(n) for n in ("mlflow.store.db.utils", "alembic.runtime.migration")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(1000 * seconds)


def _finite(x) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


class MlflowTracker:
    """Log a study's trials to MLflow: one run per trial, in one experiment per study.

    Args:
        uri: where: a directory or ``file:`` URI (file store), ``http(s)://host:port`` (tracking
            server) or an SQL store (``sqlite:///path``); see ``resolve_mlflow_uri``.
        experiment: the MLflow experiment (default: the study's name). Several studies can share
            one: their runs carry the study's uid (``bayes_safe.study_uid``) and name.
        check: contact the store now (``check_mlflow_uri``), so a bad URI fails before any work.

    Each run is named ``trial N`` and holds: parameters (the parameterization, ``seed``,
    ``replicates``), metrics (each metric's mean under its name and its standard error under
    ``NAME_sem``; ``feasible`` 1/0; ``sim_seconds``, ``gen_seconds``, ``wall_seconds``) and
    tags (``bayes_safe.study``, ``bayes_safe.study_uid``, ``bayes_safe.trial``,
    ``bayes_safe.node``, ``bayes_safe.status``, ``bayes_safe.rerun_of``, ``bayes_safe.error``).
    The run's start and end times are the trial's.

    Raises:
        MissingExtraError: ``mlflow`` is not installed (one line: ``pip install 'bayes-safe[mlflow]'``).
        ValueError: ``uri`` is not a tracking URI, or its store cannot be reached.

    Example:
        >>> with MlflowTracker("runs/mlruns") as tracker:                 # doctest: +SKIP
        ...     Study(ab_test, storage="runs/s.sqlite", tracker=tracker).run(trials=20)
    """

    def __init__(self, uri: str | os.PathLike, experiment: str | None = None, *, check: bool = True):
        from bayes_safe._extras import require

        self.uri = resolve_mlflow_uri(uri)
        if experiment is not None and (not isinstance(experiment, str) or not experiment.strip()):
            raise ValueError(f"experiment: expected a non-empty name, got {experiment!r}")
        self.experiment_name = experiment
        self.kind = _kind(self.uri)
        require("mlflow", "MLflow tracking (MlflowTracker, --mlflow)")
        if check:
            check_mlflow_uri(self.uri)
        self._client = None
        self.experiment_id: str | None = None
        self._study_uid: str | None = None
        self._runs: dict[int, tuple[str, str]] = {}  # trial -> (run id, status) of this study's runs

    def __repr__(self) -> str:
        return f"MlflowTracker({self.uri!r}, experiment={self.experiment_name!r})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextlib.contextmanager
    def _calls(self):
        """For our calls only: MLflow 3 refuses its file store unless ``MLFLOW_ALLOW_FILE_STORE``;
        a server is retried briefly (``HTTP_RETRIES``; MLflow's own default retries for minutes,
        which would stall the study loop), unless the user set those variables."""
        settings = {"MLFLOW_ALLOW_FILE_STORE": "true"} if self.kind == "file" else {}
        if self.kind == "server":
            settings = {k: v for k, v in HTTP_RETRIES.items() if k not in os.environ}
        previous = {k: os.environ.get(k) for k in settings}
        os.environ.update(settings)
        try:
            with _quiet_sql_store() if self.kind == "sql" else contextlib.nullcontext():
                yield
        finally:
            for key, value in previous.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    @property
    def client(self):
        """The ``mlflow.MlflowClient`` of ``uri``."""
        if self._client is None:
            from mlflow import MlflowClient

            with self._calls():
                self._client = MlflowClient(tracking_uri=_client_uri(self.uri))
        return self._client

    def open(self, study: str, study_uid: str, description: Mapping[str, str] | None = None) -> None:
        """Find or create the experiment and read which trials of ``study_uid`` it already holds."""
        from mlflow.entities import ViewType

        name = self.experiment_name or study
        with self._calls():
            exp = self.client.get_experiment_by_name(name)
            if exp is not None and exp.lifecycle_stage != "active":
                raise ValueError(f"experiment: the MLflow experiment {name!r} at {self.uri} is deleted; restore it "
                                 "(mlflow experiments restore) or choose another name")
            self.experiment_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
            for key, value in (description or {}).items():
                self.client.set_experiment_tag(self.experiment_id, f"bayes_safe.{key}", str(value)[:5000])
            runs: dict[int, tuple[str, str]] = {}
            token = None
            while True:
                page = self.client.search_runs([self.experiment_id], filter_string=f"tags.`{TAG_UID}` = '{study_uid}'",
                                               run_view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
                for run in page:
                    trial = int(run.data.tags[TAG_TRIAL])
                    status = run.info.status
                    # a terminated run wins over an unterminated one left by a crash
                    if trial not in runs or runs[trial][1] in ("RUNNING", "SCHEDULED"):
                        runs[trial] = (run.info.run_id, status)
                token = page.token
                if not token:
                    break
        self._study_uid = study_uid
        self._runs = runs

    def logged_trials(self) -> set[int]:
        """The trials of the open study already logged (terminated runs)."""
        return {t for t, (_, status) in self._runs.items() if status not in ("RUNNING", "SCHEDULED")}

    def log_trial(self, record: TrialRecord) -> bool:
        """Log one finished trial as a run; ``False`` (nothing written) when it is already logged."""
        from mlflow.entities import Metric, Param, RunTag

        if self.experiment_id is None or record.study_uid != self._study_uid:
            self.open(record.study, record.study_uid)
        existing = self._runs.get(record.trial)
        if existing is not None and existing[1] not in ("RUNNING", "SCHEDULED"):
            return False
        stamp = _ms(record.finished if record.finished is not None else time.time())
        params = {str(k): str(v) for k, v in record.parameters.items()}
        for key in ("seed", "replicates"):
            value = getattr(record, key)
            if value is not None:
                params.setdefault(key, str(value))
        metrics: dict[str, float] = {}
        for name, (mean, sem) in record.metrics.items():
            if _finite(mean):
                metrics[name] = float(mean)
            if _finite(sem):
                metrics[f"{name}_sem"] = float(sem)
        if record.feasible is not None:
            metrics["feasible"] = 1.0 if record.feasible else 0.0
        for key, value in record.timings.items():
            if _finite(value):
                metrics[key] = float(value)
        tags = {TAG_STUDY: record.study, TAG_UID: record.study_uid, TAG_TRIAL: str(record.trial),
                "bayes_safe.status": record.status}
        if record.node:
            tags["bayes_safe.node"] = str(record.node)
        if record.rerun_of is not None:
            tags["bayes_safe.rerun_of"] = str(record.rerun_of)
        if record.error:
            tags["bayes_safe.error"] = record.error[:5000]
        with self._calls():
            if existing is not None:  # unterminated: a crash between creating the run and finishing it
                self.client.delete_run(existing[0])
            run = self.client.create_run(self.experiment_id, start_time=_ms(record.started) or stamp,
                                         tags={TAG_UID: record.study_uid, TAG_TRIAL: str(record.trial)},
                                         run_name=f"trial {record.trial}")
            run_id = run.info.run_id
            self._runs[record.trial] = (run_id, "RUNNING")
            m = [Metric(k, v, stamp, 0) for k, v in metrics.items()]
            p = [Param(k, v) for k, v in params.items()]
            t = [RunTag(k, v) for k, v in tags.items()]
            first = True
            while first or m or p or t:
                first = False
                self.client.log_batch(run_id, metrics=m[:_MAX_METRICS], params=p[:_MAX_PARAMS], tags=t[:_MAX_TAGS])
                m, p, t = m[_MAX_METRICS:], p[_MAX_PARAMS:], t[_MAX_TAGS:]
            status = "FAILED" if record.status == "FAILED" else "FINISHED"
            self.client.set_terminated(run_id, status=status, end_time=stamp)
        self._runs[record.trial] = (run_id, status)
        return True

    def close(self) -> None:
        """Nothing is buffered (every call is synchronous); drops the client."""
        self._client = None
