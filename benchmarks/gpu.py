"""The batched core on a GPU (issue 46): decisions per second, problem build, memory, host
synchronisations, and the CPU/GPU agreement checks.

    .venv/bin/python benchmarks/gpu.py                  # on the CUDA device; "no CUDA device" otherwise
    .venv/bin/python benchmarks/gpu.py --quick          # R = 10,000 and 100,000 only, fewer steps
    .venv/bin/python benchmarks/gpu.py --device cpu     # the same code on the CPU at small R: a
                                                        # self-check of the script, no GPU needed

Problems: ``kazerouni2017_neurips`` (K = 100 arms in R^4, N(0, 1) noise) for Thompson sampling and
``daulton2019`` (a reward and a constraint metric, K = 100, d = 4) for TS-ASC, both built with
``instances="counter"`` on the device (every replication at once; ``bayes_safe.envs.linear``).
Policies: ``make_policy("ts" | "ts-asc", env)``, the conjugate known-noise ``BayesianLinear`` with
the problem's prior on the problem's device, ``batch_shape [R]``, float64. Rows (the issue's
targets at R = 1,000,000):

* ``build``: seconds to build the problem on the device (target < 2 s at 1M), and the default
  per-replication build's seconds at R = 10,000 for the ratio;
* ``simulate``: ``bayes_safe.simulate`` as a user calls it (its default streams off the CPU: a
  ``CounterRNG`` on the device; every trace field recorded), decisions per second of its loop
  (``trace.attrs``) and wall seconds with the trace's move to the host; conjugate TS target
  >= 10M/s, TS-ASC >= 5M/s;
* ``by hand``: the same Thompson sampling written directly in torch (precision and moment
  updates, a Cholesky factor per step, one ``torch.Generator`` on the device), the floor the
  issue measured at about 40M/s on an H100; the ratio of ``simulate`` to it;
* ``GPU memory`` at R = 1,000,000: the problem's tensors, and the peak ``simulate`` adds to them
  (``torch.cuda.max_memory_allocated``; the models, the step's temporaries and the trace, every field);
* ``host syncs``: the synchronising CUDA calls per ``simulate`` step (``torch.cuda.set_sync_debug_mode``),
  with the lines that made them (target 0 in the step loop).

Agreement of the device with the CPU (issue 46: "CPU and CUDA agree in law, and in value where no
random numbers are involved"), each a row with its measured discrepancy and whether it passed:

* counter streams: the 64-bit words equal bit for bit, the normals to 1e-12;
* the counter-built problems equal on both devices (to 1e-12; the same baseline arms);
* in value, no random numbers: the per-replication-built problem moved to the device equals the
  CPU's; a posterior told the same data on both has the same moments to 1e-9 relative;
* in value, the same random numbers: one ``ReplicationRNG`` and one ``CounterRNG`` seed drive the
  same ``simulate`` on both devices: the share of equal actions (>= 0.99: a near-tie may break
  differently in the last bits) and the total regret (1e-6 relative);
* in law: ``simulate``'s own default streams on each device (numpy's on the CPU, counter ones on
  the GPU): the mean cumulative regret per replication agrees within 5 standard errors.

``run(quick)`` returns the rows (``benchmarks/run.py``'s format) and an empty list without a CUDA
device; ``main`` prints "no CUDA device" and exits 0 then, 1 when an agreement check fails.
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
import time
import warnings

import torch

K, D = 100, 4


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _problem(kind: str, R: int, device, seed: int = 0, instances: str = "counter"):
    from bayes_safe.envs import daulton2019, kazerouni2017_neurips

    if kind == "ts":
        return kazerouni2017_neurips(replications=R, seed=seed, num_arms=K, dim=D, device=device, instances=instances)
    return daulton2019(replications=R, seed=seed, num_arms=K, dim=D, device=device, instances=instances)


def _policy(kind: str, env):
    from bayes_safe.factory import make_policy

    return make_policy(kind, env)


def _timed(device, fn):
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - start


def _simulate(kind: str, env, steps: int, seed: int = 1, generator=None):
    from bayes_safe import simulate

    return simulate(_policy(kind, env), env, steps, seed=seed, progress=False, generator=generator)


def _by_hand(env, steps: int, seed: int = 1) -> float:
    """Decisions per second of conjugate Thompson sampling written directly in torch (the floor)."""
    X = env.arm_features  # [R, K, d]
    R, _, d = X.shape
    device = X.device
    gen = torch.Generator(device=device).manual_seed(seed)
    mean_table = env.expected[..., 0]  # [R, K]
    rows = torch.arange(R, device=device)
    precision = torch.eye(d, dtype=torch.float64, device=device).expand(R, d, d).clone()
    moment = torch.zeros(R, d, 1, dtype=torch.float64, device=device)
    Xt = X.mT.contiguous()  # [R, d, K]

    def step():
        L = torch.linalg.cholesky(precision)
        mu = torch.cholesky_solve(moment, L)
        z = torch.randn(R, d, 1, dtype=torch.float64, device=device, generator=gen)
        w = mu + torch.linalg.solve_triangular(L.mT, z, upper=True)
        a = torch.bmm(w.mT, Xt)[:, 0].argmax(-1)
        x = X[rows, a]  # [R, d]
        y = mean_table[rows, a] + torch.randn(R, dtype=torch.float64, device=device, generator=gen)
        precision.add_(x[:, :, None] * x[:, None, :])
        moment.add_((x * y[:, None])[:, :, None])

    for _ in range(2):
        step()
    _, seconds = _timed(device, lambda: [step() for _ in range(steps)])
    return R * steps / seconds


def _sync_count(kind: str, device, R: int = 1000, steps: int = 8) -> tuple[float, str]:
    """Synchronising CUDA calls per step of ``simulate`` (after its first step) and where they came from."""
    from bayes_safe import simulate

    env = _problem(kind, R, device)
    counts = collections.Counter()
    for T in (1, 1 + steps):
        policy = _policy(kind, env)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                simulate(policy, env, T, seed=1, progress=False)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        here = collections.Counter(f"{w.filename.split('bayes_safe/')[-1]}:{w.lineno}" for w in caught
                                   if "synchroniz" in str(w.message))
        counts = here if T == 1 else here - counts  # what the extra steps added
    per_step = sum(counts.values()) / steps
    return per_step, ", ".join(f"{k} x{v}" for k, v in counts.most_common(6))


def _close(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest relative difference of two tensors (on the CPU, float64)."""
    a, b = a.detach().cpu().to(torch.float64), b.detach().cpu().to(torch.float64)
    scale = torch.maximum(a.abs(), b.abs()).clamp_min(1.0)
    return float(((a - b).abs() / scale).max()) if a.numel() else 0.0


def agreement(device: torch.device, R: int = 2000, steps: int = 30) -> list[dict]:
    """The CPU/device agreement checks (module docstring) -> rows with ``value`` (the discrepancy),
    ``target`` and ``ok``."""
    from bayes_safe.random import (
        CounterRNG,
        ReplicationRNG,
        _hash_words,
        _seed_tensor,
        counter_normal,
    )

    cpu = torch.device("cpu")
    rows = []

    def row(name, value, target, ok, unit=""):
        rows.append({"benchmark": f"agreement: {name}", "value": float(value), "unit": unit, "target": target,
                     "ratio": 1.0 if ok else 0.0, "ok": bool(ok)})

    # counter streams: integer words bit for bit, normals to the last bits of log/sqrt/cos
    seeds = list(range(R))
    keys = _seed_tensor(seeds, cpu)[:, None] * 7919 + 12345
    counters = torch.arange(64, dtype=torch.int64)[None, :] * -7046029254386353131
    words_equal = torch.equal(_hash_words(keys, counters), _hash_words(keys.to(device), counters.to(device)).cpu())
    row("counter words equal (bit for bit)", float(words_equal), "1 (equal)", words_equal)
    err = _close(counter_normal(seeds, "check", 0, 64), counter_normal(seeds, "check", 0, 64, device=device))
    row("counter normals", err, "<= 1e-12 relative", err <= 1e-12)

    # counter-built problems on both devices
    for kind in ("ts", "ts-asc"):
        pc, pd = _problem(kind, R, cpu, seed=3), _problem(kind, R, device, seed=3)
        err = max(_close(pc.arm_features, pd.arm_features), _close(pc.parameters, pd.parameters))
        same = float((pc.baseline_action == pd.baseline_action.cpu()).double().mean())
        row(f"counter-built {pc.name}: inputs", err, "<= 1e-12 relative", err <= 1e-12)
        row(f"counter-built {pc.name}: baseline arms", same, ">= 0.999 equal (ties aside)", same >= 0.999)

    # in value, no random numbers: the per-replication build moved to the device
    env_c = _problem("ts", R, cpu, seed=3, instances="generator")
    env_d = _problem("ts", R, device, seed=3, instances="generator")
    exact = all(torch.equal(getattr(env_c, n), getattr(env_d, n).cpu())
                for n in ("arm_features", "parameters", "noise_std", "baseline_action"))
    row("problem inputs equal (bit for bit)", float(exact), "1 (equal)", exact)
    err = _close(env_c.expected, env_d.expected)
    row("problem mean table", err, "<= 1e-12 relative", err <= 1e-12)

    # a posterior told the same data on both devices
    mc, md = _policy("ts", env_c).model, _policy("ts", env_d).model
    a = env_c.baseline_action
    X = env_c.arm_features[torch.arange(R), a]
    y = env_c.expected[torch.arange(R), a, 0]
    for _ in range(3):
        mc.update(X, y)
        md.update(X.to(device), y.to(device))
    err = max(_close(mc.posterior_mean, md.posterior_mean), _close(mc.posterior_covariance, md.posterior_covariance))
    row("posterior on the same data", err, "<= 1e-9 relative", err <= 1e-9)
    mean_c, var_c = mc.predict(env_c.arm_features)
    mean_d, var_d = md.predict(env_d.arm_features)
    err = max(_close(mean_c, mean_d), _close(var_c, var_d))
    row("predictive moments", err, "<= 1e-9 relative", err <= 1e-9)

    # in value, the same random numbers on both devices: simulate with one generator of either kind
    for make in (ReplicationRNG, CounterRNG):
        tc = _simulate("ts", env_c, steps, generator=make(env_c.seeds, device=cpu))
        td = _simulate("ts", env_d, steps, generator=make(env_c.seeds, device=device))
        share = float((tc.actions == td.actions).double().mean())
        row(f"same {make.__name__} streams: equal actions", share, ">= 0.99 of decisions", share >= 0.99)
        err = _close(tc.regret.sum(), td.regret.sum())
        row(f"same {make.__name__} streams: total regret", err, "<= 1e-6 relative", err <= 1e-6)

    # in law: each device's own default streams
    law_c = _simulate("ts", env_c, steps, seed=11).regret.sum(0)
    law_d = _simulate("ts", env_d, steps, seed=12).regret.sum(0)
    se = math.sqrt(float(law_c.var()) / R + float(law_d.var()) / R)
    z = abs(float(law_c.mean()) - float(law_d.mean())) / max(se, 1e-300)
    row(f"in law: mean regret after {steps} steps ({float(law_c.mean()):.4g} vs {float(law_d.mean()):.4g})", z,
        "<= 5 standard errors", z <= 5.0, unit="z")
    return rows


def run(quick: bool = False, device: str | torch.device | None = None) -> list[dict]:
    """The rows on ``device`` (default: the CUDA device; none without one, after saying so)."""
    if device is None:
        if not torch.cuda.is_available():
            print("no CUDA device")
            return []
        device = "cuda"
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if on_gpu else "cpu"
    sizes = ([10_000, 100_000] if quick else [10_000, 100_000, 1_000_000]) if on_gpu else [500]
    steps = (20 if quick else 50) if on_gpu else 5
    top = sizes[-1]
    rows = []

    def add(benchmark, value, unit, target="", ratio=""):
        rows.append({"benchmark": f"{benchmark} on {name}", "value": value, "unit": unit, "target": target,
                     "ratio": ratio})

    # the per-replication build, for the ratio (10,000 replications on the GPU)
    ref_R = 10_000 if on_gpu else 200
    _, ref = _timed(device, lambda: _problem("ts", ref_R, device, instances="generator"))
    add(f"problem build, default per-replication instances, R={ref_R:,}", ref, "s")
    for kind, target_rate in (("ts", 1e7), ("ts-asc", 5e6)):
        for R in sizes if kind == "ts" else [top]:
            if on_gpu:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            _problem(kind, min(R, 1000), device)  # the kernels' first use, out of the timing
            env, build = _timed(device, lambda kind=kind, R=R: _problem(kind, R, device))
            label = "kazerouni2017-neurips" if kind == "ts" else "daulton2019"
            at_top = R == 1_000_000
            add(f"problem build ({label}, counter instances), R={R:,}", build, "s",
                "< 2 s at R = 1M" if at_top else "", 2.0 / build if at_top else "")
            _simulate(kind, env, 2)  # warm-up (first kernels, allocator)
            if on_gpu:  # the run's own memory: the problem's tensors plus what simulate adds
                torch.cuda.reset_peak_memory_stats(device)
                held = torch.cuda.memory_allocated(device)
            trace, wall = _timed(device, lambda kind=kind, env=env: _simulate(kind, env, steps))
            rate = trace.attrs["decisions_per_second"]
            add(f"simulate {kind} (conjugate), K={K} d={D} R={R:,}, T={steps}", rate, "decisions/s",
                f">= {target_rate / 1e6:.0f}M/s at R = 1M" if at_top else "", rate / target_rate if at_top else "")
            add(f"simulate {kind} wall with the trace to the host, R={R:,}", R * steps / wall, "decisions/s")
            if kind == "ts":
                hand = _by_hand(env, steps)
                add(f"TS by hand (floor), R={R:,}", hand, "decisions/s", "", "")
                add(f"simulate ts / by hand, R={R:,}", rate / hand, "x")
            if on_gpu and R == top:
                add(f"GPU memory: the problem, R={R:,}", held / 2**30, "GiB")
                add(f"GPU memory: simulate {kind}'s peak above it (T={steps}, every trace field)",
                    (torch.cuda.max_memory_allocated(device) - held) / 2**30, "GiB")
            del env, trace
    if on_gpu:
        for kind in ("ts", "ts-asc"):
            per_step, where = _sync_count(kind, device)
            add(f"host syncs per simulate step ({kind})", per_step, "per step", "0", "")
            if where:
                add(f"host syncs ({kind}) made at", where, "")
    rows.extend(agreement(device, R=2000 if on_gpu else 100, steps=30 if on_gpu else 5))
    return rows


def profile(device, R: int, steps: int = 5) -> None:
    """Print where ``simulate``'s time goes (``torch.profiler``: the top operators by device time and by
    host time) for TS and TS-ASC at ``R``: what to read when a target is missed."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for kind in ("ts", "ts-asc"):
        env = _problem(kind, R, device)
        _simulate(kind, env, 2)
        with torch_profile(activities=activities) as prof:
            _simulate(kind, env, steps)
            _sync(device)
        for key in (["cuda_time_total"] if device.type == "cuda" else []) + ["cpu_time_total"]:
            print(f"--- simulate {kind}, R={R:,}, {steps} steps: top operators by {key}")
            print(prof.key_averages().table(sort_by=key, row_limit=14, max_name_column_width=48))
        del env


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="R = 10,000 and 100,000 only, 20 steps")
    parser.add_argument("--device", default=None, help="the device (default: cuda; 'cpu' runs the self-check)")
    parser.add_argument("--profile", type=int, default=None, metavar="R",
                        help="print torch.profiler tables of simulate (TS, TS-ASC) at R replications (instead of the rows)")
    args = parser.parse_args(argv)
    if args.device is None and not torch.cuda.is_available():
        print("no CUDA device")
        return 0
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
    if args.profile:
        profile(torch.device(args.device or "cuda"), args.profile)
        return 0
    rows = run(quick=args.quick, device=args.device)
    width = max(len(r["benchmark"]) for r in rows)
    for r in rows:
        value = r["value"]
        shown = f"{value:,.4g}" if isinstance(value, float) else str(value)
        ok = "" if "ok" not in r else ("  ok" if r["ok"] else "  FAILED")
        print(f"{r['benchmark']:<{width}} | {shown:>14} {r['unit']:<12} | {r['target']}{ok}")
    failed = [r["benchmark"] for r in rows if r.get("ok") is False]
    if failed:
        print(f"{len(failed)} agreement check(s) failed: {failed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
