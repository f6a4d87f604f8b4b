"""Conjugate Thompson sampling on a GPU (issue 46): decisions per second, problem build time, and
the CPU/GPU agreement checks.

    .venv/bin/python benchmarks/gpu.py                  # on the CUDA device; "no CUDA device" otherwise
    .venv/bin/python benchmarks/gpu.py --quick          # R = 10,000 and 100,000 only, fewer steps
    .venv/bin/python benchmarks/gpu.py --device cpu     # the same code on the CPU: a self-check of the
                                                        # agreement logic (small R), no GPU needed

Problem: ``kazerouni2017_neurips`` (K = 100 arms in R^4, N(0, 1) noise) built with ``device=``;
policy: ``ThompsonSampling`` over a conjugate known-noise ``BayesianLinear`` (prior N(0, I) on the
device, ``batch_shape [R]``, float64: the conjugate engine's dtype on every device). Rows, at
R = 10,000 / 100,000 / 1,000,000 (``--quick``: the first two):

* ``build``: seconds to build the problem on the device (the instances are drawn on the CPU per
  replication, the same numbers on every device, then moved: this grows with R);
* ``loop``: decisions per second of the library's step loop (``env.draw``, ``policy.select``,
  ``env.outcomes``, ``policy.update``) under ``torch.inference_mode`` and trusted inputs, as
  ``simulate`` runs it, with a ``torch.Generator`` on the device (one stream for the batch: the
  device's own random numbers); the device synchronised before and after the timed steps;
* ``simulate``: decisions per second of ``bayes_safe.simulate`` itself (its per-replication
  ``ReplicationRNG`` streams; R = 10,000 only), or the error it raises when ``simulate`` does not
  run on the device yet (its own change is in the issue's report).

Agreement of the device with the CPU (issue 46: "CPU and CUDA agree in law, and in value where no
random numbers are involved"), at R = 2,000 (``--device cpu``: 200), every check a row with its
measured discrepancy and whether it passed:

* in value, no random numbers: the problem built on the device equals the CPU's (features,
  parameters and baselines bit for bit: they are drawn on the CPU; the mean table and optimal arms
  to 1e-12); a posterior told the same data on both (the CPU run's chosen features and outcomes)
  has the same mean, covariance and predictive moments to 1e-9 relative;
* in value, the same random numbers: a ``ReplicationRNG`` (numpy's numbers, put on the device)
  drives the same run on both: the share of equal actions over the run (>= 0.99: a near-tie may be
  broken differently by the last bits of the device's arithmetic) and the cumulative regret;
* in law: each device's own generator (``torch.Generator`` on the device), the mean cumulative
  regret per replication over T steps on both; they agree when their difference is within 5
  standard errors of a difference of two independent means.

``run(quick)`` returns the rows (``benchmarks/run.py``'s format) and an empty list without a CUDA
device; ``main`` prints "no CUDA device" and exits 0 then.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch

K, D = 100, 4


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _prior(d: int, device: torch.device):
    import pyro.distributions as dist

    return dist.Normal(torch.zeros(d, dtype=torch.float64, device=device),
                       torch.ones(d, dtype=torch.float64, device=device)).to_event(1)


def _policy(R: int, device: torch.device, noise: float = 1.0):
    from bayes_safe import BayesianLinear
    from bayes_safe.policies import ThompsonSampling

    return ThompsonSampling(BayesianLinear(_prior(D, device), noise, batch_shape=[R]))


def _build(R: int, device: torch.device, seed: int = 0, num_arms: int = K):
    from bayes_safe.envs import kazerouni2017_neurips

    return kazerouni2017_neurips(replications=R, seed=seed, num_arms=num_arms, dim=D, device=device)


def _loop(env, policy, generator, steps: int, regret: bool = False):
    """The library's step loop (``simulate``'s, by hand): actions ``[T, R]`` and, with ``regret``,
    the cumulative regret per replication ``[R]`` (float64, on the device)."""
    from bayes_safe._validation import trusted_inputs

    R = env.replications
    rows = torch.arange(R, device=env.arm_features.device)
    total = torch.zeros(R, dtype=torch.float64, device=env.arm_features.device) if regret else None
    actions = []
    with torch.inference_mode(), trusted_inputs():
        for _ in range(steps):
            units = env.draw(R, generator)
            a = policy.select(units.features, units.baseline, generator)
            y = env.outcomes(units, a)
            policy.update(units.features[rows, a], y[:, 0])
            if regret:
                total += env.optimal_reward - env.expected[rows, a, 0]
                actions.append(a)
    return (torch.stack(actions) if actions else None), total


def _rate(R: int, device: torch.device, steps: int, warmup: int = 2) -> tuple[float, float]:
    """``(build seconds, decisions per second)`` of the step loop at ``R`` on ``device``."""
    _sync(device)
    start = time.perf_counter()
    env = _build(R, device)
    _sync(device)
    build = time.perf_counter() - start
    policy = _policy(R, device)
    gen = torch.Generator(device=device).manual_seed(1)
    _loop(env, policy, gen, warmup)
    _sync(device)
    start = time.perf_counter()
    _loop(env, policy, gen, steps)
    _sync(device)
    return build, R * steps / (time.perf_counter() - start)


def _simulate_rate(R: int, device: torch.device, steps: int) -> tuple[float | None, str]:
    from bayes_safe import simulate

    try:
        env, policy = _build(R, device), _policy(R, device)
        _sync(device)
        start = time.perf_counter()
        simulate(policy, env, steps, seed=1, progress=False)
        _sync(device)
        return R * steps / (time.perf_counter() - start), ""
    except Exception as exc:  # noqa: BLE001 - reported as the row's note
        return None, f"{type(exc).__name__}: {str(exc)[:160]}"


def _close(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest relative difference of two tensors (on the CPU, float64)."""
    a, b = a.detach().cpu().to(torch.float64), b.detach().cpu().to(torch.float64)
    scale = torch.maximum(a.abs(), b.abs()).clamp_min(1.0)
    return float(((a - b).abs() / scale).max()) if a.numel() else 0.0


def agreement(device: torch.device, R: int = 2000, steps: int = 30) -> list[dict]:
    """The CPU/device agreement checks (module docstring) -> rows with ``value`` (the discrepancy),
    ``target`` and ``ok``."""
    from bayes_safe.random import ReplicationRNG

    cpu = torch.device("cpu")
    rows = []

    def row(name, value, target, ok, unit=""):
        rows.append({"benchmark": f"agreement: {name}", "value": value, "unit": unit, "target": target,
                     "ratio": 1.0 if ok else 0.0, "ok": bool(ok)})

    # in value, no random numbers: the problem
    env_c, env_d = _build(R, cpu, seed=3), _build(R, device, seed=3)
    exact = all(torch.equal(getattr(env_c, n), getattr(env_d, n).cpu())
                for n in ("arm_features", "parameters", "noise_std", "baseline_action"))
    row("problem inputs equal (bit for bit)", float(exact), "1 (equal)", exact)
    err = _close(env_c.expected, env_d.expected)
    row("problem mean table", err, "<= 1e-12 relative", err <= 1e-12)
    same_opt = float((env_c.optimal_action == env_d.optimal_action.cpu()).double().mean())
    row("problem optimal arms", same_opt, ">= 0.999 equal (ties aside)", same_opt >= 0.999)

    # in value, the same random numbers: a ReplicationRNG drives both runs
    pc, pd = _policy(R, cpu), _policy(R, device)
    a_c, reg_c = _loop(env_c, pc, ReplicationRNG.from_seed(5, R), steps, regret=True)
    a_d, reg_d = _loop(env_d, pd, ReplicationRNG.from_seed(5, R, device=device), steps, regret=True)
    share = float((a_c == a_d.cpu()).double().mean())
    row("same streams: equal actions", share, ">= 0.99 of decisions", share >= 0.99)
    err = _close(reg_c.sum(), reg_d.sum())
    row("same streams: total regret", err, "<= 1e-3 relative", err <= 1e-3)

    # in value: a posterior told the same data (the CPU run's) on both devices
    mc, md = _policy(R, cpu).model, _policy(R, device).model
    X = env_c.arm_features[torch.arange(R), a_c[-1]]
    y = env_c.expected[torch.arange(R), a_c[-1], 0]
    for _ in range(3):
        mc.update(X, y)
        md.update(X.to(device), y.to(device))
    err = max(_close(mc.posterior_mean, md.posterior_mean), _close(mc.posterior_covariance, md.posterior_covariance))
    row("posterior on the same data", err, "<= 1e-9 relative", err <= 1e-9)
    mean_c, var_c = mc.predict(env_c.arm_features)
    mean_d, var_d = md.predict(env_d.arm_features)
    err = max(_close(mean_c, mean_d), _close(var_c, var_d))
    row("predictive moments", err, "<= 1e-9 relative", err <= 1e-9)

    # in law: each device's own generator
    _, law_c = _loop(env_c, _policy(R, cpu), torch.Generator(device=cpu).manual_seed(11), steps, regret=True)
    _, law_d = _loop(env_d, _policy(R, device), torch.Generator(device=device).manual_seed(12), steps, regret=True)
    law_c, law_d = law_c.cpu(), law_d.cpu()
    se = math.sqrt(float(law_c.var()) / R + float(law_d.var()) / R)
    z = abs(float(law_c.mean()) - float(law_d.mean())) / max(se, 1e-300)
    row(f"in law: mean regret after {steps} steps ({float(law_c.mean()):.3g} vs {float(law_d.mean()):.3g})", z,
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
    sizes = ([10_000, 100_000] if quick else [10_000, 100_000, 1_000_000]) if on_gpu else [1_000]
    steps = (20 if quick else 100) if on_gpu else 5
    rows = []
    for R in sizes:
        build, rate = _rate(R, device, steps)
        rows.append({"benchmark": f"conjugate TS loop, K={K} d={D} R={R:,} on {name}", "value": rate,
                     "unit": "decisions/s", "target": ">= 10M/s at R = 1M (issue 46)" if R == 1_000_000 else "",
                     "ratio": rate / 1e7 if R == 1_000_000 else ""})
        rows.append({"benchmark": f"problem build, R={R:,} on {name}", "value": build, "unit": "s",
                     "target": "< 2 s at R = 1M (issue 46)" if R == 1_000_000 else "",
                     "ratio": 2.0 / build if R == 1_000_000 else ""})
        if device.type == "cuda":
            torch.cuda.empty_cache()
    R_sim = 10_000 if on_gpu else 200
    rate, note = _simulate_rate(R_sim, device, steps)
    rows.append({"benchmark": f"simulate, K={K} d={D} R={R_sim:,} on {name}", "value": rate if rate is not None else note,
                 "unit": "decisions/s" if rate is not None else "", "target": "", "ratio": ""})
    rows.extend(agreement(device, R=2000 if on_gpu else 200, steps=30 if on_gpu else 10))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="R = 10,000 and 100,000 only, 20 steps")
    parser.add_argument("--device", default=None, help="the device (default: cuda; 'cpu' runs the self-check)")
    args = parser.parse_args(argv)
    if args.device is None and not torch.cuda.is_available():
        print("no CUDA device")
        return 0
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
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
