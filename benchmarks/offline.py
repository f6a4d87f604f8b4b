"""Training throughput of constrained off-policy learning (Kachuee & Lee 2022; issue 8).

Problem: the synthetic skill-routing logs (``bayes_safe.offline.synthetic``: 27 domains,
39 context features, 8 actions), the ``global`` constraint benchmark, and the two-layer
MLP policy of ``bayes_safe.offline.policy.mlp_policy`` (39 -> 64 -> ReLU -> 8 -> softmax).
For each method, one epoch over ``N`` logged rows is timed after one warm-up epoch (which
also moves the policy away from its initialisation, so the constrained methods see a
realistic share of violating rows). Two batch sizes: 32,768 (the paper's, s.4.3) and 4,096.

Reported: logged samples per second per epoch (wall clock, one torch thread; and from
process CPU time, which a shared machine disturbs less), the meta-gradient's time per step
over plain IPS's (early in training, and the median epoch of a 16-epoch run), and the share
of training rows violating a constraint during the timed epochs: the meta-gradient's extra
passes run on those rows only (see ``bayes_safe.offline.training._meta_core``; the MLP
goes through the closed-form engine of ``bayes_safe.offline.jet``).

Targets (issue 8): >= 200,000 samples/s for IPS; meta-gradient <= 3x IPS per step.
"""

from __future__ import annotations

import statistics

from bayes_safe.offline import (
    IPS,
    MetaGradient,
    Minimax,
    Quadratic,
    ReplicationConstraints,
    mlp_policy,
    skill_routing_logs,
    train_policy,
)

TARGET_SAMPLES = 200_000
TARGET_META_RATIO = 3.0


def measure(method, data, cons, batch_size: int, epochs: int, warmup: int = 1, threads: int = 1,
            seed: int = 0) -> dict:
    """Wall and CPU seconds per timed epoch (median), after ``warmup`` untimed epochs."""
    policy = mlp_policy(data.n_features, data.n_actions, seed=seed)
    res = train_policy(policy, data, cons, method, epochs=warmup + epochs, batch_size=batch_size, seed=seed,
                       threads=threads)
    timed = [h for h in res.history if h["epoch"] > warmup]
    return {"wall": statistics.median(h["seconds"] for h in timed),
            "cpu": statistics.median(h["cpu_seconds"] for h in timed),
            "violating": statistics.median(h["train_violation"] for h in timed)}


def paired_ratio(data, cons, batch_size: int, epochs: int, warmup: int, repeats: int, first=None) -> dict:
    """Meta-gradient over IPS time per step: ``repeats`` runs of each, alternating (so a change
    of load on a shared machine hits both), the median of the per-pair ratios. ``first``: an
    ``(ips, meta)`` pair of ``measure`` results already taken with these settings."""
    pairs = [] if first is None else [first]
    pairs += [(measure(IPS(), data, cons, batch_size, epochs, warmup=warmup),
               measure(MetaGradient(), data, cons, batch_size, epochs, warmup=warmup))
              for _ in range(repeats - len(pairs))]
    return {"cpu_ratios": sorted(m["cpu"] / i["cpu"] for i, m in pairs),
            "wall_ratio": statistics.median(m["wall"] / i["wall"] for i, m in pairs),
            "violating": statistics.median(m["violating"] for _, m in pairs)}


def run(quick: bool = False) -> list[dict]:
    n = 131_072 if quick else 262_144
    epochs = 1 if quick else 2
    repeats = 1 if quick else 3
    data = skill_routing_logs(n, seed=0)
    cons = ReplicationConstraints.from_benchmark("global", data.domain_names)
    methods = [IPS(), Quadratic(10.0), Minimax(eta=0.1, gamma=1.0), MetaGradient()]
    rows = []
    for batch_size in (32_768, 4_096):
        times = {m.name: measure(m, data, cons, batch_size, epochs) for m in methods}
        for m in methods:
            t = times[m.name]
            rate = n / t["wall"]
            row = {"benchmark": f"offline training {m.name}, MLP 39-64-8, B={batch_size}, 1 thread",
                   "value": rate, "unit": "samples/s (wall)", "samples_per_cpu_second": n / t["cpu"],
                   "violating_share": t["violating"]}
            if m.name == "ips":
                row.update(target=f">= {TARGET_SAMPLES:,}", ratio=rate / TARGET_SAMPLES)
            else:
                row.update(target="", ratio=None)
            rows.append(row)
        first = (times["ips"], times["meta"])  # measured just above with the same settings
        rows.append(_ratio_row(paired_ratio(data, cons, batch_size, epochs, 1, repeats, first), batch_size,
                               "after 1 warm-up epoch"))
    if not quick:  # a whole training run: fewer rows violate as it proceeds, and the extra passes shrink
        for batch_size in (32_768, 4_096):
            rows.append(_ratio_row(paired_ratio(data, cons, batch_size, 16, 0, repeats), batch_size,
                                   "median epoch of a 16-epoch run"))
    # two intra-op threads for the large batch (the machine has 2 cores)
    t2 = measure(IPS(), data, cons, 32_768, epochs, threads=2)
    rows.append({"benchmark": "offline training ips, MLP 39-64-8, B=32768, 2 threads", "value": n / t2["wall"],
                 "unit": "samples/s (wall)", "samples_per_cpu_second": n / t2["cpu"], "target": "", "ratio": None})
    return rows


def _ratio_row(r: dict, batch_size: int, when: str) -> dict:
    cpu_ratio = statistics.median(r["cpu_ratios"])
    return {"benchmark": f"meta-gradient / IPS time per step, B={batch_size}, {when}", "value": cpu_ratio,
            "unit": "x (CPU time, median of paired runs)", "cpu_ratio_range": (r["cpu_ratios"][0], r["cpu_ratios"][-1]),
            "wall_ratio": r["wall_ratio"], "violating_share": r["violating"],
            "target": f"<= {TARGET_META_RATIO}", "ratio": TARGET_META_RATIO / cpu_ratio}


if __name__ == "__main__":  # pragma: no cover
    import sys

    for r in run(quick="--quick" in sys.argv):
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()})
