"""Metrics computed from a ``Trace`` (Daulton 2019 s.4; Kazerouni 2017 eq. 3)."""

from __future__ import annotations

import torch

from .trace import Trace

__all__ = [
    "cumulative_constraint_satisfied",
    "cumulative_regret",
    "fallback_breakdown",
    "mean_and_sem",
    "moving_average",
    "normalized_constraint",
    "summary",
    "violation_breakdown",
    "violation_rate",
]


def mean_and_sem(x: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard error of the mean over ``dim`` (replications)."""
    n = x.shape[dim]
    mean = x.mean(dim)
    sem = x.std(dim) / n**0.5 if n > 1 else torch.zeros_like(mean)
    return mean, sem


def cumulative_regret(trace: Trace) -> torch.Tensor:
    """``[T, R]`` cumulative pseudo-regret (Kazerouni eq. 2)."""
    return trace.regret.cumsum(0)


def moving_average(x: torch.Tensor, window: int) -> torch.Tensor:
    """Trailing moving average over the first (step) dimension with ``window`` steps; ``[T, ...]``."""
    if window < 1:
        raise ValueError(f"window: expected >= 1, got {window}")
    x = x.to(torch.float64)
    c = torch.cat([torch.zeros_like(x[:1]), x.cumsum(0)])
    t = torch.arange(1, x.shape[0] + 1)
    lo = (t - window).clamp_min(0)
    n = (t - lo).to(torch.float64).reshape(-1, *([1] * (x.dim() - 1)))
    return (c[t] - c[lo]) / n


def violation_rate(trace: Trace, window: int = 100) -> torch.Tensor:
    """Moving average of the instance-level violation indicator, ``[T, R]`` (Daulton Figure 1b);
    NaN when the problem gave no expected outcomes (violations unknown)."""
    if not trace.regret_available:
        return torch.full(trace.violation.shape, float("nan"), dtype=torch.float64)
    return moving_average(trace.violation, window)


def cumulative_constraint_satisfied(trace: Trace, metric: int = 0, alpha: float | None = None) -> torch.Tensor:
    """Kazerouni eq. (3), ``sum_i E[m | a_i] >= (1 - alpha) sum_i E[m | b_i]`` at every step: ``[T, R]`` bool.

    ``metric=0`` checks the reward (CLUCB); ``metric=1`` the constraint metric (CLUCB2-ASC-C).
    """
    alpha = trace.alpha if alpha is None else alpha
    if alpha is None:
        raise ValueError("alpha: the trace has no alpha; pass one")
    played = trace.expected[..., metric].cumsum(0)
    base = trace.baseline_expected[..., metric].cumsum(0)
    return played >= (1 - alpha) * base


def normalized_constraint(trace: Trace, metric: int = 1) -> torch.Tensor:
    """Expected constraint value of the played action over the baseline's, ``[T, R]`` (Daulton Fig. 2b)."""
    return trace.expected[..., metric] / trace.baseline_expected[..., metric]


def _share(part: torch.Tensor, whole: torch.Tensor) -> float | None:
    """``part.sum() / whole.sum()`` of two bool tensors as a float; None when ``whole`` is empty."""
    n = int(whole.sum())
    return int(part.sum()) / n if n else None


def violation_breakdown(trace: Trace) -> list[dict]:
    """Per declared constraint (declaration order), how often the plays broke it and how much of
    that the baseline's own plays caused (``Trace.constraint_violation``; ``simulate`` step 4).

    Each entry: ``constraint`` (its label, ``Trace.constraint_labels``), ``metric``, ``form``
    (``"relative"`` or ``"absolute"``), ``confidence`` (None for the papers' single-draw test;
    a chance constraint is counted against the true mean like any other), and

    * ``violations``: the number of plays that broke it; ``violation_rate`` their share of all
      ``T x R`` plays, with ``violation_rate_sem`` over replications;
    * ``baseline_share``: the share of those violating plays that were plays of the baseline
      action (None when there were none);
    * ``baseline_violation_rate_when_played``: the share of the baseline's plays that broke it
      (None when the baseline was never played);
    * ``baseline_violation_rate``: the share of all units whose baseline action breaks it,
      played or not (from ``baseline_expected``; 0 for a relative constraint, which the
      baseline action cannot break);
    * the fallback's part (``Trace.fallback``; all None when the policy cannot fall back):
      ``fallbacks`` / ``fallback_rate``: the fallback plays this constraint bound (the policy's
      guard declared as this constraint, ``Trace.fallback_by``; None when the policy has no such
      guard) and their share of all plays; ``violations_fallback`` / ``violations_allowed``: the
      violations of this constraint in fallback plays (any guard bound) and in the plays of an
      allowed action; ``fallback_violation_share``: the first over all violations (None when
      there were none); ``violation_rate_when_fallback`` / ``violation_rate_when_allowed``: the
      share of fallback plays, and of allowed plays, that broke it (None when there were none).

    Every rate is None when the problem gave no means (``trace.regret_available`` False). An
    empty list when the trace has no ``constraint_violation`` (not recorded, or an older file
    with several constraints).
    """
    broken = trace.constraint_violation
    if broken is None:
        return []
    constraints = trace.constraints()
    labels = trace.constraint_labels()
    played = trace.baseline_played
    guard_of = _guards_of_constraints(trace, constraints) if len(constraints) == broken.shape[-1] else {}
    names = list(trace.metric_names)
    out = []
    for j, label in enumerate(labels):
        c = constraints[j] if len(constraints) == broken.shape[-1] else None
        entry = {"constraint": label, "metric": None if c is None else c.metric,
                 "form": None if c is None else ("relative" if c.versus_baseline else "absolute"),
                 "confidence": None if c is None else c.confidence}
        keys = ("violations", "violation_rate", "violation_rate_sem", "baseline_share",
                "baseline_violation_rate_when_played", "baseline_violation_rate")
        entry.update(dict.fromkeys(keys))
        entry.update(dict.fromkeys(_FALLBACK_KEYS))
        if trace.fallback is not None:
            g = guard_of.get(j)
            if g is not None:
                bound = trace.fallback_by[..., g]
                entry.update(fallbacks=int(bound.sum()), fallback_rate=float(bound.double().mean()))
        if trace.regret_available:
            b = broken[..., j]
            _, s = mean_and_sem(b.double().mean(0))
            entry.update(violations=int(b.sum()), violation_rate=float(b.double().mean()), violation_rate_sem=float(s))
            if played is not None:
                entry["baseline_share"] = _share(b & played, b)
                entry["baseline_violation_rate_when_played"] = _share(b & played, played)
            if c is not None and not c.versus_baseline and trace.baseline_expected is not None and c.metric in names:
                value = trace.baseline_expected[..., names.index(c.metric)]
                entry["baseline_violation_rate"] = float((~c.satisfied(value[..., None], value)[..., 0]).double().mean())
            elif c is not None and c.versus_baseline:
                entry["baseline_violation_rate"] = 0.0
            if trace.fallback is not None:
                fell = trace.fallback
                in_fallback, in_allowed = int((b & fell).sum()), int((b & ~fell).sum())
                entry.update(violations_fallback=in_fallback, violations_allowed=in_allowed,
                             fallback_violation_share=_share(b & fell, b),
                             violation_rate_when_fallback=_share(b & fell, fell),
                             violation_rate_when_allowed=_share(b & ~fell, ~fell))
        out.append(entry)
    return out


#: violation_breakdown's fallback entries (None when the policy cannot fall back)
_FALLBACK_KEYS = ("fallbacks", "fallback_rate", "violations_fallback", "violations_allowed", "fallback_violation_share",
                  "violation_rate_when_fallback", "violation_rate_when_allowed")


def _guards_of_constraints(trace: Trace, constraints: list) -> dict[int, int]:
    """``{problem constraint j: the policy's guard g declared the same}`` (``Trace.fallback_by``'s
    column), the first such guard; constraints no guard matches are left out. When no guard is
    declared exactly the same but the policy has one guard per constraint, in order, on the same
    metrics, forms and directions (a tuned bound or confidence), they are matched in order."""
    guards = trace.attrs.get("fallback_constraints", ()) or ()
    out = {}
    for j, c in enumerate(constraints):
        for g, d in enumerate(guards):
            if isinstance(d, dict) and d == c.to_dict():
                out[j] = g
                break
    if not out and len(guards) == len(constraints):
        def shape(d):
            return (d.get("metric"), d.get("at_most"), d.get("versus_baseline")) if isinstance(d, dict) else None

        if all(shape(d) == shape(c.to_dict()) for d, c in zip(guards, constraints)):
            out = {j: j for j in range(len(constraints))}
    return out


def _late(x: torch.Tensor) -> torch.Tensor:
    """The last quarter of the steps of ``x [T, ...]`` (at least one step)."""
    T = x.shape[0]
    return x[T - max(1, T // 4):]


def fallback_breakdown(trace: Trace) -> dict | None:
    """How often the policy played its fallback (``Trace.fallback``): None when it cannot fall back.

    ``fallbacks`` (plays), ``fallback_rate`` (share of all ``T x R`` plays) with
    ``fallback_rate_sem`` over replications, ``fallback_rate_late`` (the last quarter of the
    steps), and ``guards``: per guard of the policy (``Trace.fallback_labels``), ``constraint``,
    ``fallbacks``, ``fallback_rate`` and ``fallback_rate_late`` of the fallback plays that guard
    bound (its verdict did not judge the played action to meet it). A fallback can be bound by
    several guards, so the guards' counts may add to more than ``fallbacks``.
    """
    fell = trace.fallback
    if fell is None:
        return None
    _, sem = mean_and_sem(fell.double().mean(0))
    out = {"fallbacks": int(fell.sum()), "fallback_rate": float(fell.double().mean()), "fallback_rate_sem": float(sem),
           "fallback_rate_late": float(_late(fell).double().mean()), "guards": []}
    for g, label in enumerate(trace.fallback_labels()):
        bound = trace.fallback_by[..., g]
        out["guards"].append({"constraint": label, "fallbacks": int(bound.sum()),
                              "fallback_rate": float(bound.double().mean()),
                              "fallback_rate_late": float(_late(bound).double().mean())})
    return out


def _normalized_constraint_applies(trace: Trace) -> bool:
    """Whether ``normalized_constraint`` (metric 1 over the baseline's) is a figure of the declared
    forms: yes unless every constraint declared on metric 1 is absolute (a level, not a ratio to
    the baseline). Kept for the papers' relative constraints and for problems without declarations."""
    if len(trace.metric_names) < 2:
        return False
    on_metric1 = [c for c in trace.constraints() if c.metric == trace.metric_names[1]]
    return not on_metric1 or any(c.versus_baseline for c in on_metric1)


def _violation_entries(trace: Trace, out: dict) -> None:
    """``summary``'s violation figures: who caused them (any constraint) and one entry per constraint."""
    available = trace.regret_available
    played = trace.baseline_played
    out["baseline_play_rate"] = float(played.double().mean()) if played is not None else None
    any_broken = trace.violation
    out["violation_baseline_share"] = (_share(any_broken & played, any_broken)
                                       if available and played is not None and any_broken is not None else None)
    if trace.constraint_violation is not None:
        out["constraints"] = violation_breakdown(trace)
    out["fallback"] = fallback_breakdown(trace)


def summary(trace: Trace) -> dict:
    """Headline numbers of a run, as plain floats (mean and SEM over replications).

    ``violation_rate``: the share of plays that broke any declared constraint in expectation
    (the baseline's plays included); ``violation_baseline_share``: the share of those violating
    plays that were plays of the baseline action; ``baseline_play_rate``: the share of all plays
    that were; ``constraints``: one entry per declared constraint (``violation_breakdown``);
    ``fallback``: how often the policy played its fallback, overall, late and per guard
    (``fallback_breakdown``; None when the policy cannot fall back).
    ``normalized_constraint_last100_*`` (metric 1 over the baseline's, last 100 steps; Daulton
    et al. 2019 Figure 2b) only when it means something for the declarations: not when metric 1
    is guarded by absolute constraints only (a cap is a level, not a ratio to the baseline).

    When the problem gave no expected outcomes (``trace.regret_available`` False), the regret,
    violation and normalized-constraint entries are ``None`` (unavailable), never 0.
    """
    if not trace.regret_available:
        out = {"horizon": trace.horizon, "replications": trace.replications, "regret_available": False,
               "final_cumulative_regret_mean": None, "final_cumulative_regret_sem": None,
               "mean_per_step_regret": None, "violation_rate": None}
        if trace.alpha is not None:
            out["alpha"] = float(trace.alpha)
        if _normalized_constraint_applies(trace):
            out["normalized_constraint_last100_mean"] = None
            out["normalized_constraint_last100_sem"] = None
        _violation_entries(trace, out)
        for k in ("elapsed_seconds", "decisions_per_second"):
            if k in trace.attrs:
                out[k] = float(trace.attrs[k])
        return out
    cum = cumulative_regret(trace)[-1]
    m, s = mean_and_sem(cum)
    out = {
        "horizon": trace.horizon,
        "replications": trace.replications,
        "final_cumulative_regret_mean": float(m),
        "final_cumulative_regret_sem": float(s),
        "mean_per_step_regret": float(trace.regret.mean()),
        "violation_rate": float(trace.violation.double().mean()),
    }
    if trace.alpha is not None:
        out["alpha"] = float(trace.alpha)
    if _normalized_constraint_applies(trace):
        last = normalized_constraint(trace)[-min(100, trace.horizon):].mean(0)
        m, s = mean_and_sem(last)
        out["normalized_constraint_last100_mean"] = float(m)
        out["normalized_constraint_last100_sem"] = float(s)
    _violation_entries(trace, out)
    for k in ("elapsed_seconds", "decisions_per_second"):
        if k in trace.attrs:
            out[k] = float(trace.attrs[k])
    return out
