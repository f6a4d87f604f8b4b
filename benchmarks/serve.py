"""Decisions per second and latency of ``bayes-safe serve`` (conjugate TS-ASC behind HTTP).

    python benchmarks/serve.py [--quick] [--client httpx|raw]

Target (issue 27): at least 1,500 decisions/s with a p99 latency under 20 ms, 4 clients on the
project's 2-core machine (issue 19 asked for 500/s). Each configuration is a server subprocess
(``bayes_safe.online.serve.serve`` on 127.0.0.1, port 0, httptools + uvloop) over its own copy
of one saved Decider: TS-ASC with one constraint, conjugate Gaussian models, d = 4, 5
candidates, a baseline, ``update_every = 1``, 200 propensity draws. The configurations,
measured in one run and interleaved (round ``r`` drives every server in turn, so a change of the
machine's load hits all of them alike):

* ``issue 19``: the service as it shipped before issue 27: FastAPI's routing for every request,
  decisions and feedback on the thread pool;
* ``FastAPI routes, on the loop``: the same on the event loop (``run_on_loop=True``);
* ``fast path, thread pool``: ``POST /decide`` and ``/feedback`` answered by
  ``serve.fast_asgi`` (no FastAPI routing, middleware or request objects), on the thread pool;
* ``now``: the fast path on the event loop: the service as it ships.

The driver is this process: ``workers`` concurrent connections, each looping ``POST /decide``
and, for every other decision, ``POST /feedback`` (applied at once). Latency is the client's wall
time per ``/decide``. The client shares the 2 cores with the server, so the rate is a lower bound
of what a client on another machine would see; ``--client raw`` (the default) is a minimal
HTTP/1.1 client on asyncio streams that leaves the server most of the machine, ``--client httpx``
the ``httpx.AsyncClient`` that earlier versions of this benchmark drove (a heavier client: the
rates it measures are lower). The table reports medians over the rounds, the load average (1 min,
the median of the values read after each round), the server's CPU time per decision (its
``/proc`` counters: HTTP, JSON, the decision, its log row and half a feedback) and the ratios
to the target. In-process rows time ``Decider.decide`` with its log (the server's own work,
without HTTP) at 1000 and 200 draws, and ``Decider.save`` (what a snapshot per feedback would add).

Measured 2026-11-26, after issue 28 put a gate (Host, Origin, token role, content type, size) in
front of every request and signed the decision ids (``--quick``, load average 0.58): now 1,718
decisions/s (1.15x the target), p99 4.4 ms, 0.57 ms of server CPU per decision; fast path on the
thread pool 967/s, p99 5.9 ms.

Measured 2026-11-25 (issue 27; raw client, 3 rounds of 5 s, the Decider of that hour, in
process 0.33 ms per decision with its log at 200 draws). At load average 1.7: issue 19 837
decisions/s, p99 6.4 ms, 1.20 ms server CPU per decision; FastAPI routes on the loop 1,313/s,
4.7 ms, 0.75 ms; fast path on the thread pool 965/s, 6.0 ms, 1.05 ms; now 1,600/s (1.07x the
target), p99 4.0 ms, 0.62 ms. At load average 3.2 to 4.0 (the machine shared with other test
runs): issue 19 807/s, p99 8.7 ms; now 1,060/s (0.71 of the target), p99 10.8 ms, 0.64 ms. The
server's CPU per decision bounds it at about 1/0.62 ms = 1,600/s with a core to itself. Bulk
feedback (``Decider.feedback_many``, one log transaction) cost 0.05 ms per outcome for 2,000;
the ``/metrics`` monitor read a 2,000-row log at a few microseconds per row.

Measured 2026-11-24, before issue 27 (raw client, 3 rounds of 5 s, the machine shared with other jobs, load
average 5.5): before 386 decisions/s, p99 18.6 ms, 2.17 ms server CPU per decision; httptools +
uvloop at 1000 draws 338/s, 26.4 ms, 2.09 ms; now 459/s (0.92 of the target), p99 16.3 ms,
1.64 ms; on the loop 427/s, 24.3 ms, 1.41 ms. The target of 500/s is not met on the shared
machine; the p99 target is. (The code before this change, driven by the httpx client at load
average 1.3: 235/s, p99 24.1 ms, 2.74 ms CPU per decision.) Re-measured the same day with only
the benchmark on the machine (load average 1.2 to 1.3): before 441/s, p99 11.7 ms; httptools +
uvloop at 1000 draws 476/s, 10.9 ms; now 641/s (1.28x the target), p99 8.3 ms, 1.57 ms CPU per
decision; on the loop 967/s, 6.1 ms.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TARGET_RATE = 1500      # decisions/s (issue 27; issue 19 asked for 500)
TARGET_P99_MS = 20.0

#: (label, serve() keyword arguments, num_draws); all with httptools + uvloop (the serve extra)
CONFIGS = [
    ("issue 19: FastAPI routes, thread pool", {"fast": False, "run_on_loop": False}, 200),
    ("FastAPI routes, on the loop", {"fast": False, "run_on_loop": True}, 200),
    ("fast path, thread pool", {"fast": True, "run_on_loop": False}, 200),
    ("now: fast path, on the loop", {"fast": True, "run_on_loop": True}, 200),
]


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


def start_server(state: Path, snapshot_every: float = 5.0, **options) -> tuple[subprocess.Popen, str]:
    """Start ``serve(state, port=0, **options)`` in a subprocess; return the process and its base URL."""
    code = ("import sys, json; from bayes_safe.online.serve import serve; "
            "sys.exit(serve(sys.argv[1], port=0, snapshot_every=float(sys.argv[2]), **json.loads(sys.argv[3])))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(state), str(snapshot_every), json.dumps(options)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    match = re.search(r"listening on (http://\S+)", line)
    if not match:
        proc.kill()
        raise RuntimeError(f"the server did not start: {line}{proc.stderr.read()}")
    return proc, match.group(1)


class _RawConnection:
    """One keep-alive HTTP/1.1 connection: ``POST`` JSON, read the status and the body."""

    def __init__(self, url: str):
        self.host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
        self.port = int(port)

    async def open(self):
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def post(self, path: str, payload) -> tuple[int, dict]:
        body = json.dumps(payload).encode()
        self.writer.write(f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
                          f"content-length: {len(body)}\r\n\r\n".encode() + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(int(v) for k, _, v in (h.partition(":") for h in lines[1:]) if k.lower() == "content-length")
        return status, json.loads(await self.reader.readexactly(length))

    def close(self):
        self.writer.close()


async def decide_and_feed(decide, feedback_to, rng, stop: float, latencies: list[float]) -> None:
    """One worker until ``stop`` (``time.perf_counter``): ``POST /decide`` through ``decide`` (its latency
    appended to ``latencies``) and, for every other decision, ``POST /feedback`` through the connection
    ``feedback_to(rng)`` returns (the same one, or another replica's)."""
    n = 0
    while time.perf_counter() < stop:
        x = rng.normal(size=(5, 4)).round(4).tolist()
        t0 = time.perf_counter()
        status, d = await decide("/decide", {"features": x, "baseline": 0})
        latencies.append(time.perf_counter() - t0)
        if status != 200:
            raise RuntimeError(f"/decide: {status} {d}")
        n += 1
        if n % 2 == 0:
            y = float(np.dot(x[d["action"]], [0.3, -0.2, 0.1, 0.0]) + rng.normal(0, 0.5))
            post = feedback_to(rng)
            status, f = await post("/feedback", {"decision_id": d["decision_id"], "reward": y,
                                                 "constraints": [float(rng.normal(0, 0.5))]})
            if status != 200:
                raise RuntimeError(f"/feedback: {status} {f}")


async def _drive(url: str, seconds: float, workers: int, client: str = "raw", seed: int = 0) -> list[float]:
    """Every worker loops decide (+ feedback for every other decision) for ``seconds``; the latencies of /decide."""
    latencies: list[float] = []
    stop = time.perf_counter() + seconds

    async def loop(post, i: int):
        await decide_and_feed(post, lambda rng: post, np.random.default_rng(seed + i), stop, latencies)

    if client == "httpx":
        import httpx

        limits = httpx.Limits(max_connections=workers, max_keepalive_connections=workers)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as c:
            async def post(path, payload):
                r = await c.post(path, json=payload)
                return r.status_code, r.json()

            await asyncio.gather(*(loop(post, i) for i in range(workers)))
    else:
        conns = [await _RawConnection(url).open() for _ in range(workers)]
        try:
            await asyncio.gather(*(loop(c.post, i) for i, c in enumerate(conns)))
        finally:
            for c in conns:
                c.close()
    return latencies


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux ``/proc``), or None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(rounds: int = 3, seconds: float = 5.0, workers: int = 4, client: str = "raw") -> list[dict]:
    """Every configuration of ``CONFIGS``, ``rounds`` interleaved rounds of ``seconds`` each."""
    results = {label: [] for label, _, _ in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="online_bench_") as tmp:
        servers = {}
        try:
            for i, (label, options, draws) in enumerate(CONFIGS):
                state = make_state(Path(tmp) / f"state{i}", num_draws=draws)
                servers[label] = start_server(state, **options)
            for proc, url in servers.values():
                asyncio.run(_drive(url, 1.0, workers, client))  # warm-up
            for r in range(rounds):
                for label, (proc, url) in servers.items():
                    cpu0 = _cpu_seconds(proc.pid)
                    t0 = time.perf_counter()
                    lat = asyncio.run(_drive(url, seconds, workers, client, seed=100 * r))
                    wall = time.perf_counter() - t0
                    cpu1 = _cpu_seconds(proc.pid)
                    lat_ms = np.array(lat) * 1000
                    results[label].append({"rate": len(lat) / wall, "p50": float(np.percentile(lat_ms, 50)),
                                           "p99": float(np.percentile(lat_ms, 99)), "load": os.getloadavg()[0],
                                           "cpu_ms": None if cpu0 is None else (cpu1 - cpu0) / len(lat) * 1000})
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(timeout=60)
    out = []
    for label, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) if runs[0][k] is not None else None for k in runs[0]}
        out.append({"label": label, **med, "rounds": len(runs)})
    return out


def save_ms(repeats: int = 20) -> float:
    with tempfile.TemporaryDirectory(prefix="online_bench_") as tmp:
        from bayes_safe.online import Decider

        state = make_state(Path(tmp) / "state")
        decider = Decider.load(state)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            decider.save(state)
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def decide_ms(n: int = 300, num_draws: int = 1000) -> float:
    """``Decider.decide`` of the same state in-process (with its log): the server's own work per decision."""
    with tempfile.TemporaryDirectory(prefix="online_bench_") as tmp:
        from bayes_safe.online import Decider

        decider = Decider.load(make_state(Path(tmp) / "state", num_draws=num_draws), log=Path(tmp) / "log.sqlite")
        x = np.random.default_rng(0).normal(size=(5, 4))
        for _ in range(20):
            decider.decide(x, baseline=0)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n // 5):
                decider.decide(x, baseline=0)
            times.append((time.perf_counter() - t0) / (n // 5) * 1000)
        decider.log.close()
    return statistics.median(times)


def bulk_ms(n: int = 2000) -> tuple[float, float]:
    """Per outcome: ``Decider.feedback_many`` of ``n`` outcomes (one log transaction, then applied), and
    the ``/metrics`` monitor's first read of the log they made (``GuardrailMonitor.update``), in ms."""
    with tempfile.TemporaryDirectory(prefix="online_bench_") as tmp:
        from bayes_safe.online import Decider
        from bayes_safe.online.metrics import GuardrailMonitor

        decider = Decider.load(make_state(Path(tmp) / "state", num_draws=50), log=Path(tmp) / "log.sqlite")
        rng = np.random.default_rng(0)
        x = rng.normal(size=(5, 4))
        ids = [decider.decide(x, baseline=0).decision_id for _ in range(n)]
        rows = [(k, float(rng.normal()), [float(rng.normal())]) for k in ids]
        t0 = time.perf_counter()
        decider.feedback_many(rows)
        apply = (time.perf_counter() - t0) / n * 1000
        monitor = GuardrailMonitor(decider.log, decider.policy)
        t0 = time.perf_counter()
        monitor.update()
        read = (time.perf_counter() - t0) / n * 1000
        decider.log.close()
    return apply, read


def run(quick: bool = False, client: str = "raw") -> list[dict]:
    import torch

    torch.set_num_threads(1)
    workers = 4
    rows = []
    for m in measure(rounds=2 if quick else 3, seconds=2.0 if quick else 5.0, workers=workers, client=client):
        name = f"serve TS-ASC d=4 K=5, {workers} {client} clients, {m['label']}"
        load = round(m["load"], 2)
        rows += [
            {"benchmark": f"{name}: throughput", "value": m["rate"], "unit": "decisions/s", "load_avg": load,
             "target": f">= {TARGET_RATE}", "ratio": m["rate"] / TARGET_RATE},
            {"benchmark": f"{name}: p50 latency", "value": m["p50"], "unit": "ms", "load_avg": load, "target": "",
             "ratio": None},
            {"benchmark": f"{name}: p99 latency", "value": m["p99"], "unit": "ms", "load_avg": load,
             "target": f"< {TARGET_P99_MS:g}", "ratio": TARGET_P99_MS / m["p99"]},
            {"benchmark": f"{name}: server CPU per decision (+ half a feedback)", "value": m["cpu_ms"], "unit": "ms",
             "load_avg": load, "target": "", "ratio": None},
        ]
    for draws in (1000, 200):
        rows.append({"benchmark": f"Decider.decide in-process, with its log, num_draws={draws}",
                     "value": decide_ms(100 if quick else 300, draws), "unit": "ms",
                     "load_avg": round(os.getloadavg()[0], 2), "target": "", "ratio": None})
    rows.append({"benchmark": "Decider.save (a snapshot per feedback would add)", "value": save_ms(10 if quick else 30),
                 "unit": "ms", "load_avg": round(os.getloadavg()[0], 2), "target": "", "ratio": None})
    n = 500 if quick else 2000
    apply, read = bulk_ms(n)
    load = round(os.getloadavg()[0], 2)
    rows += [{"benchmark": f"Decider.feedback_many of {n} outcomes (bulk feedback), per outcome", "value": apply,
              "unit": "ms", "load_avg": load, "target": "", "ratio": None},
             {"benchmark": f"/metrics: first read of a log of {n} outcomes (GuardrailMonitor.update), per row",
              "value": read * 1000, "unit": "us", "load_avg": load, "target": "", "ratio": None}]
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run import print_table

    client = sys.argv[sys.argv.index("--client") + 1] if "--client" in sys.argv else "raw"
    if client not in ("raw", "httpx"):
        sys.exit(f"--client: expected raw or httpx, got {client!r}")
    print_table(run(quick="--quick" in sys.argv, client=client),
                headers=("benchmark", "value", "unit", "load_avg", "target", "ratio"))
