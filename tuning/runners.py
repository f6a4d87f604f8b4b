"""Where trials run: a pool of local processes, a Dask distributed cluster, or inline.

Every runner takes the same three things per trial: the A/B test (serialized once with
``cloudpickle``, so user problems and policy factories defined anywhere, even lambdas, travel),
the parameters and the trial's seed; the worker runs ``ABTest.timed_evaluate`` and returns
``{"metrics", "sim_seconds", "worker"}``. A trial is a pure function of ``(parameters, seed)``,
so where it runs does not change its numbers.

* ``LocalRunner``: ``k`` worker processes (``multiprocessing`` *spawn* context: a fresh
  interpreter, nothing inherited from the study process's Ax/SQLAlchemy/torch state), each
  with one torch thread. Workers are reused, so per-process caches (the video-upload warm-start
  model) are built once per worker. A worker that dies (segfault, OOM kill) fails the trials
  it held and the pool is rebuilt.
* **Workers never outlive the study process.** Each worker ignores SIGINT (a Ctrl-C in the
  terminal reaches the whole process group: the study process stops the workers itself) and
  dies with its parent: on Linux the kernel sends it SIGKILL when the study process dies
  (``prctl(PR_SET_PDEATHSIG)``, set in the worker initializer; the worker exits at once if
  its parent is already gone), and a daemon watchdog thread polls the parent pid every 0.5 s
  as a fallback (other systems, or a parent replaced in between). The ``multiprocessing``
  resource tracker needs nothing: it exits when the last process holding its pipe (the study
  process and the workers) is gone. Measured (tests/test_tuning_signals.py): after SIGKILL of
  the study process, its workers and resource tracker are gone within a second.
* ``DaskRunner``: trials are Dask tasks on the scheduler at ``address``
  (``tcp://host:8786``); the workers need the same Python environment (this package
  importable). Measured on this project's 2-core machine: a local Dask cluster starts in
  about 1.3 s (Ray: 5 s and 1 GiB), so Dask is the light choice. Losing the scheduler
  (the client cancels every future with reason ``scheduler-connection-lost`` within about
  0.5 s) raises ``InfrastructureLost`` from ``wait`` / ``result`` / ``submit``: the study
  stops and its trials in flight are re-run on resume instead of being recorded as failed.
* ``InlineRunner``: in the calling process, one at a time (debugging, tests).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import ctypes
import hashlib
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time

__all__ = ["DaskRunner", "InfrastructureLost", "InlineRunner", "LocalRunner", "Runner", "evaluate_payload",
           "make_runner"]

#: ``prctl`` option: the signal a process receives when its parent dies (linux/prctl.h)
PR_SET_PDEATHSIG = 1
#: seconds between two checks of the watchdog thread on the parent pid
WATCHDOG_INTERVAL = 0.5


class InfrastructureLost(Exception):
    """Where the trials run is gone (the Dask scheduler): not a failure of any trial."""

_PAYLOAD_CACHE: dict[str, object] = {}


def evaluate_payload(payload: bytes, parameters: dict, seed: int) -> dict:
    """Worker entry point: unpickle the A/B test (cached per process) and run one trial."""
    import cloudpickle

    key = hashlib.sha1(payload).hexdigest()
    ab_test = _PAYLOAD_CACHE.get(key)
    if ab_test is None:
        ab_test = cloudpickle.loads(payload)
        _PAYLOAD_CACHE.clear()
        _PAYLOAD_CACHE[key] = ab_test
    out = ab_test.timed_evaluate(parameters, seed)
    out["worker"] = f"{socket.gethostname()}:{os.getpid()}"
    return out


def _die_with_parent(parent_pid: int) -> None:
    """End this process when ``parent_pid`` (its parent) dies: the kernel's parent-death signal
    on Linux, and a watchdog thread on the parent pid everywhere."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):  # no libc / prctl: the watchdog alone
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(WATCHDOG_INTERVAL)
            if os.getppid() != parent_pid:
                os.kill(os.getpid(), signal.SIGKILL)  # no atexit handlers, no waiting for a trial

    threading.Thread(target=watch, name="bayes-safe-parent-watchdog", daemon=True).start()


def _init_worker(parent_pid: int | None = None) -> None:
    if parent_pid is not None:
        # Ctrl-C reaches the whole foreground process group: the study process handles it
        # (marks the trials abandoned, stops the workers); a worker must not fail its trial first
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _die_with_parent(parent_pid)
    import torch

    torch.set_num_threads(1)


class Runner:
    """Submit trials, wait for some to finish, fetch results (which raise the trial's error)."""

    description = "runner"

    def submit(self, payload: bytes, parameters: dict, seed: int):
        raise NotImplementedError

    def wait(self, handles: list, timeout: float | None = None) -> list:
        """Block until at least one of ``handles`` is done (or ``timeout``); return the done ones."""
        raise NotImplementedError

    def result(self, handle) -> dict:
        return handle.result()

    def cancel(self, handle) -> None:
        handle.cancel()

    def close(self, force: bool = False) -> None:
        """Release the workers; ``force``: do not wait for running trials (they are abandoned)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class InlineRunner(Runner):
    """Run each trial in this process when it is submitted."""

    description = "inline (this process)"

    def submit(self, payload, parameters, seed):
        fut: cf.Future = cf.Future()
        try:
            fut.set_result(evaluate_payload(payload, parameters, seed))
        except Exception as exc:  # noqa: BLE001 - reported as the trial's failure
            fut.set_exception(exc)
        return fut

    def wait(self, handles, timeout=None):
        return [h for h in handles if h.done()]


class LocalRunner(Runner):
    """A pool of ``processes`` worker processes on this machine."""

    def __init__(self, processes: int):
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
            raise ValueError(f"parallel: expected a positive number of processes, got {processes!r}")
        self.processes = processes
        self.description = f"{processes} local process{'es' if processes > 1 else ''}"
        self._pool: cf.ProcessPoolExecutor | None = None

    def _executor(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(max_workers=self.processes, mp_context=multiprocessing.get_context("spawn"),
                                                initializer=_init_worker, initargs=(os.getpid(),))
        return self._pool

    def submit(self, payload, parameters, seed):
        try:
            return self._executor().submit(evaluate_payload, payload, parameters, seed)
        except cf.process.BrokenProcessPool:
            self._rebuild()
            return self._executor().submit(evaluate_payload, payload, parameters, seed)

    def wait(self, handles, timeout=None):
        done, _ = cf.wait(handles, timeout=timeout, return_when=cf.FIRST_COMPLETED)
        if any(isinstance(h.exception(), cf.process.BrokenProcessPool) for h in done if not h.cancelled()):
            self._rebuild()
        return list(done)

    def _rebuild(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None

    def close(self, force: bool = False) -> None:
        if self._pool is None:
            return
        pool, self._pool = self._pool, None
        procs = list((getattr(pool, "_processes", None) or {}).values())
        if force:
            # the worker processes this runner started: stop them rather than wait for their trials
            for proc in procs:
                with contextlib.suppress(Exception):
                    proc.kill()
        pool.shutdown(wait=not force, cancel_futures=True)
        if force:
            for proc in procs:  # reap them (SIGKILL: a fraction of a second)
                with contextlib.suppress(Exception):
                    proc.join(timeout=2)


class DaskRunner(Runner):
    """Trials as tasks on a Dask distributed scheduler at ``address``."""

    def __init__(self, address: str, timeout: float = 20.0):
        from bayes_safe._extras import require

        distributed = require("distributed", "--scheduler (trials on a Dask cluster)")
        self.address = str(address)
        try:
            self.client = distributed.Client(self.address, timeout=f"{timeout}s", set_as_default=False)
        except Exception as exc:
            raise ValueError(f"--scheduler: cannot connect to the Dask scheduler at {self.address!r}: "
                             f"{type(exc).__name__}: {exc}") from exc
        workers = len(self.client.scheduler_info().get("workers", {}))
        self.description = f"Dask scheduler {self.address} ({workers} worker{'s' if workers != 1 else ''})"
        self._count = 0
        self._closed = False
        self._lost: str | None = None

    def _check_connected(self, exc: BaseException | None = None) -> None:
        """Raise ``InfrastructureLost`` once the client has lost its scheduler."""
        reason = getattr(exc, "reason", None)
        if self._lost is None and (self.client.status != "running" or reason == "scheduler-connection-lost"):
            self._lost = f"lost the Dask scheduler at {self.address} (client {self.client.status}" + (
                f", {reason}" if reason else "") + ")"
        if self._lost is not None:
            raise InfrastructureLost(self._lost) from exc

    def submit(self, payload, parameters, seed):
        self._check_connected()
        self._count += 1
        key = f"bayes-safe-trial-{os.getpid()}-{time.time_ns()}-{self._count}"
        return self.client.submit(evaluate_payload, payload, dict(parameters), int(seed), key=key, pure=False)

    def wait(self, handles, timeout=None):
        # ``distributed.wait`` needs a default client; this runner's client is not made the default
        # (so it never captures a user's own Dask computations): poll the futures instead.
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            done = [h for h in handles if h.done()]
            if done or (deadline is not None and time.monotonic() >= deadline):
                return done
            self._check_connected()
            time.sleep(0.05)

    def result(self, handle) -> dict:
        try:
            return handle.result()
        except cf.CancelledError as exc:  # distributed's FutureCancelledError: the scheduler went away?
            self._check_connected(exc)
            raise

    def close(self, force: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        # after losing the scheduler the client logs its failed reconnection as an error traceback
        log = logging.getLogger("distributed.client")
        level = log.level
        if self._lost is not None:
            log.setLevel(logging.CRITICAL)
        try:
            with contextlib.suppress(Exception):
                self.client.close(timeout=5 if self._lost is None else 2)
        finally:
            log.setLevel(level)


def make_runner(parallel: int = 1, scheduler: str | None = None, inline: bool = False) -> Runner:
    """``scheduler`` -> ``DaskRunner``; ``inline`` -> ``InlineRunner``; else ``LocalRunner``."""
    if scheduler:
        return DaskRunner(scheduler)
    if inline:
        return InlineRunner()
    return LocalRunner(parallel)
