"""The tuned slack of a declared guardrail: what a study's ``tolerance_<metric>`` parameter means.

A tuning study (simulated A/B tests in ``bayes_safe.tuning``, or trials estimated from a decision
log in ``bayes_safe.online.tuning``) tunes how much slack TS-ASC allows around each declared
``Constraint``, one parameter per constraint. **One meaning in every form: the slack around the
declared limit**, so ``t = 0`` is the declared limit itself and a positive ``t`` is looser:

=====================================  ===============================
declared                               the policy keeps
=====================================  ===============================
``absolute(m, at_most=cap)``           ``m <= cap + t`` (clipped at 0)
``absolute(m, at_least=floor)``        ``m >= floor - t``
``relative(m, at_most=c)``             ``m <= (c + t) x baseline``
``relative(m, at_least=c)``            ``m >= (c - t) x baseline``
=====================================  ===============================

(Until issue 41 a relative tolerance was the factor's distance from 1, ``(1 - t) x baseline``, so
that ``t`` was the paper's alpha (Daulton et al. 2019, section 5.3) and ``t = 0`` meant "no worse
than the baseline" whatever the declared factor: a user who read ``tolerance_revenue = 0`` as the
declared 0.95 served 1.00. The paper's alpha is ``TSASC(alpha=...)``; a declared ``relative(m,
at_least=1 - alpha)`` at ``t = 0`` is the same policy. ``TOLERANCE_MEANING`` names the rule;
studies record it, and a stored study tuned under the old rule with a relative constraint is
refused on resume and deploy with a message saying so.) The declaration itself stays the
study's outcome constraint; a chance constraint keeps its confidence. The
constraint the policy keeps remembers the declared limit (``Constraint.declared``): counters,
reports and ``/metrics`` read the declared limit, the policy enforces the tuned bound.

A study may also tune a constraint's ``confidence`` (``confidence_<metric>``, ``confidence_name``):
a number in (0, 1) makes the policy's constraint a chance constraint required with that posterior
probability, ``"none"`` the single-draw test (``with_confidence``).

Lower ``t`` is stricter in every form (``at_most``: a lower cap or factor; ``at_least``: a higher
floor or factor). ``strictest_tolerance`` is how far a study may push it: the tolerance that
makes an absolute cap 0 (``-level``) or a relative cap's factor 0.05 (``t = 0.05 - c``); a floor,
which has no natural end, at most twice its declared limit.
"""

from __future__ import annotations

from .problem import Constraint

#: the rule a tolerance follows (module docstring), recorded by every study: the slack around the
#: declared limit in every form (absolute and relative alike)
TOLERANCE_MEANING = "around-declared"

__all__ = ["TOLERANCE_MEANING", "confidence_name", "default_range", "parse_confidence", "policy_constraint", "strictest_tolerance",
           "tolerance_name", "with_confidence"]


def tolerance_name(constraint: Constraint) -> str:
    """``tolerance_<metric>``: the tuned parameter that sets the policy's bound for ``constraint``."""
    return "tolerance_" + "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in constraint.metric)


def confidence_name(constraint: Constraint) -> str:
    """``confidence_<metric>``: the tuned parameter that sets the confidence of ``constraint`` in the policy."""
    return "confidence_" + tolerance_name(constraint).removeprefix("tolerance_")


def parse_confidence(value, name: str = "confidence"):
    """A tuned confidence: a probability in (0, 1) (a number, or a choice's string ``"0.95"``), or
    ``None`` for ``"none"`` / None (the single-draw test). Anything else is a ``ValueError`` naming ``name``."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    try:
        q = float(value)
    except (TypeError, ValueError):
        q = float("nan")
    if isinstance(value, bool) or not 0 < q < 1:
        raise ValueError(f"parameters: {name!r} expected a probability in (0, 1) (e.g. 0.95) or 'none' (the "
                         f"single-draw test), got {value!r}")
    return q


def with_confidence(constraint: Constraint, confidence) -> Constraint:
    """``constraint`` with its policy ``confidence`` replaced (``parse_confidence``); bound and
    declared limit unchanged."""
    q = parse_confidence(confidence, confidence_name(constraint))
    return Constraint(constraint.metric, constraint.bound, constraint.at_most, constraint.versus_baseline, q,
                      constraint.declared)


def strictest_tolerance(constraint: Constraint) -> float:
    """The lowest (strictest) tolerance worth searching for ``constraint``: for a cap, ``-level``
    (absolute: the policy's cap reaches 0) or ``0.05 - c`` (relative: a factor of 0.05 of the
    baseline); for a floor, which has no natural end, twice the declared limit: ``-|level|``
    (absolute: a floor of ``2 x level``) or ``-c`` (relative: a factor of ``2 c``)."""
    c = constraint.as_declared()
    if c.versus_baseline:
        return round(0.05 - float(c.bound), 10) if c.at_most else -abs(float(c.bound))
    return -abs(float(c.bound))


def policy_constraint(constraint: Constraint, tolerance: float, confidence=...) -> Constraint:
    """The bound TS-ASC keeps for ``constraint`` with tolerance ``t`` (see the module docstring);
    ``confidence`` (when given: a probability, or None / ``"none"`` for the single-draw test)
    replaces the constraint's own."""
    if confidence is not ...:
        constraint = with_confidence(constraint, confidence)
    t = float(tolerance)
    declared = constraint.declared_bound
    constraint = constraint.as_declared()  # a tolerance is always around the declared limit
    if constraint.versus_baseline:
        c = float(constraint.bound)
        factor = c + t if constraint.at_most else c - t
        if factor <= 0:
            raise ValueError(f"{tolerance_name(constraint)}: {t:g} leaves no factor > 0 of the baseline's "
                             f"{constraint.metric} (declared factor {c:g}; the policy keeps "
                             f"{'c + t' if constraint.at_most else 'c - t'}); expected "
                             f"{'>' if constraint.at_most else '<'} {-c if constraint.at_most else c:g}")
        return Constraint(constraint.metric, factor, constraint.at_most, True, constraint.confidence, declared)
    level = constraint.bound + t if constraint.at_most else constraint.bound - t
    if constraint.at_most and level < 0:
        level = 0.0
    return Constraint(constraint.metric, level, constraint.at_most, False, constraint.confidence, declared)


def default_range(constraint: Constraint) -> dict:
    """The default search range of ``tolerance_name(constraint)``, around the declared limit (``t = 0``):
    relative ``[-s, s]`` with ``s = |c - 1|`` (at least 0.01; for ``at_least`` the factor ``c - t``
    kept >= 0.1), so the factors searched run from the declared ``c`` to the baseline's 1 and as far
    beyond it; absolute ``[-s, s]`` with ``s = |level| / 4`` (0.1 for a level 0)."""
    if constraint.versus_baseline:
        c = float(constraint.bound)
        s = max(abs(c - 1), 0.01)
        high = s if constraint.at_most else min(s, c - 0.1)
        return {"name": tolerance_name(constraint), "low": round(-s, 10), "high": round(float(high), 10)}
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
