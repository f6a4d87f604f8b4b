"""Replicas of ``bayes-safe serve`` on one PostgreSQL log against one process on SQLite (issue 29).

    python benchmarks/replicas.py [--quick]

Starts its own PostgreSQL server (``tests/postgres.py``: Debian's ``postgresql`` package, ``make
postgres``; ``initdb`` into a temporary directory, 127.0.0.1, a free port, ``fsync=off`` as in
the tests: the figures are the service's, not the disk's). The Decider is ``benchmarks/serve.py``'s:
conjugate TS-ASC with one constraint, d = 4, 5 candidates, 200 propensity draws. Configurations,
each a fresh state and log, measured in one run and interleaved (round ``r`` drives every
configuration in turn, so a change of the machine's load hits all alike):

* ``1 process, SQLite``: ``bayes-safe serve`` as it ships, the reference;
* ``1 / 2 / 4 replicas, PostgreSQL``: ``serve --replica --sync-every 1`` processes on one
  database of that server.

The driver (this process) runs 4 keep-alive connections spread round-robin over the replicas,
each looping ``POST /decide`` and, for every other decision, ``POST /feedback`` sent to a random
replica (feedback for a decision another replica made is the normal case). Rates are decisions/s
over all replicas; latency is the client's wall time per ``/decide``. Everything (the driver, the
replicas, PostgreSQL) shares the machine's cores, so ``per core`` divides the rate by the cores
the replicas could use (``min(replicas, cores)``) and more replicas than cores cannot add
throughput here: on this 2-core machine the figures show the cost of the log and of syncing,
not the scaling a replica per core would give.

After the rounds: **the largest difference** between the replicas' posteriors (``/posterior``:
every model's mean and sd) once each has synced to the log's last feedback row, and against the
one-process posterior of that feedback (the prior updated once with every logged row in the log's
order); **feedback to every replica**: the time from an acknowledged ``POST /feedback`` at one
replica until every replica's ``/posterior`` reports a watermark at or past its row (median and
largest of several, with ``--sync-every 1``: expected about half a sync interval to one).

Target (issue 29): one replica on PostgreSQL at least 0.7x one process on SQLite; replicas'
posteriors equal to 1e-10 after the sync interval.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from serve import _cpu_seconds, _RawConnection, decide_and_feed, make_state, start_server

TARGET_RATIO = 0.7
SYNC_EVERY = 1.0
#: (label, replicas, backend)
CONFIGS = [("1 process, SQLite (reference)", 1, "sqlite"), ("1 replica, PostgreSQL", 1, "postgresql"),
           ("2 replicas, PostgreSQL", 2, "postgresql"), ("4 replicas, PostgreSQL", 4, "postgresql")]


async def _drive(urls: list[str], seconds: float, workers: int = 4, seed: int = 0) -> list[float]:
    """``workers`` connections over ``urls`` (round-robin): decide, and feedback to a random replica."""
    latencies: list[float] = []
    stop = time.perf_counter() + seconds
    deciders = [await _RawConnection(urls[i % len(urls)]).open() for i in range(workers)]
    # one feedback connection per worker and replica
    feeders = [[await _RawConnection(u).open() for u in urls] for _ in range(workers)]

    async def loop(i: int):
        await decide_and_feed(deciders[i].post, lambda rng: feeders[i][int(rng.integers(len(urls)))].post,
                              np.random.default_rng(seed + i), stop, latencies)

    try:
        await asyncio.gather(*(loop(i) for i in range(workers)))
    finally:
        for c in [*deciders, *(c for row in feeders for c in row)]:
            c.close()
    return latencies


def _get(url: str, path: str) -> dict:
    import httpx

    return httpx.get(url + path, timeout=30).json()


def _synced(urls: list[str], row: int, timeout: float = 60.0) -> list[dict]:
    """Every replica's ``/posterior`` once its watermark is at or past ``row``."""
    deadline = time.time() + timeout
    while True:
        answers = [_get(u, "/posterior") for u in urls]
        if all(a["log_seq"] >= row for a in answers):
            return answers
        if time.time() > deadline:
            raise RuntimeError(f"replicas did not reach row {row}: {[a['log_seq'] for a in answers]}")
        time.sleep(0.005)


def _reference(log_url: str) -> dict:
    """Per role, mean and sd of ``make_state``'s prior updated with every logged feedback in log order."""
    import pyro.distributions as dist
    import torch

    from bayes_safe import TSASC, BayesianLinear
    from bayes_safe.online import DecisionLog

    def model():
        return BayesianLinear(dist.Normal(torch.zeros(4, dtype=torch.float64), 1.0).to_event(1), noise_std=0.5,
                              batch_shape=[1])

    policy = TSASC(model(), [model()], alpha=0.1)
    log = DecisionLog(log_url, read_only=True)
    for _, _, y, c, a, K, ctx in log.feedback_since(0, 10_000_000):
        x = torch.tensor(ctx, dtype=torch.float64).reshape(1, K, -1)[:, a]
        policy.update(x, torch.tensor([y], dtype=torch.float64), torch.tensor([c], dtype=torch.float64),
                      actions=torch.tensor([a]))
    log.close()
    return {role: (m.posterior_mean.numpy().ravel(), m.posterior_covariance.diagonal(dim1=-2, dim2=-1).sqrt().numpy().ravel())
            for role, m in policy.models().items()}


def _differences(answers: list[dict], reference: dict) -> tuple[float, float]:
    """(largest difference between replicas, largest against the one-process reference)."""
    between = against = 0.0
    for role, (mean, sd) in reference.items():
        for a in answers:
            m, s = np.array(a["models"][role]["mean"]).ravel(), np.array(a["models"][role]["sd"]).ravel()
            against = max(against, float(np.max(np.abs(m - mean))), float(np.max(np.abs(s - sd))))
            m0 = np.array(answers[0]["models"][role]["mean"]).ravel()
            between = max(between, float(np.max(np.abs(m - m0))))
    return between, against


def _propagation(urls: list[str], log_url: str, repeats: int) -> list[float]:
    """Seconds from an acknowledged feedback at one replica to every replica's watermark past its row."""
    import httpx

    from bayes_safe.online import DecisionLog

    log = DecisionLog(log_url, read_only=True)
    out = []
    rng = random.Random(0)
    try:
        for i in range(repeats):
            d = httpx.post(urls[i % len(urls)] + "/decide", json={"features": np.eye(5, 4).tolist(), "baseline": 0},
                           timeout=30).json()
            time.sleep(rng.uniform(0, SYNC_EVERY))  # feedback at a random point of the sync cycle
            t0 = time.perf_counter()
            answer = httpx.post(urls[(i + 1) % len(urls)] + "/feedback", timeout=30,
                                json={"decision_id": d["decision_id"], "reward": 0.1, "constraints": [0.0]}).json()
            assert answer == {"accepted": True}, answer
            _synced(urls, log.feedback_high())
            out.append(time.perf_counter() - t0)
    finally:
        log.close()
    return out


def run(quick: bool = False) -> list[dict]:
    from postgres import PostgresServer

    rounds, seconds = (2, 2.0) if quick else (3, 5.0)
    cores = os.cpu_count() or 1
    results = {label: [] for label, _, _ in CONFIGS}
    server = PostgresServer()
    server.start()
    procs = []
    try:
        with tempfile.TemporaryDirectory(prefix="replicas_bench_") as tmp:
            setups = {}
            for i, (label, n, backend) in enumerate(CONFIGS):
                state = make_state(Path(tmp) / f"state{i}", num_draws=200)
                if backend == "sqlite":
                    proc, url = start_server(state)
                    procs.append(proc)
                    setups[label] = ([url], [proc], None)
                    continue
                log_url = server.url(f"bench{i}")
                pairs = [start_server(state, log=log_url, replica=True, sync_every=SYNC_EVERY) for _ in range(n)]
                procs += [p for p, _ in pairs]
                setups[label] = ([u for _, u in pairs], [p for p, _ in pairs], log_url)
            for urls, _, _ in setups.values():
                asyncio.run(_drive(urls, 1.0))  # warm-up
            for r in range(rounds):
                for label, (urls, ps, _) in setups.items():
                    cpu0 = [_cpu_seconds(p.pid) for p in ps]
                    t0 = time.perf_counter()
                    lat = asyncio.run(_drive(urls, seconds, seed=100 * r))
                    wall = time.perf_counter() - t0
                    cpu = sum(_cpu_seconds(p.pid) - c for p, c in zip(ps, cpu0))
                    lat_ms = np.array(lat) * 1000
                    results[label].append({"rate": len(lat) / wall, "p99": float(np.percentile(lat_ms, 99)),
                                           "load": os.getloadavg()[0], "cpu_ms": cpu / len(lat) * 1000})
            rows = []
            reference_rate = statistics.median(r["rate"] for r in results[CONFIGS[0][0]])
            for label, n, backend in CONFIGS:
                runs = results[label]
                med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                load = round(med["load"], 2)
                ratio = med["rate"] / reference_rate
                rows += [
                    {"benchmark": f"{label}: throughput", "value": med["rate"], "unit": "decisions/s", "load_avg": load,
                     "vs ref": ratio, "target": f">= {TARGET_RATIO}x" if label.startswith("1 replica") else ""},
                    {"benchmark": f"{label}: throughput per core", "value": med["rate"] / min(n, cores),
                     "unit": "decisions/s", "load_avg": load, "vs ref": None, "target": ""},
                    {"benchmark": f"{label}: p99 latency", "value": med["p99"], "unit": "ms", "load_avg": load,
                     "vs ref": None, "target": ""},
                    {"benchmark": f"{label}: server CPU per decision (all replicas)", "value": med["cpu_ms"], "unit": "ms",
                     "load_avg": load, "vs ref": None, "target": ""},
                ]
            from bayes_safe.online import DecisionLog

            for label, n, backend in CONFIGS[1:]:
                urls, _, log_url = setups[label]
                log = DecisionLog(log_url, read_only=True)
                high, count = log.feedback_high(), log.feedback_count()
                log.close()
                answers = _synced(urls, high)
                between, against = _differences(answers, _reference(log_url))
                load = round(os.getloadavg()[0], 2)
                rows += [{"benchmark": f"{label}: largest posterior difference between replicas after {count} "
                                       "feedback", "value": f"{between:.1e}", "unit": "", "load_avg": load, "vs ref": None,
                          "target": "<= 1e-10"},
                         {"benchmark": f"{label}: largest difference from the one-process posterior", "value": f"{against:.1e}",
                          "unit": "", "load_avg": load, "vs ref": None, "target": "<= 1e-10"}]
                if n > 1:
                    times = _propagation(urls, log_url, 4 if quick else 10)
                    rows += [{"benchmark": f"{label}: acknowledged feedback to every replica (median; max "
                                           f"{max(times):.2f} s; --sync-every {SYNC_EVERY:g})",
                              "value": statistics.median(times), "unit": "s", "load_avg": load, "vs ref": None,
                              "target": f"<= {SYNC_EVERY:g} s + a sync"}]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=60)
            except Exception:  # noqa: BLE001 - a benchmark's clean-up
                p.kill()
        server.cleanup()
    return rows


if __name__ == "__main__":
    from run import print_table

    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    print_table(run(quick="--quick" in sys.argv), headers=("benchmark", "value", "unit", "load_avg", "vs ref", "target"))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
