"""Decisions per second and latency of ``bayes-safe serve`` (conjugate TS-ASC behind HTTP).

The server runs as a subprocess (``python -m bayes_safe.cli serve``) on 127.0.0.1; this process
drives it with concurrent ``httpx.AsyncClient`` workers, each looping ``POST /decide`` (5
candidates, d = 4, a baseline, ``num_draws = 1000`` Monte-Carlo draws for the propensities)
and, for every other decision, ``POST /feedback`` (applied at once: ``update_every = 1``).
Latency is the client's wall time per ``/decide`` request. The client shares the machine with
the server, so the rates are a lower bound of what a separate client machine would see; the
load average is reported next to them, and the server's CPU time per decision (its own
``/proc`` counters; HTTP, JSON, the decision, its log row and half a feedback) bounds the rate
of one core given to the server alone: ``1000 / cpu_ms`` decisions/s.

Two more rows time, in-process, ``Decider.decide`` with its log (the server's own work per
decision, without HTTP) and ``Decider.save`` of the same state: what snapshotting after every
feedback (the alternative to replaying the log at startup) would add per request.
"""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TARGET_RATE = 500       # decisions/s
TARGET_P99_MS = 20.0


def make_state(directory: Path, d: int = 4, update_every: int = 1, num_draws: int = 1000) -> Path:
    import pyro.distributions as dist
    import torch

    from bayes_safe import TSASC, BayesianLinear
    from bayes_safe.online import Decider

    def model():
        return BayesianLinear(dist.Normal(torch.zeros(d, dtype=torch.float64), 1.0).to_event(1), noise_std=0.5,
                              batch_shape=[1])

    decider = Decider(TSASC(model(), [model()], alpha=0.1), update_every=update_every, num_draws=num_draws)
    return decider.save(directory)


def start_server(state: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """Start ``bayes-safe serve STATE --port 0``; return the process and its base URL."""
    proc = subprocess.Popen([sys.executable, "-m", "bayes_safe.cli", "serve", str(state), "--port", "0", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    match = re.search(r"listening on (http://\S+)", line)
    if not match:
        proc.kill()
        raise RuntimeError(f"the server did not start: {line}{proc.stderr.read()}")
    return proc, match.group(1)


async def _drive(url: str, seconds: float, workers: int, seed: int = 0) -> tuple[int, list[float]]:
    import httpx

    latencies: list[float] = []
    stop = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=workers, max_keepalive_connections=workers)

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        async def worker(i: int):
            rng = np.random.default_rng(seed + i)
            n = 0
            while time.perf_counter() < stop:
                x = rng.normal(size=(5, 4)).round(4).tolist()
                t0 = time.perf_counter()
                r = await client.post("/decide", json={"features": x, "baseline": 0})
                latencies.append(time.perf_counter() - t0)
                r.raise_for_status()
                n += 1
                if n % 2 == 0:
                    d = r.json()
                    y = float(np.dot(x[d["action"]], [0.3, -0.2, 0.1, 0.0]) + rng.normal(0, 0.5))
                    (await client.post("/feedback", json={"decision_id": d["decision_id"], "reward": y,
                                                          "constraints": [float(rng.normal(0, 0.5))]})).raise_for_status()

        await asyncio.gather(*(worker(i) for i in range(workers)))
    return len(latencies), latencies


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux ``/proc``), or None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(seconds: float = 5.0, workers: int = 4) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        state = make_state(Path(tmp) / "state")
        proc, url = start_server(state, "--snapshot-every", "5")
        try:
            asyncio.run(_drive(url, 0.5, workers))  # warm-up
            load = os.getloadavg()[0]
            cpu0 = _cpu_seconds(proc.pid)
            t0 = time.perf_counter()
            n, lat = asyncio.run(_drive(url, seconds, workers, seed=100))
            wall = time.perf_counter() - t0
            cpu1 = _cpu_seconds(proc.pid)
            load = max(load, os.getloadavg()[0])
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    lat_ms = np.array(lat) * 1000
    return {"rate": n / wall, "p50": float(np.percentile(lat_ms, 50)), "p99": float(np.percentile(lat_ms, 99)),
            "load": load, "n": n, "cpu_ms": None if cpu0 is None else (cpu1 - cpu0) / n * 1000}


def save_ms(repeats: int = 20) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        from bayes_safe.online import Decider

        state = make_state(Path(tmp) / "state")
        decider = Decider.load(state)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            decider.save(state)
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def decide_ms(n: int = 300) -> float:
    """``Decider.decide`` of the same state in-process (with its log): the server's own work per decision."""
    with tempfile.TemporaryDirectory() as tmp:
        from bayes_safe.online import Decider

        decider = Decider.load(make_state(Path(tmp) / "state"), log=Path(tmp) / "log.sqlite")
        x = np.random.default_rng(0).normal(size=(5, 4))
        for _ in range(20):
            decider.decide(x, baseline=0)
        t0 = time.perf_counter()
        for _ in range(n):
            decider.decide(x, baseline=0)
        out = (time.perf_counter() - t0) / n * 1000
        decider.log.close()
    return out


def run(quick: bool = False) -> list[dict]:
    import torch

    torch.set_num_threads(1)
    workers = 4
    m = measure(seconds=3.0 if quick else 10.0, workers=workers)
    snap = save_ms(10 if quick else 30)
    own = decide_ms(100 if quick else 300)
    name = f"serve TS-ASC d=4 K=5, {workers} clients"
    return [
        {"benchmark": f"{name}: throughput", "value": m["rate"], "unit": "decisions/s", "load_avg": round(m["load"], 2),
         "target": f">= {TARGET_RATE}", "ratio": m["rate"] / TARGET_RATE},
        {"benchmark": f"{name}: p50 latency", "value": m["p50"], "unit": "ms", "load_avg": round(m["load"], 2),
         "target": "", "ratio": None},
        {"benchmark": f"{name}: p99 latency", "value": m["p99"], "unit": "ms", "load_avg": round(m["load"], 2),
         "target": f"< {TARGET_P99_MS:g}", "ratio": TARGET_P99_MS / m["p99"]},
        {"benchmark": f"{name}: server CPU per decision (+ half a feedback)", "value": m["cpu_ms"], "unit": "ms",
         "load_avg": round(m["load"], 2), "target": "", "ratio": None},
        {"benchmark": "Decider.decide in-process, with its log (the server's own work)", "value": own, "unit": "ms",
         "load_avg": round(os.getloadavg()[0], 2), "target": "", "ratio": None},
        {"benchmark": "Decider.save (a snapshot per feedback would add)", "value": snap, "unit": "ms",
         "load_avg": round(os.getloadavg()[0], 2), "target": "", "ratio": None},
    ]


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv):
        print(row)
