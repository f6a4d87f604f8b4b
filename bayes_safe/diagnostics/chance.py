"""Is "95 % safe" 95 %? The calibration of chance constraints where it matters: the played actions.

A chance constraint (``Constraint(..., confidence=q)``, TS-ASC) allows an action when the posterior
probability that it meets the bound is at least ``q``. The promise is about the truth: of the
actions it allows and plays, about a share ``q`` (or more) should truly meet the bound. A
simulated problem knows the truth (``expected``), so ``simulate`` records, for every played
action, the probability the policy claimed and whether the truth meets the constraint
(``trace.chance_claims``), and for every candidate the same in reliability bins.
``chance_calibration(trace)`` compares them:

* ``claimed``: the declared level ``q`` and the mean claimed probability of the played allowed
  actions (the fallback's plays excluded: the policy did not claim them safe);
* ``realised``: the share of played allowed actions whose true means meet the constraint, with a
  Wilson score interval (Wilson 1927; each decision counted as an independent Bernoulli trial,
  which understates the width where replications differ), overall and over the last quarter of
  the horizon (``late``);
* ``reliability``: per bin of claimed probability, the played allowed actions' mean claim and
  realised share (a reliability diagram, DeGroot & Fienberg 1983), and ``candidates``: the same
  for every allowed (patient, action) pair of the run, played or not.

``format_chance_calibration`` writes one line per constraint
(``adverse_event <= 0.05: claimed >= 0.95 safe (mean 0.98), realised 0.90 [0.88, 0.92]; last
quarter 0.88 [...]``), the line
``bayes-safe simulate`` prints; ``chance_trial_metrics`` flattens it into the per-trial numbers a
tuning study can record.
"""

from __future__ import annotations

import itertools
import math

import torch

__all__ = ["chance_calibration", "chance_trial_metrics", "format_chance_calibration", "wilson_interval"]


def wilson_interval(successes: float, n: float, level: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (``(nan, nan)`` when ``n = 0``)."""
    if n <= 0:
        return float("nan"), float("nan")
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _share(met: torch.Tensor, level: float) -> dict:
    n = int(met.numel())
    k = float(met.double().sum()) if n else 0.0
    low, high = wilson_interval(k, n, level)
    return {"realised": k / n if n else float("nan"), "interval": [low, high], "n": n}


def _bin_labels(edges) -> list[str]:
    cuts = [0.0, *edges]
    labels = [f"[{a:g}, {b:g})" for a, b in itertools.pairwise(cuts)]
    return [*labels, "1 (all draws)"]


def chance_calibration(trace, late: float = 0.25, level: float = 0.95) -> list[dict]:
    """Per chance constraint of the policy that ran (``trace.chance_claims``), its calibration on
    the played actions (module docstring).

    Args:
        trace: a ``Trace`` from ``simulate`` of a policy with chance constraints, on a problem that
            knows its means.
        late: the share of the horizon at the end summarised separately (default the last quarter).
        level: the level of the Wilson intervals.

    Returns:
        one dict per chance constraint: ``constraint`` (its label), ``metric``, ``confidence``
        (the declared ``q``), ``claimed`` (mean claimed probability of the played allowed actions),
        ``realised``, ``interval`` and ``n`` (the played allowed actions), ``late`` (the same keys
        over the last ``late`` share of steps, plus ``claimed``), ``shortfall`` (``q -
        realised``, positive when the claim is not kept), ``fallback_share`` (the share of plays
        that were not allowed), ``reliability`` (played allowed actions per bin: ``bin``, ``n``,
        ``claimed``, ``realised``, ``interval``) and ``candidates`` (every allowed candidate pair:
        ``realised``, ``interval``, ``n``, ``reliability``).

    Raises:
        ValueError: the trace has no chance record (the policy had no chance constraint, or the
            trace was read from a file), or the problem gave no means.
    """
    record = getattr(trace, "chance_claims", None)
    if record is None:
        raise ValueError("chance_calibration: this trace has no chance record (trace.chance_claims); it is made by "
                         "simulate for a policy with chance constraints (TSASC with Constraint(..., confidence=q)), "
                         "and is kept in memory only (not in a NetCDF file)")
    if not record.get("truth_available", True):
        raise ValueError("chance_calibration: the problem gave no expected outcomes, so the truth of each claim "
                         "is unknown")
    if not 0.0 < late <= 1.0:
        raise ValueError(f"late: expected a share of the horizon in (0, 1], got {late!r}")
    claimed, met, allowed = record["claimed"], record["met"], record["allowed"]
    T = claimed.shape[0]
    start = T - max(1, round(T * late))
    labels = _bin_labels(record["edges"])
    edges = torch.tensor(record["edges"], dtype=torch.float64)
    out = []
    for j, (label, q) in enumerate(zip(record["labels"], record["confidence"])):
        c, m = claimed[..., j], met[..., j]
        overall = _share(m[allowed], level)
        late_part = _share(m[start:][allowed[start:]], level)
        late_part["claimed"] = float(c[start:][allowed[start:]].mean()) if late_part["n"] else float("nan")
        bins = torch.bucketize(c[allowed], edges, right=True)
        played_rows = []
        for b, name in enumerate(labels):
            sel = bins == b
            if bool(sel.any()):
                row = _share(m[allowed][sel], level)
                played_rows.append({"bin": name, "claimed": float(c[allowed][sel].mean()), **row})
        cand = {}
        if "count" in record:
            n = record["count"][:, j, 1].sum(0)  # [B]: allowed candidates by bin
            k = record["met_count"][:, j, 1].sum(0)
            s = record["claimed_sum"][:, j, 1].sum(0)
            total, hits = float(n.sum()), float(k.sum())
            low, high = wilson_interval(hits, total, level)
            cand = {"realised": hits / total if total else float("nan"), "interval": [low, high], "n": int(total),
                    "reliability": [{"bin": name, "n": int(n[b]), "claimed": float(s[b] / n[b]),
                                     "realised": float(k[b] / n[b]),
                                     "interval": list(wilson_interval(float(k[b]), float(n[b]), level))}
                                    for b, name in enumerate(labels) if n[b] > 0]}
        constraint = record.get("constraints", [{}] * len(record["labels"]))[j]
        out.append({"constraint": label, "metric": constraint.get("metric", label.split(" ")[0]), "confidence": q,
                    "claimed": float(c[allowed].mean()) if overall["n"] else float("nan"), **overall,
                    "shortfall": q - overall["realised"], "late": late_part,
                    "fallback_share": float((~allowed).double().mean()), "reliability": played_rows,
                    "candidates": cand})
    return out


def format_chance_calibration(rows: list[dict]) -> list[str]:
    """One line per constraint: ``adverse_event <= 0.05: claimed >= 0.95 safe (mean 0.98), realised
    0.90 [0.88, 0.92] of 1200 plays; last quarter 0.88 [0.84, 0.91]; fallback 3.1 %``."""
    lines = []
    for r in rows:
        lo, hi = r["interval"]
        late = r["late"]
        llo, lhi = late["interval"]
        lines.append(f"{r['constraint']}: claimed >= {r['confidence']:g} safe (mean {r['claimed']:.2f}), "
                     f"realised {r['realised']:.2f} [{lo:.2f}, {hi:.2f}] of {r['n']} plays; last quarter "
                     f"{late['realised']:.2f} [{llo:.2f}, {lhi:.2f}]; fallback {100 * r['fallback_share']:.1f} %")
    return lines


def chance_trial_metrics(trace, late: float = 0.25) -> dict[str, float]:
    """Flat per-trial numbers of ``chance_calibration`` for a tuning study, per chance constraint on
    metric ``m``: ``m_chance_claimed`` (declared level), ``m_chance_realised`` and
    ``m_chance_realised_late`` (shares of played allowed actions truly meeting it),
    ``m_chance_shortfall_late`` (claimed minus realised, late) and ``m_chance_fallback`` (share of
    plays that fell back). Empty when the trace has no chance record."""
    if getattr(trace, "chance_claims", None) is None:
        return {}
    out: dict[str, float] = {}
    for r in chance_calibration(trace, late=late):
        key = r["metric"] if f"{r['metric']}_chance_claimed" not in out else r["constraint"]
        out[f"{key}_chance_claimed"] = float(r["confidence"])
        out[f"{key}_chance_realised"] = float(r["realised"])
        out[f"{key}_chance_realised_late"] = float(r["late"]["realised"])
        out[f"{key}_chance_shortfall_late"] = float(r["confidence"] - r["late"]["realised"])
        out[f"{key}_chance_fallback"] = float(r["fallback_share"])
    return out
