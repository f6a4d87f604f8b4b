"""The HTTP service: a saved ``Decider`` behind FastAPI, snapshotted, crash-safe through its log.

    bayes-safe serve STATE_DIR [--host 127.0.0.1] [--port 8080] [--log PATH] [--snapshot-every SECONDS]
                     [--token-file PATH] [--allowed-host NAME ...] [--allowed-origin ORIGIN ...]
                     [--max-body-bytes N] [--max-candidates N] [--max-feedback-items N]

``STATE_DIR`` is a directory written by ``Decider.save``. Endpoints (JSON in, JSON out):

* ``POST /decide``: ``{"features": [[...], ...]}`` (candidate features ``[K][d]``, or a list of
  ``{name: value}`` dicts, one per candidate) or ``{"context": {name: value}}`` (one context, for
  per-arm policies), with optional ``"baseline"`` (an action index) and ``"valid"`` (``K``
  booleans) -> the ``Decision`` (``decision_id``, ``action``, ``propensity``, ``propensity_se``,
  ``model_version``, ``probabilities``);
* ``POST /feedback``: ``{"decision_id": ..., "reward": ..., "constraints": [...]}`` ->
  ``{"accepted": true}``, or ``false`` for a duplicate (ignored); an unknown id is a 404. Outcomes
  may arrive metric by metric (TS-ASC; issue 45): ``{"decision_id": ..., "reward": 1.0}`` now and
  ``{"decision_id": ..., "constraints": {"refund": 1.0}}`` (or a list with ``null`` for the metrics
  not known) later, each learned once when it arrives (``Decider.feedback``). Or a
  list of such objects, applied all or nothing (``Decider.feedback_many``: one log transaction,
  committed before the reply) -> ``{"accepted": [...], "applied": n, "duplicates": m}``; a list
  with any bad item is a 422 whose ``errors`` name every bad item (``index``, ``decision_id``,
  ``detail``), unknown ids among them, and nothing is applied. ``bayes-safe feedback`` applies a
  table of outcomes the same way (``bayes_safe.online.bulk``);
* ``GET /health``: 200 ``{"status": "ok", ...}``, or 503 ``{"status": "degraded", "problems":
  [...]}`` when the last write to the decision log failed, the last snapshot failed, or changes
  have waited more than ``STALE_INTERVALS`` snapshot intervals; open to all, but the counts only
  for a caller with a token when the service has tokens (and ``drift_alarms``, per metric, when a
  model detects changes: adaptive forgetting, issue 43);
* ``GET /posterior``: ``model_version``, ``decisions``, ``pending``, ``queued`` and, per model
  role, the posterior ``mean`` and ``sd`` of models that have them (and ``change_points`` and
  ``observations_since_change`` of a model that detects changes);
* ``GET /metrics``: the Prometheus text format (prometheus-client, a registry per app):
  counters and gauges of the Decider and live guardrail estimates from the log
  (``bayes_safe.online.metrics``).

Bad input is a 422 whose ``detail`` names the field (``reward: expected a finite number ...``),
JSON nested deeper than ``MAX_DEPTH`` and integers no float holds included; a decision or
feedback whose log write fails (a full disk) is a 503 saying so, with nothing recorded; an
unexpected failure is a 500 whose ``detail`` says what failed (never a bare 500).

**Who may ask** (``Gate``, ``bayes_safe.online.auth``; docs/security.md): before any work, every
request passes the ``Host`` check (421), the ``Origin`` check (403), the bearer token's role
(``decide``, ``feedback``, ``read``; 401 / 403) when the service has tokens, a JSON content type
for a POST (415) and the body limit (413; a declared ``Content-Length`` over it refused before a
byte is read, a chunked body cut off as it passes it). ``/decide`` takes at most
``--max-candidates`` candidates and a ``/feedback`` list at most ``--max-feedback-items`` items
(413). A body not all there ``read_timeout`` seconds after its first read is a 408, and one whose
bytes would take the bodies being read past ``max_bytes_in_flight`` a 503 (both closed); a body
over ``OFF_LOOP_BYTES`` is parsed and run on the thread pool, so that no request holds the event
loop (docs/security.md, "Stalls"). Without tokens the service listens on loopback addresses only. The
request and response bodies are documented as pydantic models (``schemas()``) in the OpenAPI
document (``/openapi.json``, ``/docs``); the bodies themselves are parsed once, by hand
(``parse_decide``, ``parse_feedback``), for these messages and for speed, and not validated
against the models a second time.

**One process per state.** The service holds an exclusive lock on ``STATE_DIR.lock`` beside
the state directory (released when it exits, however it exits): a second ``bayes-safe serve``
on the same state, or ``bayes-safe feedback`` without ``--url``, is refused while it runs.

**Concurrency.** Every use of the ``Decider`` (decide, feedback, the posterior summary, a
snapshot) holds one lock, so they run one at a time and a snapshot never sees a half-applied
feedback. Decisions and feedback run on the event loop when the lock is free, on the thread pool
when it is held (a snapshot, ``/posterior``): no hop to a thread and back per request.
(``serve(run_on_loop=False)``: always on the thread pool, the default until issue 27: when a
decision cost 0.7 ms or more, the event loop had the worse p99 on the shared 2-core machine, e.g.
24 against 16 ms at load average 5.5. With the faster Decider of issue 27 the loop costs 0.62 ms of
server CPU per decision against 1.05 ms on the thread pool, and served 1,600 against 965
decisions/s, p99 4.0 against 6.0 ms, at load average 1.7; 1,060 against 846/s with p99 10.8
against 10.1 ms at load average 4: ``benchmarks/serve.py``.)
A replica (``--replica``) decides under the lock and lets it go before its row is written; its
rows are written from the event loop by ``group_commit.GroupCommit`` (the rows that wait
together in one statement), and its feedback takes no lock (``docs/replicas.md``).
JSON parsing and validation run outside the lock. ``POST /decide`` and
``/feedback`` are answered by ``fast_asgi``, a plain ASGI function in front of the FastAPI app
that reads the body and writes the JSON answer itself (FastAPI's routing, middleware and
request/response objects cost about as much as a conjugate decision: ``benchmarks/serve.py``
measures both); every other path, the OpenAPI document included, is FastAPI's. uvicorn runs with
httptools and uvloop when installed (the ``serve`` extra installs them). The propensity draws
are most of a decision's cost: with ``Decider(num_draws=200)``, the default, the server spent
1.6 ms of CPU per decision (and half a feedback) against 2.1 ms with 1000 draws, and served 459
against 338 decisions/s in the same run, before issue 27 (``Decider.decide`` in process: 0.33
against 0.48 ms after it).

**Crash safety.** The ``DecisionLog`` (SQLite, one committed transaction per decision and per
feedback, written under the lock *before* the reply) is the source of truth; the snapshot in
``STATE_DIR`` (``Decider.save``, atomic: a kill leaves the old directory or the new one) is a
checkpoint of it, written every ``--snapshot-every`` seconds when something changed and on
shutdown (SIGTERM / SIGINT: uvicorn finishes in-flight requests, then the lifespan shutdown
writes the snapshot; exit status 0). At startup ``recover`` brings the snapshot up to date with
the log: decisions logged after the snapshot become pending again (their ids are not reissued),
and feedback logged for decisions still pending in the snapshot is applied, in the order it was
logged. A feedback acknowledged to a client was committed to the log before the reply, so a
SIGKILL loses none of it, and none is applied twice: the snapshot and the log were written under
the same lock, so a feedback the snapshot has applied is no longer pending in it. (Snapshotting
after every feedback would also be safe, but a ``Decider.save`` (a directory of files, fsynced,
renamed) cost 2-20 ms on a 2-core machine against 0.7 ms for a decision with its log row;
``benchmarks/serve.py`` measures both.) Committing the log row costs about 0.04 ms of that
(WAL, no fsync), so log writes are not batched: a decision or feedback is acknowledged only
once its own row is committed. The log's SQLite runs in WAL mode with
``synchronous=NORMAL``: a committed row survives the process being killed; a power cut of the
machine may lose the last transactions.

The log defaults to ``STATE_DIR.log.sqlite`` beside ``STATE_DIR`` (never inside it: each
snapshot replaces ``STATE_DIR`` as a whole). Nothing read from either executes code. ``--log
postgresql://user@host:port/db`` keeps it in a PostgreSQL database instead (``DecisionLog``; the
``postgres`` extra): while that server is down or restarting, decisions and feedback are refused
with 503 (nothing recorded) and ``/health`` is degraded; the next request connects again.
"""

import asyncio
import contextlib
import functools
import gc
import inspect
import ipaddress
import json
import logging
import math
import os
import re
import signal
import socket
import sqlite3
import threading
import time
from pathlib import Path

from .._extras import require

__all__ = ["BadRequest", "Gate", "Refusal", "Service", "StateInUse", "create_app", "default_log_path", "fast_asgi",
           "recover", "schemas", "serve", "state_lock_path"]

#: the service's messages (a failed log write, snapshot or sync; the shutdown snapshot): ``bayes-safe
#: serve`` prints them on stderr as ``bayes-safe serve: ...``; in Python, configure ``logging``
_log = logging.getLogger("bayes_safe.serve")

#: the defaults of ``--max-body-bytes``, ``--max-candidates``, ``--max-feedback-items``
MAX_BODY_BYTES = 1 << 20
MAX_CANDIDATES = 1000
MAX_FEEDBACK_ITEMS = 10_000
#: the defaults of ``read_timeout`` and ``max_bytes_in_flight`` (``Gate``) and of uvicorn's ``limit_concurrency``
#: and ``timeout_keep_alive`` (``serve``): a body not received in full within ``READ_TIMEOUT`` seconds of its
#: request's headers is a 408 (the connection closed); the bodies being read hold at most
#: ``MAX_BYTES_IN_FLIGHT`` bytes together (a request that would pass it is a 503, closed); uvicorn
#: answers 503 to requests beyond ``LIMIT_CONCURRENCY`` connections and tasks, and closes a connection
#: idle for ``TIMEOUT_KEEP_ALIVE`` seconds between requests
READ_TIMEOUT = 10.0
MAX_BYTES_IN_FLIGHT = 64 << 20
LIMIT_CONCURRENCY = 1000
TIMEOUT_KEEP_ALIVE = 5.0
#: JSON nested deeper than this is refused (422) before it is parsed (a /decide body needs 3 levels)
MAX_DEPTH = 32
#: a ``/decide`` or ``/feedback`` body larger than this is parsed and run on the thread pool, never on the
#: event loop (issue 40: a MiB of JSON cost 20-35 ms to parse and check, a list of 10,000 feedback items
#: 40-300 ms to check, on the shared 2-core machine, and no other request would be answered meanwhile)
OFF_LOOP_BYTES = 16 * 1024
#: (replicas) the default seconds between syncs with the log (``--sync-every``)
SYNC_EVERY = 1.0
#: /health reports the snapshot stale when changes have waited this many snapshot intervals
STALE_INTERVALS = 3
_FLOAT_MAX = 1.7976931348623157e308


class BadRequest(ValueError):
    """A request the service refuses: ``status`` 422 for input a client must fix (404 for an unknown
    decision, 413 over a limit, 503 when the decision log could not be written); ``errors``: for a
    list of feedback, every bad item as ``{"index", "decision_id", "detail"}``."""

    def __init__(self, message: str, status: int = 422, errors: list | None = None):
        super().__init__(message)
        self.status = status
        self.errors = errors

    def body(self) -> dict:
        return {"detail": str(self)} if self.errors is None else {"detail": str(self), "errors": self.errors}


class StateInUse(ValueError):
    """The state directory is served by another process (its lock file is held)."""


def default_log_path(state_dir) -> Path:
    """``STATE_DIR.log.sqlite``, beside the state directory."""
    state_dir = Path(state_dir).resolve()
    return state_dir.with_name(state_dir.name + ".log.sqlite")


# ---------------------------------------------------------------------------------- recovery
def recover(decider) -> dict:
    """Bring a ``Decider`` loaded from a snapshot up to date with its log: ``decider.replay()``
    (which checks first that the log is the snapshot's); returns the counts it applied."""
    if decider.log is None or (decider.log.kind == "sqlite" and not Path(decider.log.path).exists()):
        return {"decisions": 0, "feedback": 0}
    return decider.replay()


# ---------------------------------------------------------------------------------- validation
def _is_number(v) -> bool:
    """A JSON number that converts to a float (an integer of hundreds of digits does not)."""
    t = type(v)
    return t is float or (t is int and -_FLOAT_MAX <= v <= _FLOAT_MAX)


def _not_number(v, what: str) -> BadRequest:
    if type(v) is int:  # too large for a float
        return BadRequest(f"{what}: expected a number within the float range (about 1.8e308), got an integer of "
                          f"{len(str(abs(v)))} digits")
    return BadRequest(f"{what}: expected a number, got {json.dumps(v)[:60]}")


_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_STEP = bytes(1 if c in b"[{" else 255 for c in range(256))  # +1 for an opening bracket, -1 (as int8) for a closing one


def _check_depth(body: bytes, limit: int = MAX_DEPTH) -> None:
    """``BadRequest`` when the JSON text ``body`` nests arrays and objects deeper than ``limit``:
    the running count of its brackets outside strings, in a fixed number of linear passes, each in C
    (``bytes.count``, ``replace``, ``split``, ``translate``, a numpy cumulative sum; only when there
    are more than ``limit`` opening brackets): about 0.1 ms for a thousand candidates, a few ms for
    a MiB whatever it holds. (Issue 40: the regex that took the strings out backtracked, quadratic
    in an unterminated string of escaped quotes: 10 s for 32 KB, the event loop blocked meanwhile.)

    The escapes first: each run of backslashes loses its pairs (``\\\\``, an escaped backslash;
    ``bytes.replace`` works left to right, so a run of ``k`` keeps ``k % 2``), then each escaped quote
    (``\\"``) goes; what remains holds a quote only where a string opens or closes, and every other
    piece between quotes is outside the strings. (Outside a string a backslash is not JSON: that text
    is refused by the parser, whatever this count says.)"""
    if body.count(b"[") + body.count(b"{") <= limit:
        return
    import numpy as np

    if b'"' in body:  # the strings out
        if b"\\" in body:
            body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
        body = b"".join(body.split(b'"')[::2])
    skeleton = body.translate(None, _NOT_BRACKETS)
    steps = np.frombuffer(skeleton.translate(_STEP), dtype=np.int8)
    if steps.size and int(np.cumsum(steps, dtype=np.int32).max()) > limit:
        raise BadRequest(f"body: JSON nested deeper than {limit} levels")


def _loads(body: bytes):
    """The JSON value of ``body``; ``BadRequest`` (422) for text that is not JSON, nests deeper than
    ``MAX_DEPTH`` or holds an integer of more digits than Python converts (4300)."""
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    _check_depth(body)
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"body: not JSON ({exc})") from None
    except ValueError as exc:  # an integer of more than sys.get_int_max_str_digits() digits
        raise BadRequest(f"body: a number too large ({exc})") from None
    except RecursionError:  # (the depth check comes first: a backstop)
        raise BadRequest(f"body: JSON nested deeper than {MAX_DEPTH} levels") from None


def _object(body: bytes, allowed: tuple[str, ...]) -> dict:
    payload = _loads(body)
    if not isinstance(payload, dict):
        raise BadRequest(f"body: expected a JSON object with fields {list(allowed)}, got {type(payload).__name__}")
    extra = [k for k in payload if k not in allowed]
    if extra:
        raise BadRequest(f"body: unexpected field(s) {extra} (expected {list(allowed)})")
    return payload


def _numbers(row, what: str) -> list:
    if not isinstance(row, list):
        raise BadRequest(f"{what}: expected a list of numbers, got {json.dumps(row)[:60]}")
    for j, v in enumerate(row):
        if not _is_number(v):
            raise _not_number(v, f"{what}[{j}]")
    return row


def parse_decide(body: bytes, max_candidates: int = MAX_CANDIDATES) -> dict:
    """The arguments of ``Decider.decide`` from a ``/decide`` body (``BadRequest`` on bad input; 413
    for more than ``max_candidates`` candidates)."""
    import numpy as np

    payload = _object(body, ("features", "context", "baseline", "valid"))
    if ("features" in payload) == ("context" in payload):
        raise BadRequest("features: give either features (candidate features [K][d] or a list of {name: value}) "
                         "or context (one {name: value}), not " + ("both" if "features" in payload else "neither"))
    if "context" in payload:
        field, value = "context", payload["context"]
        if isinstance(value, list):
            features = np.asarray(_numbers(value, "context"), dtype=np.float64)
        elif isinstance(value, dict):
            features = value
        else:
            raise BadRequest(f"context: expected a {{name: value}} object or a list of numbers, got {json.dumps(value)[:60]}")
        if isinstance(value, dict):
            for k, v in value.items():
                if not _is_number(v):
                    raise _not_number(v, f"context[{k!r}]")
    else:
        field, value = "features", payload["features"]
        if not isinstance(value, list) or not value:
            raise BadRequest(f"features: expected a non-empty list (one entry per candidate action), got "
                             f"{json.dumps(value)[:60]}")
        if len(value) > max_candidates:
            raise BadRequest(f"features: {len(value)} candidates, more than the limit of {max_candidates} "
                             "(bayes-safe serve --max-candidates)", status=413)
        if all(isinstance(r, dict) for r in value):
            for i, r in enumerate(value):
                for k, v in r.items():
                    if not _is_number(v):
                        raise _not_number(v, f"features[{i}][{k!r}]")
            features = value
        else:
            rows = [_numbers(r, f"features[{i}]") for i, r in enumerate(value)]
            widths = {len(r) for r in rows}
            if len(widths) != 1:
                raise BadRequest(f"features: expected rows of equal length, got lengths {[len(r) for r in rows]}")
            features = np.asarray(rows, dtype=np.float64)
    baseline = payload.get("baseline")
    if baseline is not None and not (isinstance(baseline, int) and not isinstance(baseline, bool)):
        raise BadRequest(f"baseline: expected an action index (int) or null, got {json.dumps(baseline)[:60]}")
    valid = payload.get("valid")
    if valid is not None and not (isinstance(valid, list) and all(isinstance(v, bool) for v in valid)):
        raise BadRequest(f"valid: expected a list of true/false, one per action, got {json.dumps(valid)[:60]}")
    return {"field": field, "features": features, "baseline": baseline,
            "valid": None if valid is None else np.asarray(valid, dtype=bool)}


def _feedback_item(payload, where: str = "") -> dict:
    """One feedback object's arguments (``where``: the prefix of the fields in messages, e.g. ``[3].``)."""
    if not isinstance(payload, dict):
        raise BadRequest(f"{where or 'body'}: expected a JSON object with fields {list(_FEEDBACK_FIELDS)}, got "
                         f"{type(payload).__name__}")
    extra = [k for k in payload if k not in _FEEDBACK_FIELDS]
    if extra:
        raise BadRequest(f"{where or 'body'}: unexpected field(s) {extra} (expected {list(_FEEDBACK_FIELDS)})")
    if "decision_id" not in payload:
        raise BadRequest("decision_id: required")
    if payload.get("reward") is None and payload.get("constraints") is None:
        raise BadRequest("reward: required (or, for outcomes that arrive metric by metric, constraints: the ones "
                         "known now)")
    decision_id = payload["decision_id"]
    if isinstance(decision_id, bool) or not isinstance(decision_id, (str, int)):
        raise BadRequest(f"decision_id: expected the id /decide returned (a string), got {json.dumps(decision_id)[:60]}")
    reward = payload.get("reward")
    if reward is not None and not _is_number(reward):
        raise _not_number(reward, "reward")
    constraints = payload.get("constraints")
    if isinstance(constraints, dict):  # {metric name: value or null}
        for k, v in constraints.items():
            if v is not None and not _is_number(v):
                raise _not_number(v, f"constraints[{k!r}]")
    elif constraints is not None:
        if not isinstance(constraints, list):
            raise BadRequest(f"constraints: expected a list of numbers (null for a metric not known yet) or an "
                             f"object of metric names, got {json.dumps(constraints)[:60]}")
        for j, v in enumerate(constraints):
            if v is not None and not _is_number(v):
                raise _not_number(v, f"constraints[{j}]")
    return {"decision_id": str(decision_id), "reward": reward, "constraints": constraints}


_FEEDBACK_FIELDS = ("decision_id", "reward", "constraints")


def _row_errors(problems, what: str = "feedback item") -> BadRequest:
    """One 422 naming every bad item of a list: ``problems`` of ``(index, decision_id, message)``."""
    shown = "; ".join(f"[{i}]" + (f" decision_id {k!r}" if k else "") + f": {m}" for i, k, m in problems)
    return BadRequest(f"{len(problems)} bad {what}(s), nothing applied: {shown}",
                      errors=[{"index": i, "decision_id": k or None, "detail": m} for i, k, m in problems])


def parse_feedback(body: bytes, max_items: int = MAX_FEEDBACK_ITEMS) -> dict:
    """The arguments of ``Decider.feedback`` from a ``/feedback`` body: one object, or a list of
    them (``{"many": [...]}``, every bad item named at once; ``BadRequest`` on bad input, 413 for
    a list of more than ``max_items``)."""
    payload = _loads(body)
    if isinstance(payload, list):
        if not payload:
            raise BadRequest("body: expected a feedback object or a non-empty list of them, got []")
        if len(payload) > max_items:
            raise BadRequest(f"body: {len(payload)} feedback items, more than the limit of {max_items} per request "
                             "(bayes-safe serve --max-feedback-items): send them in parts", status=413)
        items, problems = [], []
        for i, obj in enumerate(payload):
            try:
                items.append((i, _feedback_item(obj, f"[{i}]")))
            except BadRequest as exc:
                k = obj.get("decision_id") if isinstance(obj, dict) else None
                problems.append((i, None if k is None or isinstance(k, bool) else str(k), str(exc)))
        # the items that parsed are checked by the Decider too (unknown ids ...): every bad item is named at once
        return {"many": items, "problems": problems}
    if not isinstance(payload, dict):
        raise BadRequest(f"body: expected a JSON object with fields {list(_FEEDBACK_FIELDS)} or a list of them, "
                         f"got {type(payload).__name__}")
    return _feedback_item(payload)


# ---------------------------------------------------------------------------------- the service
#: (replicas) a sync applies the rows it read in chunks of this many, letting decisions in between
#: (a second's feedback at 1,000/s held the lock for about 10 ms in one piece)
LEARN_CHUNK = 32


class _NoLock:
    """A lock that is always free (a replica's feedback: nothing of the Decider's to guard)."""

    def acquire(self, blocking: bool = True) -> bool:
        return True

    def release(self) -> None:
        pass


_NO_LOCK = _NoLock()


class Deferred:
    """The rest of a request that waits on the database (a replica's log write): ``Deferred(fn)()``
    runs it, on a thread of the pool when the request was begun on the event loop."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn

    def __call__(self) -> dict:
        return self.fn()


def _parse_and_run(parse, run, body: bytes) -> dict:
    """``run(parse(body), True)``: a large body's whole request, on a thread of the pool (``blocking``:
    the answer itself, never a ``Deferred`` or a coroutine)."""
    return run(parse(body), True)


def _decision_answer(decision) -> dict:
    """``/decide``'s answer (``Decision.to_dict`` without ``asdict``'s deep copy)."""
    return {"decision_id": decision.decision_id, "action": decision.action, "propensity": decision.propensity,
            "propensity_se": decision.propensity_se, "model_version": decision.model_version,
            "probabilities": list(decision.probabilities)}


def client_log_error(exc: BaseException) -> str:
    """What a client is told of a failed log read or write: a PostgreSQL log's error names its user,
    host, port and database (the URL, the driver's message), which stay in the server's log; a
    SQLite log's (``database or disk is full``) is told whole (issue 40)."""
    from .log import LogUnavailable

    if isinstance(exc, LogUnavailable) or type(exc).__module__.split(".")[0] in ("psycopg", "psycopg_pool"):
        return f"{type(exc).__name__}: the log's database did not answer or refused the write; the server's log says more"
    return f"{type(exc).__name__}: {exc}"


class Service:
    """A ``Decider`` loaded from ``state_dir`` and brought up to date with its log, behind one lock.

    Args:
        state_dir: a directory written by ``Decider.save``; snapshots replace it.
        log: the ``DecisionLog`` file (default ``default_log_path(state_dir)``; must be outside
            ``state_dir``) or the URL of its PostgreSQL database (``postgresql://user@host:port/db``).
        allow_imports: import the module of a prior saved as ``module:function`` (a callable Pyro
            prior, e.g. of a Langevin model), which runs that module's code (``--allow-imports``).
    """

    def __init__(self, state_dir, log=None, allow_imports: bool = False, replica: bool = False,
                 sync_every: float = SYNC_EVERY):
        self.allow_imports = bool(allow_imports)
        self.replica = bool(replica)
        self.sync_every = float(sync_every)
        self.state_dir = Path(state_dir)
        if not self.state_dir.is_dir():
            raise FileNotFoundError(f"STATE_DIR: {self.state_dir} is not a directory (expected one written by Decider.save)")
        from .log import is_log_url, log_location

        try:
            log_path = log_location(log) if log is not None else default_log_path(self.state_dir)
        except ValueError as exc:
            raise ValueError(f"--log: {exc}") from None
        if not is_log_url(log_path) and log_path.resolve().is_relative_to(self.state_dir.resolve()):
            raise ValueError(f"--log: {log_path} is inside STATE_DIR, which each snapshot replaces as a whole; "
                             "put the log beside it")
        if self.replica and not is_log_url(log_path):
            raise ValueError("--replica: replicas share one PostgreSQL decision log: give --log postgresql://user@host:"
                             "port/db (an SQLite log serves one process)")
        if self.replica:  # the replica holding the state's lock writes its snapshots; the others try again later
            self._lockfile = _hold_state_lock(self.state_dir, wait=False)
        else:  # one process serves a state: refused while another does
            self._lockfile = _hold_state_lock(self.state_dir)
        try:
            self._open(log_path)
        except BaseException:
            if self._lockfile is not None:
                self._lockfile.close()
            raise

    def _open(self, log_path) -> None:
        from .decider import Decider
        from .log import DecisionLog, LogError

        # what a failed log write raises: SQLite's errors, a file's, a PostgreSQL log's (LogUnavailable
        # when its server is down: a ConnectionError; the next write connects again)
        self.log_errors = (sqlite3.Error, OSError, LogError)
        self.lock = threading.Lock()
        self.started = time.time()
        self.last_snapshot: float | None = None
        self.snapshot_error: Exception | None = None  # of the last snapshot; None once one succeeds
        self.log_error: str | None = None  # of the last decision or feedback write; None once one succeeds
        self._changed_since: float | None = None  # the first change after the last snapshot
        # the bookkeeping at the last snapshot: next_id and next_id - pending (the feedback count) only
        # grow, so any decision or feedback changes it
        self._saved = None
        self.duplicates = 0     # feedback acknowledged and ignored (already had feedback), since the start
        self.bad_feedback = 0   # feedback refused by the Decider (unknown id, wrong number of constraints ...)
        self.sync_error: str | None = None  # (replicas) of the last sync; None once one succeeds
        self._log_unreachable = False  # the last failed write found the PostgreSQL server unreachable
        self.last_sync = time.time()
        self._sync_lock = threading.Lock()
        self._tally = threading.Lock()  # (replicas) feedback's counters, written from several threads
        self.committer = None  # (replicas) the group commit of the log writes (made on the event loop)
        if self.replica:
            from .replica import ReplicaDecider

            try:
                self.decider = ReplicaDecider.load(self.state_dir, log=log_path, allow_imports=self.allow_imports)
            except LogError as exc:  # its server unreachable, no such database, no permission ...
                raise ValueError(f"--log: {str(exc).removeprefix('log: ')}") from None
            self.log = self.decider.log
            self.recovered = dict(self.decider.replayed)
            self._saved = None
            if self._lockfile is not None:
                self.snapshot()  # the state as a replica's, with its watermark: the next start begins here
            return
        # first: a bad STATE_DIR creates no log file
        self.decider = Decider.load(self.state_dir, allow_imports=self.allow_imports)
        try:
            self.log = DecisionLog(log_path)
        except ValueError as exc:
            raise ValueError(f"--log: {exc}") from None
        except LogError as exc:  # a PostgreSQL log: its server unreachable, no such database, no permission ...
            raise ValueError(f"--log: {str(exc).removeprefix('log: ')}") from None
        try:
            # checks that the log is this snapshot's (refused before anything is applied), then replays it
            self.recovered = self.decider.replay(self.log)
            if self.recovered["decisions"] or self.recovered["feedback"]:
                self.snapshot()  # the next restart starts from here
            else:
                self._saved = self._mark()
        except BaseException:
            self.log.close()
            raise

    def _mark(self) -> tuple:
        d = self.decider
        if self.replica:  # the log keeps the decisions and feedback; the snapshot, the posterior and its watermark
            return (d.log_seq,)
        return d.next_id, d.model_version, len(d.pending), len(d.queued)

    def sync(self) -> int:
        """(Replicas) learn the feedback the log committed since the last sync (``ReplicaDecider.sync``:
        read outside the lock, applied under it); returns how many rows. A failure is kept for
        ``/health`` and raised."""
        with self._sync_lock:
            try:
                rows = self.decider.fetch()
            except self.log_errors as exc:
                self.sync_error = f"{type(exc).__name__}: {exc}"
                raise
            n = 0
            for i in range(0, len(rows), LEARN_CHUNK):  # the lock let go between chunks: decisions in between
                with self.lock:
                    n += self.decider.learn(rows[i:i + LEARN_CHUNK])
            self.last_sync, self.sync_error = time.time(), None
            if self._log_unreachable:  # the server is back (a write that failed on its own stays reported)
                self.log_error, self._log_unreachable = None, False
            if n and self._changed_since is None:
                self._changed_since = time.time()
            return n

    # ------------------------------------------------------------------ endpoints
    def decide(self, body: bytes) -> dict:
        """``/decide``: the decision of a request body (``BadRequest`` on bad input)."""
        return self.decide_parsed(parse_decide(body))

    def decide_parsed(self, args: dict, blocking: bool = True):
        """The decision of ``parse_decide``'s arguments; None, and nothing done, when ``blocking``
        is False and the Decider is busy (a snapshot, another request on a thread).

        A replica decides under the lock and writes the decision to the log after letting it go
        (a round trip to the database, which another request's decision need not wait for): on
        the event loop (``blocking`` False) it returns a coroutine that the group commit's write
        completes (``group_commit``), for the caller to await."""
        if self.replica:
            return self._replica_decide(args, blocking)
        if not self.lock.acquire(blocking):
            return None
        try:
            decision = self.decider.decide(args["features"], baseline=args["baseline"], valid=args["valid"])
        except (ValueError, TypeError) as exc:
            raise self._bad_decide(args, exc) from None
        except self.log_errors as exc:  # the log write failed: no id issued, nothing pending
            raise self._log_failed(exc) from None
        else:
            self._changed()
        finally:
            self.lock.release()
        return _decision_answer(decision)

    def _replica_decide(self, args: dict, blocking: bool):
        if not self.lock.acquire(blocking):
            return None
        try:
            decision, row = self.decider.decide_unlogged(args["features"], baseline=args["baseline"],
                                                         valid=args["valid"])
        except (ValueError, TypeError) as exc:
            raise self._bad_decide(args, exc) from None
        except self.log_errors as exc:  # reserving a block of numbers failed
            raise self._log_failed(exc) from None
        finally:
            self.lock.release()
        if not blocking:
            return self._commit_decision(decision, row)
        try:
            self.decider.log.write_decision(*row)
        except self.log_errors as exc:  # not logged: the id is never issued
            raise self._log_failed(exc) from None
        return self._decided(decision)

    async def _commit_decision(self, decision, row) -> dict:
        """(Replicas, on the event loop) the decision written by the group commit, then answered."""
        try:
            await self._group_commit().decision(row)
        except self.log_errors as exc:  # not logged: the id is never issued
            raise self._log_failed(exc) from None
        return self._decided(decision)

    def _decided(self, decision) -> dict:
        self.decider.count("decided")
        self._changed()
        return _decision_answer(decision)

    def _group_commit(self):
        """(Replicas) the ``GroupCommit`` of the running event loop (made on first use)."""
        if self.committer is None:
            from .group_commit import GroupCommit

            self.committer = GroupCommit(self.decider.log.path)
        return self.committer

    @staticmethod
    def _bad_decide(args: dict, exc: Exception) -> BadRequest:
        message = str(exc)
        if args["field"] == "context" and message.startswith("features"):
            message = "context" + message[len("features"):]
        return BadRequest(message)

    def feedback(self, body: bytes) -> dict:
        """``/feedback``: ``{"accepted": bool}`` of a request body (``BadRequest`` on bad input, 404 for an unknown id)."""
        return self.feedback_parsed(parse_feedback(body))

    def feedback_parsed(self, args: dict, blocking: bool = True) -> dict | None:
        """``feedback`` of ``parse_feedback``'s arguments; None when not ``blocking`` and busy (as ``decide_parsed``).

        A list (``args["many"]``) is applied all or nothing (``Decider.feedback_many``: one log
        transaction): ``{"accepted": [...], "applied": n, "duplicates": m}``, or a 422 naming every
        bad item (an unknown id among them) with nothing applied."""
        from .decider import FeedbackRowsError

        if self.replica:
            # a replica's feedback is a log write and nothing else (the posterior learns it at a sync):
            # no lock; on the event loop, one feedback is checked there and written by the group
            # commit, a list is written from a thread
            if not blocking:
                c = args.get("constraints")
                if "many" in args or args.get("reward") is None or isinstance(c, dict) or (c is not None and None in c):
                    # a list, or some metrics of a decision (outcomes apart): written from a thread
                    return Deferred(functools.partial(self.feedback_parsed, args, True))
                return self._commit_feedback(args)
            lock = _NO_LOCK
        else:
            lock = self.lock
        if not lock.acquire(blocking):
            return None
        try:
            if "many" in args:
                rows = [(a["decision_id"], a["reward"], a["constraints"]) for _, a in args["many"]]
                if args["problems"]:  # refused whatever the rest holds: name the Decider's objections too
                    problems = list(args["problems"])
                    try:
                        self.decider.feedback_many(rows, check_only=True)
                    except FeedbackRowsError as exc:
                        problems += [(args["many"][i][0], k, m) for i, k, m in exc.problems]
                    raise FeedbackRowsError(sorted(problems))
                accepted = self.decider.feedback_many(rows)
                self._count("duplicates", len(accepted) - sum(accepted))
            else:
                accepted = self.decider.feedback(args["decision_id"], args["reward"], args["constraints"])
                self._count("duplicates", int(not accepted))
        except FeedbackRowsError as exc:
            self._count("bad_feedback", 1)
            raise _row_errors([(i, k or None, m) for i, k, m in exc.problems]) from None
        except (ValueError, TypeError) as exc:
            raise self._bad_feedback(exc) from None
        except self.log_errors as exc:  # the log write failed: nothing recorded, still pending
            raise self._log_failed(exc) from None
        else:
            self._changed()
        finally:
            lock.release()
        if "many" in args:
            applied = sum(accepted)
            return {"accepted": accepted, "applied": applied, "duplicates": len(accepted) - applied}
        return {"accepted": accepted}

    async def _commit_feedback(self, args: dict) -> dict:
        """(Replicas, on the event loop) one feedback checked, written by the group commit, answered."""
        decision_id = args["decision_id"]
        try:
            # (the outlier guard reads the decision's features from the log: a log that cannot be read is a 503)
            row = self.decider.feedback_row(decision_id, args["reward"], args["constraints"])
        except self.log_errors as exc:
            raise self._log_failed(exc) from None
        except (ValueError, TypeError) as exc:
            raise self._bad_feedback(exc) from None
        try:
            new = await self._group_commit().feedback(*row)
            if new is False:  # the decision has a report already: the metrics of this one it lacks, if any
                new = (await asyncio.to_thread(self.decider.log.write_apart_shared, [row]))[0]
        except self.log_errors as exc:  # not recorded: the client may send it again
            raise self._log_failed(exc) from None
        try:
            accepted = self.decider.feedback_written(decision_id, new)
        except ValueError as exc:
            raise self._bad_feedback(exc) from None
        self._count("duplicates", int(not accepted))
        self._changed()
        return {"accepted": accepted}

    def _bad_feedback(self, exc: Exception) -> BadRequest:
        self._count("bad_feedback", 1)
        message = str(exc)
        return BadRequest(message, status=404 if message.startswith("decision_id: unknown") else 422)

    def _count(self, counter: str, n: int) -> None:
        """Add ``n`` to the counter ``duplicates`` or ``bad_feedback`` (replicas count from several threads)."""
        if n:
            with self._tally:
                setattr(self, counter, getattr(self, counter) + n)

    def _changed(self) -> None:
        """A decision or feedback was logged (under the lock): the log is writable, the snapshot behind."""
        self.log_error = None
        if self._changed_since is None:
            self._changed_since = time.time()

    def _log_failed(self, exc: BaseException) -> BadRequest:
        """A 503 for a decision or feedback whose log write failed (kept for /health; the client's
        answer names no database address: ``client_log_error``)."""
        from .log import LogUnavailable

        self.log_error = f"{type(exc).__name__}: {exc}"
        self._log_unreachable = isinstance(exc, LogUnavailable)
        _log.error("the decision log could not be written: %s", self.log_error)
        return BadRequest(f"the decision log could not be written ({client_log_error(exc)}); nothing was recorded: "
                          "retry later", status=503)

    def problems(self, snapshot_every: float | None = None, detailed: bool = True) -> list[str]:
        """What makes the service unhealthy: the last log write failed; the last snapshot failed; or
        changes have waited more than ``STALE_INTERVALS`` snapshot intervals. ``detailed``: with the
        error messages (which name files)."""
        out = []
        if self.log_error is not None:
            out.append("decision log: the last write failed" + (f" ({self.log_error})" if detailed else ""))
        if self.snapshot_error is not None:
            out.append("snapshot: the last snapshot failed" + (f" ({type(self.snapshot_error).__name__}: "
                                                               f"{self.snapshot_error})" if detailed else ""))
        if self.replica:
            if self.sync_error is not None:
                out.append("decision log: the last sync failed" + (f" ({self.sync_error})" if detailed else ""))
            behind = time.time() - self.last_sync
            if behind > STALE_INTERVALS * self.sync_every + 1:
                out.append(f"sync: the posterior has not learned from the log for {behind:.0f} s (syncs every "
                           f"{self.sync_every:g} s)")
        changed = self._changed_since
        if snapshot_every and changed is not None and time.time() - changed > STALE_INTERVALS * snapshot_every:
            out.append(f"snapshot: changes unsaved for {time.time() - changed:.0f} s (snapshots every "
                       f"{snapshot_every:g} s)")
        return out

    def health(self, snapshot_every: float | None = None, detailed: bool = True) -> dict:
        """``{"status": "ok"}`` or ``{"status": "degraded", "problems": [...]}`` (``problems``), with
        the counts when ``detailed`` (a caller with a token, or a service without tokens)."""
        problems = self.problems(snapshot_every, detailed)
        out = {"status": "degraded" if problems else "ok"}
        if problems:
            out["problems"] = problems
        if not detailed:
            return out
        d = self.decider
        return out | {"model_version": d.model_version, **self._counts(), "uptime_seconds": time.time() - self.started,
                      "last_snapshot": self.last_snapshot,
                      "snapshot_error": None if self.snapshot_error is None else str(self.snapshot_error),
                      "provenance": getattr(d, "provenance", None)} | self._drift()

    def _drift(self) -> dict:
        """``{"drift_alarms": {metric: alarms}}`` when a model detects changes (issue 43), else ``{}``."""
        alarms = getattr(self.decider, "drift_alarms", None)
        return {"drift_alarms": alarms} if alarms else {}

    def _counts(self) -> dict:
        """``decisions``, ``pending``, ``queued``: of the Decider; a replica's are its own decisions
        since it started, the feedback it accepted (``received``) and its watermark (``log_seq``,
        the log's feedback row its posterior has learned up to: the same posterior on every
        replica at the same ``log_seq``), and whether it writes the snapshots (``writer``)."""
        d = self.decider
        if self.replica:
            return {"decisions": d.decided, "received": d.received, "log_seq": d.log_seq,
                    "writer": self._lockfile is not None, "repairs": getattr(d, "repairs", 0)}
        return {"decisions": d.next_id, "pending": len(d.pending), "queued": len(d.queued)}

    def posterior(self) -> dict:
        with self.lock:
            d = self.decider
            out = {"model_version": d.model_version, **self._counts(), "feature_names": d.feature_names,
                   "provenance": getattr(d, "provenance", None), "models": {}}
            for role, model in d.policy.models().items():
                out["models"][str(role)] = _summary(model)
        return out

    # ------------------------------------------------------------------ state
    def snapshot(self, force: bool = False) -> bool:
        """Save the Decider to ``state_dir`` (atomic) if it changed since the last snapshot; True if written."""
        with self.lock:
            if self.replica and self._lockfile is None:  # another replica writes the snapshots while it lives
                self._lockfile = _hold_state_lock(self.state_dir, wait=False)
                if self._lockfile is None:
                    self._changed_since = None
                    return False
            mark = self._mark()
            if mark == self._saved and not force:
                self._changed_since = None  # (a duplicate feedback changes nothing)
                return False
            try:
                self.decider.save(self.state_dir)
            except Exception as exc:
                self.snapshot_error = exc
                raise
            self._saved, self.last_snapshot, self.snapshot_error = mark, time.time(), None
            self._changed_since = None
            return True

    def close(self) -> None:
        self.log.close()
        if self._lockfile is not None:
            self._lockfile.close()  # releases the state's lock


def state_lock_path(state_dir) -> Path:
    """``STATE_DIR.lock``, beside the state directory: held by the process that serves it."""
    state_dir = Path(state_dir).resolve()
    return state_dir.with_name(state_dir.name + ".lock")


def _hold_state_lock(state_dir, wait: bool = True):
    """An open file holding an exclusive lock on ``state_lock_path(state_dir)`` (released when it
    is closed or the process dies), or ``StateInUse`` when another process holds it (None
    instead with ``wait=False``: a replica that does not write the snapshots)."""
    import os

    try:
        import fcntl
    except ImportError:  # not POSIX (Windows): no lock; serve each state from one process yourself
        return open(os.devnull)  # closed by Service.close
    path = state_lock_path(state_dir)
    f = open(path, "a+")  # noqa: SIM115 - held open for the life of the service
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        if not wait:
            return None
        raise StateInUse(f"STATE_DIR: {Path(state_dir)} is being served by {holder} (it holds {path}): stop that "
                         "process first (to send it outcomes meanwhile: bayes-safe feedback --url URL)") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}")
    f.flush()
    return f


def _summary(model) -> dict:
    """``{"type", "mean", "sd"}`` of a model with ``posterior_mean`` / ``posterior_covariance``
    (the batch dimension of one dropped), ``{"type"}`` otherwise; with ``change_points`` and
    ``observations_since_change`` (one per arm) for a model that detects changes (issue 43)."""
    from .decider import _detector_of

    out = {"type": type(model).__name__}
    det = _detector_of(model)
    if det is not None:  # adaptive forgetting: its alarms, and what it learned since the last
        out.update(change_points=det.alarms.reshape(-1).tolist(), observations_since_change=det.since.reshape(-1).tolist())
    source = model if hasattr(type(model), "posterior_mean") else getattr(model, "arms", None)
    try:
        mean = source.posterior_mean
        cov = source.posterior_covariance
    except Exception:  # noqa: BLE001 - no closed-form posterior (sampled, GP): the type is all there is
        return out
    mean = mean[0] if mean.dim() > 1 and mean.shape[0] == 1 else mean
    sd = cov.diagonal(dim1=-2, dim2=-1).clamp_min(0).sqrt()
    sd = sd[0] if sd.dim() > 1 and sd.shape[0] == 1 else sd
    out.update(mean=mean.tolist(), sd=sd.tolist())
    return out


# ---------------------------------------------------------------------------------- the gate
class Refusal(Exception):
    """A request refused before any work (``Gate``): its status, ``detail`` and extra headers;
    ``close``: close the connection after the answer (a body left unread)."""

    def __init__(self, status: int, detail: str, headers: tuple = (), close: bool = False):
        super().__init__(detail)
        self.status, self.detail, self.headers, self.close = status, detail, tuple(headers), close

    def response(self) -> tuple[int, list, bytes]:
        """``(status, headers, body)`` of the JSON answer."""
        body = json.dumps({"detail": self.detail}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)), *self.headers]
        if self.close:
            headers.append((b"connection", b"close"))
        return self.status, headers, body


#: the role each endpoint needs when the service has tokens (the rest: /health, the OpenAPI document, open)
ENDPOINT_ROLES = {("POST", "/decide"): "decide", ("POST", "/feedback"): "feedback", ("GET", "/posterior"): "read",
                  ("GET", "/metrics"): "read"}
_WILDCARD_HOSTS = {"", "0.0.0.0", "::", "*"}


def _host_name(value: str) -> str:
    """The name of a ``Host`` header value or a host option, lower case, without the port or IPv6 brackets.

    Only ``name``, ``name:PORT``, ``[v6]`` and ``[v6]:PORT`` with a numeric port lose their port; any
    other value is returned whole, so it names no allowed host (``127.0.0.1:8080@attacker.example``
    is not ``127.0.0.1``)."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        rest = value[end + 1:] if end >= 0 else ""
        if end < 0 or (rest and not (rest[0] == ":" and rest[1:].isdigit())):
            return value
        return value[1:end]
    if value.count(":") == 1:
        name, port = value.split(":", 1)
        return name if port.isdigit() else value
    return value  # a name, or a bare IPv6 address (an option: ::1)


#: the port a scheme implies: an Origin that names it is the same origin as one that leaves it out
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def _origin(value: str) -> str:
    """An ``Origin`` header value or an ``--allowed-origin``, compared as the same origin: lower case,
    no trailing slash, no default port (``https://app.example:443`` is ``https://app.example``)."""
    value = value.strip().rstrip("/").lower()
    scheme, sep, rest = value.partition("://")
    port = _DEFAULT_PORTS.get(scheme)
    if sep and port is not None and rest.endswith(":" + port) and rest[:-len(port) - 1]:
        return f"{scheme}://{rest[:-len(port) - 1]}"
    return value


class Gate:
    """The checks every request passes before any work, in this order, one function
    (``refusal``) for ``fast_asgi`` and the FastAPI app alike:

    1. the ``Host`` header names this service (``allowed_hosts``; default localhost, 127.0.0.1,
       ::1 and ``host``), with or without a port: else 421 (a browser page on another name, DNS
       rebinding);
    2. an ``Origin`` header is one of ``allowed_origins`` (default none): else 403 (a page in a
       browser);
    3. the token (``Authorization: Bearer``) holds the endpoint's role (``ENDPOINT_ROLES``) when
       the service has ``tokens``: else 401 (none, or not a known one) or 403 (the role missing);
    4. a POST body is ``Content-Type: application/json``: else 415;
    5. its ``Content-Length`` is at most ``max_body_bytes``: else 413 at once, nothing read.

    ``read_body`` then reads a body up to ``max_body_bytes`` and refuses (413) one that passes it
    (chunked), without reading the rest; one not received in full within ``read_timeout`` seconds
    (a client that stalls, a chunk that never comes) is a 408; a body that would take the bytes held
    by the bodies being read, all requests together, past ``max_bytes_in_flight`` is a 503 (each of
    these closes the connection, the rest unread). ``max_candidates`` and ``max_feedback_items`` are
    checked while parsing (413)."""

    def __init__(self, tokens=None, *, host: str = "127.0.0.1", allowed_hosts=(), allowed_origins=(),
                 max_body_bytes: int = MAX_BODY_BYTES, max_candidates: int = MAX_CANDIDATES,
                 max_feedback_items: int = MAX_FEEDBACK_ITEMS, read_timeout: float = READ_TIMEOUT,
                 max_bytes_in_flight: int = MAX_BYTES_IN_FLIGHT):
        for option, value in (("--max-body-bytes", max_body_bytes), ("--max-candidates", max_candidates),
                              ("--max-feedback-items", max_feedback_items),
                              ("max_bytes_in_flight", max_bytes_in_flight)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{option}: expected a positive integer, got {value!r}")
        if isinstance(read_timeout, bool) or not isinstance(read_timeout, (int, float)) \
                or not (math.isfinite(read_timeout) and read_timeout > 0):
            raise ValueError(f"read_timeout: expected a number of seconds > 0, got {read_timeout!r}")
        for name in allowed_hosts:
            if not isinstance(name, str) or not _host_name(name) or _host_name(name) in _WILDCARD_HOSTS \
                    or any(c in name for c in " /\t"):
                raise ValueError(f"--allowed-host: expected a host name as clients send it (api.example.com, "
                                 f"10.0.0.5, [::1]), got {name!r}")
        for origin in allowed_origins:
            if not isinstance(origin, str) or not re.fullmatch(r"https?://[^/\s]+", origin.strip().rstrip("/")):
                raise ValueError(f"--allowed-origin: expected scheme://host[:port] (https://app.example.com), "
                                 f"got {origin!r}")
        self.tokens = tokens
        names = {"localhost", "127.0.0.1", "::1", *(_host_name(h) for h in allowed_hosts)}
        if _host_name(host) not in _WILDCARD_HOSTS:
            names.add(_host_name(host))
        self.allowed_hosts = frozenset(names)
        self.allowed_origins = frozenset(_origin(o) for o in allowed_origins)
        self.max_body_bytes = max_body_bytes
        self.max_candidates = max_candidates
        self.max_feedback_items = max_feedback_items
        self.read_timeout = float(read_timeout)
        self.max_bytes_in_flight = max_bytes_in_flight
        #: the bytes held by the bodies being read now, all requests together (the event loop's only)
        self.bytes_in_flight = 0

    def refusal(self, scope) -> Refusal | None:
        """The ``Refusal`` of an HTTP request (its ASGI ``scope``), or None when it may go on."""
        host = origin = authorization = content_type = length = None
        twice = None
        for name, value in scope["headers"]:
            if name == b"host":
                twice = "Host" if host is not None else twice
                host = value
            elif name == b"origin":
                origin = value
            elif name == b"authorization":
                twice = "Authorization" if authorization is not None else twice
                authorization = value
            elif name == b"content-type":
                content_type = value
            elif name == b"content-length":
                twice = "Content-Length" if length is not None and length != value else twice
                length = value
        if twice is not None:
            return Refusal(400, f"{twice}: the header is given more than once")
        if host is None:
            return Refusal(400, "Host: the header is required")
        if _host_name(host.decode("latin-1")) not in self.allowed_hosts:
            return Refusal(421, f"Host: {host.decode('latin-1')[:100]!r} is not a name of this service (allowed: "
                                f"{', '.join(sorted(self.allowed_hosts))}; bayes-safe serve --allowed-host NAME)")
        if origin is not None and _origin(origin.decode("latin-1")) not in self.allowed_origins:
            return Refusal(403, f"Origin: {origin.decode('latin-1')[:100]!r} is not allowed (requests from web pages "
                                "are refused unless bayes-safe serve --allowed-origin names the page's origin)")
        method, path = scope["method"], scope["path"]
        role = ENDPOINT_ROLES.get((method, path))
        if role is not None and self.tokens is not None:
            refused = self.tokens.check(authorization, role, f"{method} {path}")
            if refused is not None:
                status, detail = refused
                challenge = b'Bearer realm="bayes-safe"' if status == 401 else \
                    b'Bearer realm="bayes-safe", error="insufficient_scope"'
                return Refusal(status, detail, [(b"www-authenticate", challenge)])
        if method == "POST":
            media = (content_type or b"").split(b";", 1)[0].strip().lower()
            if media != b"application/json":
                shown = "none" if content_type is None else repr(content_type.decode("latin-1")[:100])
                return Refusal(415, f"Content-Type: expected application/json, got {shown}")
            if length is not None:
                try:
                    size = int(length)
                except ValueError:
                    return Refusal(400, f"Content-Length: expected a number of bytes, got {length[:40]!r}", close=True)
                if size > self.max_body_bytes:
                    return Refusal(413, f"body: {size} bytes, more than the limit of {self.max_body_bytes} "
                                        "(bayes-safe serve --max-body-bytes)", close=True)
        return None

    def authenticated(self, scope) -> bool:
        """True when the service has no tokens or the request carries one of them (any role)."""
        if self.tokens is None:
            return True
        authorization = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        return self.tokens.roles_of(authorization) is not None

    async def read_body(self, receive) -> bytes | None:
        """The request body, or None when the client went away; a ``Refusal``, the connection closed
        and the rest unread: 413 as soon as it passes ``max_body_bytes``, 408 when it is not all
        there ``read_timeout`` seconds after the first ``receive``, 503 when its bytes would take
        ``bytes_in_flight`` past ``max_bytes_in_flight``."""
        import asyncio

        chunks, size = [], 0
        try:
            async with asyncio.timeout(self.read_timeout):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    chunk = message.get("body", b"")
                    if size + len(chunk) > self.max_body_bytes:
                        raise Refusal(413, f"body: more than the limit of {self.max_body_bytes} bytes (bayes-safe "
                                           "serve --max-body-bytes)", close=True)
                    if self.bytes_in_flight + len(chunk) > self.max_bytes_in_flight:
                        raise Refusal(503, f"busy: the bodies being read hold {self.bytes_in_flight} bytes, the "
                                           f"limit is {self.max_bytes_in_flight} (max_bytes_in_flight); retry later",
                                      [(b"retry-after", b"1")], close=True)
                    size += len(chunk)
                    self.bytes_in_flight += len(chunk)
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        except TimeoutError:
            raise Refusal(408, f"body: not received within {self.read_timeout:g} s ({size} bytes came; the "
                               "service's read_timeout)", close=True) from None
        finally:
            self.bytes_in_flight -= size


class _GateMiddleware:
    """The ``Gate`` in front of the FastAPI app (every path; ``fast_asgi`` checks its own)."""

    def __init__(self, app, gate: Gate):
        self.app, self.gate = app, gate

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            refused = self.gate.refusal(scope)
            if refused is not None:
                await _send(send, *refused.response())
                return
        await self.app(scope, receive, send)


async def _send(send, status: int, headers: list, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# ---------------------------------------------------------------------------------- the app
def schemas() -> dict:
    """The pydantic models of the service's request and response bodies, by name (documentation:
    they make the OpenAPI document; bodies are parsed by ``parse_decide`` / ``parse_feedback``, once,
    with their field-naming messages, not validated against these models again)."""
    global _SCHEMAS
    if _SCHEMAS is None:
        _SCHEMAS = _build_schemas()
    return _SCHEMAS


_SCHEMAS = None


def _build_schemas() -> dict:
    from typing import Any

    from pydantic import BaseModel, ConfigDict, Field

    class DecideRequest(BaseModel):
        """One decision: the candidates' features (or one context, for per-arm policies), the baseline, a mask."""

        model_config = ConfigDict(extra="forbid")
        features: list[list[float]] | list[dict[str, float]] | None = Field(
            None, description="candidate features [K][d], or one {name: value} object per candidate (feature_names)",
            examples=[[[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]])
        context: dict[str, float] | list[float] | None = Field(
            None, description="one context (per-arm policies, or a Decider with featurize); instead of features")
        baseline: int | None = Field(None, description="the baseline's action index (TS-ASC needs it)", examples=[0])
        valid: list[bool] | None = Field(None, description="K booleans: the actions allowed for this decision")

    class Decision(BaseModel):
        """The decision: play ``action``; send its feedback with ``decision_id``."""

        decision_id: str
        action: int = Field(description="the action played (index into the candidates)")
        propensity: float = Field(description="the probability of the action under the posterior that decided")
        propensity_se: float = Field(description="its Monte-Carlo standard error")
        model_version: int = Field(description="feedback batches the posterior had learned from")
        probabilities: list[float] = Field(description="every action's probability (K)")

    class Feedback(BaseModel):
        """The outcome of one decision."""

        model_config = ConfigDict(extra="forbid")
        decision_id: str | int = Field(description="the id /decide returned", examples=["0"])
        reward: float | None = Field(None, description="the reward; left out or null when not known yet (outcomes "
                                     "metric by metric: TS-ASC)", examples=[1.2])
        constraints: list[float | None] | dict[str, float | None] | None = Field(
            None, description="one value per constraint metric the policy learns (in the order of its metric_names; "
            "null for one not known yet), or an object of the ones known by name", examples=[[0.9]])

    class FeedbackAccepted(BaseModel):
        """One feedback: True if applied, False for a duplicate (acknowledged and ignored)."""

        accepted: bool

    class FeedbackListAccepted(BaseModel):
        """A list of feedback, applied all or nothing: per item True if applied, False for a duplicate."""

        accepted: list[bool]
        applied: int
        duplicates: int

    class ItemError(BaseModel):
        index: int = Field(description="the item's position in the list (from 0)")
        decision_id: str | None
        detail: str = Field(description="what is wrong, naming the field")

    class Error(BaseModel):
        """A refused request: 422 for bad input (the message names the field), 404 for an unknown decision id."""

        detail: str = Field(examples=["reward: expected a number, got \"1\""])
        errors: list[ItemError] | None = Field(None, description="for a list of feedback: every bad item")

    class Health(BaseModel):
        """200 ``ok`` or 503 ``degraded`` (``problems`` says why); the counts only for a caller with a
        token, or when the service has no tokens."""

        status: str = Field(description="ok, or degraded (HTTP 503)", examples=["ok"])
        problems: list[str] | None = Field(None, description="when degraded: the log cannot be written, the "
                                                             "snapshot failed or is stale")
        model_version: int | None = None
        decisions: int | None = None
        pending: int | None = None
        queued: int | None = None
        uptime_seconds: float | None = None
        last_snapshot: float | None = None
        snapshot_error: str | None = None
        repairs: int | None = Field(None, description="(a replica) times its posterior did not hold exactly the "
                                                      "log's rows up to its watermark and was rebuilt from the log")
        drift_alarms: dict[str, int] | None = Field(None, description="per metric whose model detects changes "
                                                                      "(adaptive forgetting): the alarms so far")
        provenance: dict[str, Any] | None = Field(None, description="where the served state came from (bayes-safe "
                                                                     "deploy: the study, trial and parameters)")

    class ModelSummary(BaseModel):
        type: str
        mean: list[Any] | None = Field(None, description="the posterior mean of the weights (models that have one)")
        sd: list[Any] | None = Field(None, description="their posterior standard deviations")
        change_points: list[int] | None = Field(None, description="adaptive forgetting: the changes detected (one "
                                                                  "count, or one per arm)")
        observations_since_change: list[int] | None = Field(None, description="adaptive forgetting: observations "
                                                                              "learned since the last change")

    class Posterior(BaseModel):
        model_version: int
        decisions: int
        pending: int
        queued: int
        feature_names: list[str] | None
        provenance: dict[str, Any] | None = Field(None, description="where the served state came from (bayes-safe "
                                                                     "deploy: the study, trial and parameters)")
        models: dict[str, ModelSummary]

    return {m.__name__: m for m in (DecideRequest, Decision, Feedback, FeedbackAccepted, FeedbackListAccepted,
                                     ItemError, Error, Health, ModelSummary, Posterior)}


def create_app(service: Service, snapshot_every: float | None = 60.0, run_on_loop: bool = True, gate: Gate | None = None):
    """The FastAPI app of ``service``: its endpoints, the snapshot schedule and the shutdown snapshot.

    ``gate``: the checks of every request (tokens, Host, Origin, content type, limits; default
    ``Gate()``: no tokens, loopback names, the default limits), in front of every path.

    ``run_on_loop``: decide and apply feedback on the event loop when the Decider's lock is free
    (no hop to a thread and back), on the thread pool when it is held (a snapshot): the default;
    False: always on the thread pool (module docstring: what ``benchmarks/serve.py`` measured)."""
    fastapi = require("fastapi", "bayes-safe serve")
    require("prometheus_client", "GET /metrics of bayes-safe serve")
    # FastAPI evaluates the endpoints' annotations: this module has no `from __future__ import annotations`
    from fastapi import Request
    from fastapi.openapi.utils import get_openapi
    from fastapi.responses import JSONResponse, Response
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
    from starlette.concurrency import run_in_threadpool

    from .metrics import registry

    models = schemas()
    metrics_registry, read_log, close_reader = registry(service)
    gate = Gate() if gate is None else gate
    parse_decide_limited = functools.partial(parse_decide, max_candidates=gate.max_candidates)
    parse_feedback_limited = functools.partial(parse_feedback, max_items=gate.max_feedback_items)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        import asyncio

        async def schedule():
            while True:
                await asyncio.sleep(snapshot_every)
                try:
                    await run_in_threadpool(service.snapshot)
                except Exception as exc:  # noqa: BLE001 - a failed snapshot must not stop the service: the log has it all
                    _log.error("snapshot failed: %s: %s", type(exc).__name__, exc)

        async def sync():
            while True:
                await asyncio.sleep(service.sync_every)
                try:
                    await run_in_threadpool(service.sync)
                except Exception as exc:  # noqa: BLE001 - kept for /health; the next sync reads from the same row
                    _log.error("sync failed: %s: %s", type(exc).__name__, exc)

        tasks = [asyncio.create_task(schedule())] if snapshot_every else []
        if service.replica:
            tasks.append(asyncio.create_task(sync()))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            close_reader()
            if service.committer is not None:  # (replicas) the writes under way finish; the connection closes
                await service.committer.close()
            # uvicorn has finished the in-flight requests: the last snapshot holds every one of them
            try:
                await run_in_threadpool(service.snapshot, True)
            except Exception as exc:  # noqa: BLE001 - kept in service.snapshot_error; serve() raises it after uvicorn
                _log.error("the shutdown snapshot failed: %s: %s", type(exc).__name__, exc)
            else:
                counts = ", ".join(f"{k} {v}" for k, v in service._counts().items())
                _log.info("%s %s (model_version %s, %s)", "wrote" if service._lockfile is not None else
                          "left to the writer", service.state_dir, service.decider.model_version, counts)

    app = fastapi.FastAPI(title="bayes_safe Decider", lifespan=lifespan, version="1",
                          description="Safe Bayesian decisions with propensities; feedback (one or a list); posterior "
                                      "summary; Prometheus metrics with live guardrail estimates.")

    async def _run(parse, run, body: bytes) -> tuple[int, dict]:
        """``(status, answer)`` of ``run(parse(body))``, on the event loop when the Decider is free
        (``run_on_loop``) and the body at most ``OFF_LOOP_BYTES``, else on the thread pool; a
        ``BadRequest`` as its status, any other failure a 500 whose ``detail`` says what failed
        (never a bare 500)."""
        try:
            if len(body) > OFF_LOOP_BYTES:  # a large body: parsed and run on a thread, the loop free meanwhile
                return 200, await run_in_threadpool(_parse_and_run, parse, run, body)
            args = parse(body)
            out = run(args, False) if run_on_loop else None
            if out is None:  # the Decider is busy (a snapshot): wait for it on a thread, not on the loop
                out = await run_in_threadpool(run, args, True)
            elif type(out) is Deferred:  # a replica's list of feedback: written from a thread
                out = await run_in_threadpool(out)
            elif inspect.iscoroutine(out):  # a replica's row: the group commit writes it, the loop free meanwhile
                out = await out
            return 200, out
        except BadRequest as exc:
            return exc.status, exc.body()
        except (RecursionError, OverflowError) as exc:  # (the parsers refuse these first: a backstop)
            return 422, {"detail": f"body: a value out of range or nested too deep ({type(exc).__name__}: {exc})"}
        except Exception as exc:  # noqa: BLE001 - the client gets what failed, in one line
            _log.error("internal error: %s: %s", type(exc).__name__, exc)
            return 500, {"detail": f"internal error: {type(exc).__name__}: {exc}"}

    async def _answer(parse, run, request: Request):
        try:  # (the headers were checked by the gate's middleware)
            data = await gate.read_body(request.receive)
        except Refusal as refused:
            status, headers, content = refused.response()
            return Response(content, status_code=status, headers={k.decode(): v.decode() for k, v in headers[2:]},
                            media_type="application/json")
        if data is None:  # the client went away
            return Response(status_code=499)
        status, out = await _run(parse, run, data)
        return JSONResponse(out, status_code=status)

    async def hot_decide(body: bytes) -> tuple[int, dict]:
        return await _run(parse_decide_limited, service.decide_parsed, body)

    async def hot_feedback(body: bytes) -> tuple[int, dict]:
        return await _run(parse_feedback_limited, service.feedback_parsed, body)

    def ref(name: str) -> dict:
        return {"$ref": f"#/components/schemas/{name}"}

    def body(schema: dict) -> dict:
        return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}

    errors = {422: {"model": models["Error"], "description": "Bad input: the message names the field"},
              401: {"model": models["Error"], "description": "No token, or not one of the service's"},
              403: {"model": models["Error"], "description": "The token lacks the endpoint's role, or a foreign Origin"},
              413: {"model": models["Error"], "description": "Over a limit: the body's bytes, the candidates, the items"},
              415: {"model": models["Error"], "description": "The body is not Content-Type: application/json"},
              503: {"model": models["Error"], "description": "The decision log could not be written: nothing recorded"}}

    # the bodies are parsed by hand (parse_decide / parse_feedback: once, with messages that name the
    # field); the schemas below document them, and responses returned as JSONResponse are not re-validated
    @app.post("/decide", response_model=models["Decision"], responses=errors,
              openapi_extra=body(ref("DecideRequest")), summary="Decide one unit")
    async def decide(request: Request):
        return await _answer(parse_decide_limited, service.decide_parsed, request)

    @app.post("/feedback", response_model=models["FeedbackAccepted"] | models["FeedbackListAccepted"],
              responses=errors | {404: {"model": models["Error"], "description": "Unknown decision id (one object)"}},
              openapi_extra=body({"anyOf": [ref("Feedback"), {"type": "array", "items": ref("Feedback"),
                                                               "minItems": 1}]}),
              summary="The outcome of a decision, or a list of them (all or nothing)")
    async def feedback(request: Request):
        return await _answer(parse_feedback_limited, service.feedback_parsed, request)

    @app.get("/health", response_model=models["Health"],
             responses={503: {"model": models["Health"], "description": "Degraded: problems says why"}})
    async def health(request: Request):
        out = service.health(snapshot_every, detailed=gate.authenticated(request.scope))
        return JSONResponse(out, status_code=200 if out["status"] == "ok" else 503)

    @app.get("/posterior", response_model=models["Posterior"])
    async def posterior():
        return JSONResponse(await run_in_threadpool(service.posterior))

    def scrape() -> bytes:
        read_log()
        return generate_latest(metrics_registry)

    @app.get("/metrics", response_class=Response, summary="Prometheus metrics",
             responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "The Prometheus text format"},
                        503: {"description": "The decision log could not be read (its database is down ...)"}})
    async def metrics():
        try:
            return Response(await run_in_threadpool(scrape), media_type=CONTENT_TYPE_LATEST)
        except service.log_errors as exc:  # a PostgreSQL log's server down: 503, and the next scrape reads again
            _log.error("the decision log could not be read for /metrics: %s: %s", type(exc).__name__, exc)
            return JSONResponse({"detail": f"the decision log could not be read ({client_log_error(exc)}); "
                                           "retry later"}, status_code=503)

    def openapi() -> dict:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            components = doc.setdefault("components", {}).setdefault("schemas", {})
            for name in ("DecideRequest", "Feedback", "ItemError"):
                schema = models[name].model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(schema.pop("$defs", {}))
                components.setdefault(name, schema)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi
    app.add_middleware(_GateMiddleware, gate=gate)
    app.state.gate = gate
    app.state.service = service
    # POST /decide and /feedback without FastAPI's routing and middleware (fast_asgi): the same answers
    app.state.hot = {"/decide": hot_decide, "/feedback": hot_feedback}
    return app


def fast_asgi(app):
    """An ASGI app that answers ``POST /decide`` and ``POST /feedback`` directly (the body read,
    parsed once by hand, the answer encoded once) and hands every other request to ``app`` (the
    FastAPI app of ``create_app``: its routing, the OpenAPI document, /metrics, the lifespan).
    The answers are the FastAPI routes' own (the same functions); only Starlette's request and
    response objects, middleware and routing are skipped, which are most of the HTTP layer's cost
    per request (``benchmarks/serve.py`` measures both)."""
    from starlette.concurrency import run_in_threadpool

    hot = app.state.hot
    gate = app.state.gate
    start = {"type": "http.response.start", "status": 200, "headers": []}
    json_type = (b"content-type", b"application/json")

    async def asgi(scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = hot.get(scope["path"])
            if handler is not None:
                # the gate first (the same checks as the FastAPI app's), the body read up to its limit
                refused = gate.refusal(scope)
                if refused is None:
                    try:
                        data = await gate.read_body(receive)
                    except Refusal as exc:
                        refused = exc
                if refused is not None:
                    await _send(send, *refused.response())
                    return
                if data is None:  # the client went away
                    return
                status, out = await handler(data)
                if len(data) > OFF_LOOP_BYTES:  # a large answer (10,000 items named): encoded on a thread
                    status, body = await run_in_threadpool(_encode, status, out)
                else:
                    status, body = _encode(status, out)
                await send(start | {"status": status, "headers": [json_type, (b"content-length", b"%d" % len(body))]})
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return asgi


def _encode(status: int, out: dict) -> tuple[int, bytes]:
    """``(status, body)`` of an answer in JSON; a non-finite number in it a 500 saying so, not a bare 500."""
    try:
        return status, json.dumps(out, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    except ValueError as exc:
        return 500, json.dumps({"detail": f"internal error: {exc}"}).encode()


def header_deadline_protocol(http: str, seconds: float) -> type:
    """uvicorn's HTTP protocol class for ``http`` (``"auto"``: httptools when installed, else h11)
    with a deadline on the request line and headers: a connection whose next request's headers are
    not complete within ``seconds`` of the connection opening (or of its previous answer) is closed.
    uvicorn has no such timeout of its own: its keep-alive timer restarts at every byte, so a client
    that trickles its headers one byte a second held a connection for ever (issue 40). Once the
    headers are in, the body has ``read_timeout`` of its own (``Gate``)."""
    if http == "auto":
        try:
            import httptools  # noqa: F401

            http = "httptools"
        except ImportError:
            http = "h11"
    if http == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base

    class HeaderDeadline(base):
        _deadline = None

        def _arm(self) -> None:
            self._disarm()
            self._waiting_after = self.cycle  # a new request is a new cycle object
            self._deadline = self.loop.call_later(seconds, self._deadline_passed)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _deadline_passed(self) -> None:
            self._deadline = None
            if self.cycle is self._waiting_after and not self.transport.is_closing():
                self.transport.close()  # the headers never came: nothing to answer (nginx's client_header_timeout)

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._deadline is not None and self.cycle is not self._waiting_after:
                self._disarm()  # the headers are in

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's headers, on a kept-alive connection

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    HeaderDeadline.__name__ = HeaderDeadline.__qualname__ = f"HeaderDeadline{base.__name__}"
    return HeaderDeadline


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one), or a ``ValueError`` naming the option."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ValueError(f"--host: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ValueError(f"--port: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def _is_loopback(host: str) -> bool:
    """True when every address ``host`` resolves to is a loopback address (127.0.0.0/8, ::1)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    try:
        return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%", 1)[0]).is_loopback for info in infos)
    except ValueError:
        return False


def serve(state_dir, *, host: str = "127.0.0.1", port: int = 8080, log=None, snapshot_every: float | None = 60.0,
          http: str = "auto", loop: str = "auto", run_on_loop: bool = True, fast: bool = True,
          token_file=None, allowed_hosts=(), allowed_origins=(), max_body_bytes: int = MAX_BODY_BYTES,
          max_candidates: int = MAX_CANDIDATES, max_feedback_items: int = MAX_FEEDBACK_ITEMS,
          allow_imports: bool = False, replica: bool = False, sync_every: float = SYNC_EVERY,
          read_timeout: float = READ_TIMEOUT, max_bytes_in_flight: int = MAX_BYTES_IN_FLIGHT,
          limit_concurrency: int = LIMIT_CONCURRENCY, timeout_keep_alive: float = TIMEOUT_KEEP_ALIVE) -> int:
    """Serve ``state_dir`` until SIGTERM or SIGINT, then write the snapshot and return 0.

    ``token_file``: the tokens and their roles (``bayes_safe.online.auth``; default: the file the
    environment variable ``BAYES_SAFE_TOKEN_FILE`` names, else no tokens); without tokens only a
    loopback ``host`` is served (a ``ValueError`` naming ``--host`` otherwise). ``allowed_hosts``,
    ``allowed_origins``, the limits, ``read_timeout`` and ``max_bytes_in_flight``: ``Gate``
    (docs/security.md). ``limit_concurrency``: uvicorn answers 503 to a request beyond this many
    connections and tasks; ``timeout_keep_alive``: it closes a connection idle this many seconds
    between requests; with the h11 parser, a request whose headers pass 16 KiB is refused.
    ``allow_imports``: a state whose
    prior is a Python function (``module:function``, a Langevin model's callable Pyro prior) is
    served only with it (``--allow-imports``): loading imports that module and runs its code.

    ``http`` and ``loop`` are uvicorn's HTTP parser (``"httptools"``, ``"h11"``) and event loop
    (``"uvloop"``, ``"asyncio"``); ``"auto"`` takes httptools and uvloop, which the ``serve`` extra
    installs, when they are there. ``run_on_loop``: as in ``create_app``. ``fast``: answer ``POST
    /decide`` and ``/feedback`` through ``fast_asgi`` (the default), or through FastAPI's routing."""
    require("fastapi", "bayes-safe serve")
    uvicorn = require("uvicorn", "bayes-safe serve")
    if snapshot_every is not None and not (math.isfinite(snapshot_every) and snapshot_every > 0):
        raise ValueError(f"--snapshot-every: expected a number of seconds > 0, got {snapshot_every!r}")
    if not (isinstance(sync_every, (int, float)) and math.isfinite(sync_every) and sync_every > 0):
        raise ValueError(f"--sync-every: expected a number of seconds > 0, got {sync_every!r}")
    if http not in ("auto", "h11", "httptools"):
        raise ValueError(f"http: expected 'auto', 'h11' or 'httptools', got {http!r}")
    if loop not in ("auto", "asyncio", "uvloop"):
        raise ValueError(f"loop: expected 'auto', 'asyncio' or 'uvloop', got {loop!r}")
    from .._console import console_logging
    from .auth import ENV_TOKEN_FILE, load_tokens, permission_warning

    console_logging("serve", only_if_unconfigured=True)  # the service owns the process: its lines on the console

    tokens = load_tokens(token_file)  # a malformed file: an error naming the file and the line, before anything
    gate = Gate(tokens, host=host, allowed_hosts=tuple(allowed_hosts), allowed_origins=tuple(allowed_origins),
                max_body_bytes=max_body_bytes, max_candidates=max_candidates, max_feedback_items=max_feedback_items,
                read_timeout=read_timeout, max_bytes_in_flight=max_bytes_in_flight)
    if isinstance(limit_concurrency, bool) or not isinstance(limit_concurrency, int) or limit_concurrency < 1:
        raise ValueError(f"limit_concurrency: expected a positive integer, got {limit_concurrency!r}")
    if isinstance(timeout_keep_alive, bool) or not isinstance(timeout_keep_alive, (int, float)) \
            or not (math.isfinite(timeout_keep_alive) and timeout_keep_alive > 0):
        raise ValueError(f"timeout_keep_alive: expected a number of seconds > 0, got {timeout_keep_alive!r}")
    if tokens is None and not _is_loopback(host):
        raise ValueError(f"--host: {host} is not a loopback address, and the service has no tokens: anyone who can "
                         "reach it could decide, send feedback and read the posterior. Give a token file "
                         f"(--token-file PATH or {ENV_TOKEN_FILE}=PATH; docs/security.md), or serve on 127.0.0.1 "
                         "behind a reverse proxy")
    if tokens is not None:
        warning = permission_warning(token_file if token_file is not None else os.environ.get(ENV_TOKEN_FILE))
        if warning:
            _log.warning("warning: %s", warning)
    import torch

    torch.set_num_threads(1)  # tiny tensor operations per request (bayes_safe.threads)
    service = Service(state_dir, log=log, allow_imports=allow_imports, replica=replica, sync_every=sync_every)
    try:
        sock = _listen(host, port)
        app = create_app(service, snapshot_every, run_on_loop, gate)
        config = uvicorn.Config(fast_asgi(app) if fast else app, log_level="warning", access_log=False, lifespan="on",
                                http=header_deadline_protocol(http, gate.read_timeout), loop=loop,
                                timeout_graceful_shutdown=30,
                                limit_concurrency=limit_concurrency, timeout_keep_alive=timeout_keep_alive,
                                h11_max_incomplete_event_size=16 * 1024)
        server = uvicorn.Server(config)
        bound = sock.getsockname()
        shown = f"[{bound[0]}]" if sock.family == socket.AF_INET6 else bound[0]
        # uvicorn re-raises the signal that stopped it once it is done; a handler of our own makes
        # that harmless, so a SIGTERM / SIGINT ends with the shutdown snapshot and status 0 (one that
        # arrives before uvicorn installs its handlers stops it as soon as it has started)
        def stop(*_):
            server.should_exit = True

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            r = service.recovered
            access = (f"{len(tokens)} token(s) from {tokens.source}" if tokens is not None else
                      "no tokens: every endpoint open to local clients")
            if service.replica:
                d = service.decider
                learned = (f"a replica: posterior at log row {d.log_seq} ({d.applied} feedback), syncs every "
                           f"{service.sync_every:g} s, {'writes' if service._lockfile is not None else 'does not write'}"
                           " the snapshots")
            else:
                learned = f"recovered {r['decisions']} decisions and {r['feedback']} feedback from the log"
            # through logging (the bayes_safe logger); a caller that configured none still sees the line,
            # "bayes-safe serve: listening on ...", on stdout as the command line prints it
            from .._console import console_logging

            console_logging("serve", only_if_unconfigured=True)
            _log.info(f"listening on http://{shown}:{bound[1]} (state {service.state_dir}, log {service.log.path}, "
                      f"{learned}; {access}; Host names {', '.join(sorted(gate.allowed_hosts))})")
            # the objects loaded so far (torch, pyro, the Decider: some 370,000) live as long as the
            # process: out of the collector's sight, so that a full collection, which a request that
            # allocates much can trigger, scans the new objects only (issue 40: 200 ms with the event
            # loop and every thread stopped, against 9 ms frozen)
            gc.collect()
            gc.freeze()
            server.run(sockets=[sock])
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            sock.close()
    finally:
        service.close()
    if not server.started:
        raise RuntimeError("the server did not start (see the messages above)")
    if service.snapshot_error is not None:  # the shutdown snapshot failed (a full disk ...): the log still has it all
        raise service.snapshot_error
    return 0
