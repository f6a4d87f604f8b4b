"""The HTTP service: a saved ``Decider`` behind FastAPI, snapshotted, crash-safe through its log.

    bayes-safe serve STATE_DIR [--host 127.0.0.1] [--port 8080] [--log PATH] [--snapshot-every SECONDS]

``STATE_DIR`` is a directory written by ``Decider.save``. Endpoints (JSON in, JSON out):

* ``POST /decide``: ``{"features": [[...], ...]}`` (candidate features ``[K][d]``, or a list of
  ``{name: value}`` dicts, one per candidate) or ``{"context": {name: value}}`` (one context, for
  per-arm policies), with optional ``"baseline"`` (an action index) and ``"valid"`` (``K``
  booleans) -> the ``Decision`` (``decision_id``, ``action``, ``propensity``, ``propensity_se``,
  ``model_version``, ``probabilities``);
* ``POST /feedback``: ``{"decision_id": ..., "reward": ..., "constraints": [...]}`` ->
  ``{"accepted": true}``, or ``false`` for a duplicate (ignored); an unknown id is a 404;
* ``GET /health``: ``{"status": "ok", ...}``;
* ``GET /posterior``: ``model_version``, ``decisions``, ``pending``, ``queued`` and, per model
  role, the posterior ``mean`` and ``sd`` of models that have them.

Bad input is a 422 whose ``detail`` names the field (``reward: expected a finite number ...``).

**Concurrency.** Every use of the ``Decider`` (decide, feedback, the posterior summary, a
snapshot) holds one lock, so they run one at a time and a snapshot never sees a half-applied
feedback. Decisions and feedback run on the thread pool. (``serve(run_on_loop=True)`` runs them
on the event loop when the lock is free: less CPU per request, but in ``benchmarks/serve.py`` on
the shared 2-core machine it had the worse p99 in most runs, e.g. 24 against 16 ms at load
average 5.5, and a third to a half of the throughput when driven by ``httpx.AsyncClient``, so it
is not the default.) JSON parsing and validation run outside the lock. uvicorn runs with
httptools and uvloop when installed (the ``serve`` extra installs them). The propensity draws
are most of a decision's cost: with ``Decider(num_draws=200)``, the default, the server spent
1.6 ms of CPU per decision (and half a feedback) against 2.1 ms with 1000 draws, and served 459
against 338 decisions/s in the same run (``benchmarks/serve.py`` measures each of these choices).

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
snapshot replaces ``STATE_DIR`` as a whole). Nothing read from either executes code.
"""

import contextlib
import json
import math
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from .._extras import require

__all__ = ["BadRequest", "Service", "create_app", "default_log_path", "recover", "serve"]


class BadRequest(ValueError):
    """Input a client must fix; ``status`` 422 (or 404 for an unknown decision)."""

    def __init__(self, message: str, status: int = 422):
        super().__init__(message)
        self.status = status


def default_log_path(state_dir) -> Path:
    """``STATE_DIR.log.sqlite``, beside the state directory."""
    state_dir = Path(state_dir).resolve()
    return state_dir.with_name(state_dir.name + ".log.sqlite")


# ---------------------------------------------------------------------------------- recovery
def recover(decider) -> dict:
    """Bring a ``Decider`` loaded from a snapshot up to date with its log: ``decider.replay()``
    (which checks first that the log is the snapshot's); returns the counts it applied."""
    if decider.log is None or not Path(decider.log.path).exists():
        return {"decisions": 0, "feedback": 0}
    return decider.replay()


# ---------------------------------------------------------------------------------- validation
def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _object(body: bytes, allowed: tuple[str, ...]) -> dict:
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"body: not JSON ({exc})") from None
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
            raise BadRequest(f"{what}[{j}]: expected a number, got {json.dumps(v)[:60]}")
    return row


def parse_decide(body: bytes) -> dict:
    """The arguments of ``Decider.decide`` from a ``/decide`` body (``BadRequest`` on bad input)."""
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
                    raise BadRequest(f"context[{k!r}]: expected a number, got {json.dumps(v)[:60]}")
    else:
        field, value = "features", payload["features"]
        if not isinstance(value, list) or not value:
            raise BadRequest(f"features: expected a non-empty list (one entry per candidate action), got "
                             f"{json.dumps(value)[:60]}")
        if all(isinstance(r, dict) for r in value):
            for i, r in enumerate(value):
                for k, v in r.items():
                    if not _is_number(v):
                        raise BadRequest(f"features[{i}][{k!r}]: expected a number, got {json.dumps(v)[:60]}")
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


def parse_feedback(body: bytes) -> dict:
    """The arguments of ``Decider.feedback`` from a ``/feedback`` body (``BadRequest`` on bad input)."""
    payload = _object(body, ("decision_id", "reward", "constraints"))
    for key in ("decision_id", "reward"):
        if key not in payload:
            raise BadRequest(f"{key}: required")
    decision_id = payload["decision_id"]
    if isinstance(decision_id, bool) or not isinstance(decision_id, (str, int)):
        raise BadRequest(f"decision_id: expected the id /decide returned (a string), got {json.dumps(decision_id)[:60]}")
    reward = payload["reward"]
    if not _is_number(reward):
        raise BadRequest(f"reward: expected a number, got {json.dumps(reward)[:60]}")
    constraints = payload.get("constraints")
    if constraints is not None:
        _numbers(constraints, "constraints")
    return {"decision_id": str(decision_id), "reward": reward, "constraints": constraints}


# ---------------------------------------------------------------------------------- the service
class Service:
    """A ``Decider`` loaded from ``state_dir`` and brought up to date with its log, behind one lock.

    Args:
        state_dir: a directory written by ``Decider.save``; snapshots replace it.
        log: the ``DecisionLog`` file (default ``default_log_path(state_dir)``); must be outside ``state_dir``.
    """

    def __init__(self, state_dir, log=None):
        from .decider import Decider
        from .log import DecisionLog

        self.state_dir = Path(state_dir)
        if not self.state_dir.is_dir():
            raise FileNotFoundError(f"STATE_DIR: {self.state_dir} is not a directory (expected one written by Decider.save)")
        log_path = Path(log) if log is not None else default_log_path(self.state_dir)
        if log_path.resolve().is_relative_to(self.state_dir.resolve()):
            raise ValueError(f"--log: {log_path} is inside STATE_DIR, which each snapshot replaces as a whole; "
                             "put the log beside it")
        self.lock = threading.Lock()
        self.started = time.time()
        self.last_snapshot: float | None = None
        self.snapshot_error: Exception | None = None  # of the last snapshot; None once one succeeds
        # the bookkeeping at the last snapshot: next_id and next_id - pending (the feedback count) only
        # grow, so any decision or feedback changes it
        self._saved = None
        self.decider = Decider.load(self.state_dir)  # first: a bad STATE_DIR creates no log file
        try:
            self.log = DecisionLog(log_path)
        except ValueError as exc:
            raise ValueError(f"--log: {exc}") from None
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
        return d.next_id, d.model_version, len(d.pending), len(d.queued)

    # ------------------------------------------------------------------ endpoints
    def decide(self, body: bytes) -> dict:
        """``/decide``: the decision of a request body (``BadRequest`` on bad input)."""
        return self.decide_parsed(parse_decide(body))

    def decide_parsed(self, args: dict, blocking: bool = True) -> dict | None:
        """The decision of ``parse_decide``'s arguments; None, and nothing done, when ``blocking``
        is False and the Decider is busy (a snapshot, another request on a thread)."""
        if not self.lock.acquire(blocking):
            return None
        try:
            decision = self.decider.decide(args["features"], baseline=args["baseline"], valid=args["valid"])
        except (ValueError, TypeError) as exc:
            message = str(exc)
            if args["field"] == "context" and message.startswith("features"):
                message = "context" + message[len("features"):]
            raise BadRequest(message) from None
        finally:
            self.lock.release()
        return {"decision_id": decision.decision_id, "action": decision.action, "propensity": decision.propensity,
                "propensity_se": decision.propensity_se, "model_version": decision.model_version,
                "probabilities": list(decision.probabilities)}  # Decision.to_dict without asdict's deep copy

    def feedback(self, body: bytes) -> dict:
        """``/feedback``: ``{"accepted": bool}`` of a request body (``BadRequest`` on bad input, 404 for an unknown id)."""
        return self.feedback_parsed(parse_feedback(body))

    def feedback_parsed(self, args: dict, blocking: bool = True) -> dict | None:
        """``feedback`` of ``parse_feedback``'s arguments; None when not ``blocking`` and busy (as ``decide_parsed``)."""
        if not self.lock.acquire(blocking):
            return None
        try:
            accepted = self.decider.feedback(args["decision_id"], args["reward"], args["constraints"])
        except (ValueError, TypeError) as exc:
            message = str(exc)
            raise BadRequest(message, status=404 if message.startswith("decision_id: unknown") else 422) from None
        finally:
            self.lock.release()
        return {"accepted": accepted}

    def health(self) -> dict:
        d = self.decider
        return {"status": "ok", "model_version": d.model_version, "decisions": d.next_id, "pending": len(d.pending),
                "queued": len(d.queued), "uptime_seconds": time.time() - self.started,
                "last_snapshot": self.last_snapshot,
                "snapshot_error": None if self.snapshot_error is None else str(self.snapshot_error)}

    def posterior(self) -> dict:
        with self.lock:
            d = self.decider
            out = {"model_version": d.model_version, "decisions": d.next_id, "pending": len(d.pending),
                   "queued": len(d.queued), "feature_names": d.feature_names, "models": {}}
            for role, model in d.policy.models().items():
                out["models"][str(role)] = _summary(model)
        return out

    # ------------------------------------------------------------------ state
    def snapshot(self, force: bool = False) -> bool:
        """Save the Decider to ``state_dir`` (atomic) if it changed since the last snapshot; True if written."""
        with self.lock:
            mark = self._mark()
            if mark == self._saved and not force:
                return False
            try:
                self.decider.save(self.state_dir)
            except Exception as exc:
                self.snapshot_error = exc
                raise
            self._saved, self.last_snapshot, self.snapshot_error = mark, time.time(), None
            return True

    def close(self) -> None:
        self.log.close()


def _summary(model) -> dict:
    """``{"type", "mean", "sd"}`` of a model with ``posterior_mean`` / ``posterior_covariance``
    (the batch dimension of one dropped), ``{"type"}`` otherwise."""
    out = {"type": type(model).__name__}
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


# ---------------------------------------------------------------------------------- the app
def create_app(service: Service, snapshot_every: float | None = 60.0, run_on_loop: bool = False):
    """The FastAPI app of ``service``: its endpoints, the snapshot schedule and the shutdown snapshot.

    ``run_on_loop``: decide and apply feedback on the event loop when the Decider's lock is free
    (no hop to a thread and back), on the thread pool when it is held (a snapshot); False (the
    default): always on the thread pool (module docstring: what ``benchmarks/serve.py`` measured)."""
    fastapi = require("fastapi", "bayes-safe serve")
    # FastAPI evaluates the endpoints' annotations: this module has no `from __future__ import annotations`
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool

    @contextlib.asynccontextmanager
    async def lifespan(app):
        import asyncio

        async def schedule():
            while True:
                await asyncio.sleep(snapshot_every)
                try:
                    await run_in_threadpool(service.snapshot)
                except Exception as exc:  # noqa: BLE001 - a failed snapshot must not stop the service: the log has it all
                    print(f"bayes-safe serve: snapshot failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

        task = asyncio.create_task(schedule()) if snapshot_every else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            # uvicorn has finished the in-flight requests: the last snapshot holds every one of them
            try:
                await run_in_threadpool(service.snapshot, True)
            except Exception as exc:  # noqa: BLE001 - kept in service.snapshot_error; serve() raises it after uvicorn
                print(f"bayes-safe serve: the shutdown snapshot failed: {type(exc).__name__}: {exc}", file=sys.stderr,
                      flush=True)
            else:
                d = service.decider
                print(f"bayes-safe serve: wrote {service.state_dir} (model_version {d.model_version}, decisions "
                      f"{d.next_id}, pending {len(d.pending)})", flush=True)

    app = fastapi.FastAPI(title="bayes_safe Decider", lifespan=lifespan,
                          description="Safe Bayesian decisions with propensities; feedback; posterior summary.")

    def _error(exc: BadRequest):
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    async def _answer(parse, run, request: Request):
        """``run(parse(body))``, on the event loop when the Decider is free (``run_on_loop``), else
        on the thread pool; a ``BadRequest`` as its status."""
        body = await request.body()
        try:
            args = parse(body)
            out = run(args, False) if run_on_loop else None
            if out is None:  # the Decider is busy (a snapshot): wait for it on a thread, not on the loop
                out = await run_in_threadpool(run, args, True)
            return JSONResponse(out)
        except BadRequest as exc:
            return _error(exc)

    @app.post("/decide")
    async def decide(request: Request):
        return await _answer(parse_decide, service.decide_parsed, request)

    @app.post("/feedback")
    async def feedback(request: Request):
        return await _answer(parse_feedback, service.feedback_parsed, request)

    @app.get("/health")
    async def health():
        return JSONResponse(service.health())

    @app.get("/posterior")
    async def posterior():
        return JSONResponse(await run_in_threadpool(service.posterior))

    return app


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


def serve(state_dir, *, host: str = "127.0.0.1", port: int = 8080, log=None, snapshot_every: float | None = 60.0,
          http: str = "auto", loop: str = "auto", run_on_loop: bool = False) -> int:
    """Serve ``state_dir`` until SIGTERM or SIGINT, then write the snapshot and return 0.

    ``http`` and ``loop`` are uvicorn's HTTP parser (``"httptools"``, ``"h11"``) and event loop
    (``"uvloop"``, ``"asyncio"``); ``"auto"`` takes httptools and uvloop, which the ``serve`` extra
    installs, when they are there. ``run_on_loop``: as in ``create_app``."""
    require("fastapi", "bayes-safe serve")
    uvicorn = require("uvicorn", "bayes-safe serve")
    if snapshot_every is not None and not (math.isfinite(snapshot_every) and snapshot_every > 0):
        raise ValueError(f"--snapshot-every: expected a number of seconds > 0, got {snapshot_every!r}")
    if http not in ("auto", "h11", "httptools"):
        raise ValueError(f"http: expected 'auto', 'h11' or 'httptools', got {http!r}")
    if loop not in ("auto", "asyncio", "uvloop"):
        raise ValueError(f"loop: expected 'auto', 'asyncio' or 'uvloop', got {loop!r}")
    import torch

    torch.set_num_threads(1)  # tiny tensor operations per request (bayes_safe.threads)
    service = Service(state_dir, log=log)
    try:
        sock = _listen(host, port)
        app = create_app(service, snapshot_every, run_on_loop)
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", http=http, loop=loop,
                                timeout_graceful_shutdown=30)
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
            print(f"bayes-safe serve: listening on http://{shown}:{bound[1]} (state {service.state_dir}, log "
                  f"{service.log.path}, recovered {r['decisions']} decisions and {r['feedback']} feedback from the log)",
                  flush=True)
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
