"""The tuned slack of a declared guardrail: what a study's ``tolerance_<metric>`` parameter means.

A tuning study (simulated A/B tests in ``bayes_safe.tuning``, or trials estimated from a decision
log in ``bayes_safe.online.tuning``) tunes how much slack TS-ASC allows around each declared
``Constraint``, one parameter per constraint: for a relative constraint the factor's distance
from 1 (``at_most``: the policy keeps ``metric <= (1 + t) x baseline``; ``at_least``:
``metric >= (1 - t) x baseline``, the paper's alpha; Daulton et al. 2019, section 5.3 tune alpha
this way), for an absolute one the margin added to the level in the metric's units
(``at_most``: ``metric <= level + t``; ``at_least``: ``metric >= level - t``). The declaration
itself stays the study's outcome constraint; a chance constraint keeps its confidence. The
constraint the policy keeps remembers the declared limit (``Constraint.declared``): counters,
reports and ``/metrics`` read the declared limit, the policy enforces the tuned bound.
"""

from __future__ import annotations

from .problem import Constraint

__all__ = ["default_range", "policy_constraint", "tolerance_name"]


def tolerance_name(constraint: Constraint) -> str:
    """``tolerance_<metric>``: the tuned parameter that sets the policy's bound for ``constraint``."""
    return "tolerance_" + "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in constraint.metric)


def policy_constraint(constraint: Constraint, tolerance: float) -> Constraint:
    """The bound TS-ASC keeps for ``constraint`` with tolerance ``t`` (see the module docstring)."""
    t = float(tolerance)
    declared = constraint.declared_bound
    constraint = constraint.as_declared()  # a tolerance is always around the declared limit
    if constraint.versus_baseline:
        factor = 1 + t if constraint.at_most else 1 - t
        if factor <= 0:
            raise ValueError(f"{tolerance_name(constraint)}: {t:g} leaves no factor > 0 of the baseline's "
                             f"{constraint.metric}; expected < 1")
        return Constraint(constraint.metric, factor, constraint.at_most, True, constraint.confidence, declared)
    level = constraint.bound + t if constraint.at_most else constraint.bound - t
    if constraint.at_most and level < 0:
        level = 0.0
    return Constraint(constraint.metric, level, constraint.at_most, False, constraint.confidence, declared)


def default_range(constraint: Constraint) -> dict:
    """The default search range of ``tolerance_name(constraint)``: relative ``[0, 2 |bound - 1|]`` (at
    least 0.02 wide; capped at 0.9 for ``at_least``), absolute ``[-s, s]`` with ``s = |level| / 4``
    (0.1 for a level 0)."""
    if constraint.versus_baseline:
        slack = max(2 * abs(constraint.bound - 1), 0.02)
        high = slack if constraint.at_most else min(slack, 0.9)
        return {"name": tolerance_name(constraint), "low": 0.0, "high": round(float(high), 10)}
    s = round(abs(constraint.bound) / 4, 10) or 0.1
    return {"name": tolerance_name(constraint), "low": -float(s), "high": float(s)}


def _numbered(names: list[str]) -> list[str]:
    """Names made distinct: a repeated name gets ``_2``, ``_3``, ... (two constraints on one metric)."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return out
