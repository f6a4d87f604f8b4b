"""Running the learners over seeds and summarising the number of queries (the acol studies).

Used by ``studies/acol_synthetic.py`` and ``studies/acol_driving.py`` (Lindner et al. 2022,
figures 2, 3 and 5: medians over seeds of the number of queries until ``U`` is empty).
"""

from __future__ import annotations

import contextlib
import math
import re
import warnings

import numpy as np

from .algorithms import (
    ALGORITHMS,
    Greedy,
    convention_options,
    make_learner,
    simulate,
    simulate_greedy_batch,
)
from .design import DesignWarning

__all__ = ["fmt_median", "record_design_warnings", "run_algorithm", "summarise"]


@contextlib.contextmanager
def record_design_warnings(gaps: list):
    """Collect the certified gaps of the designs that hit the solver's iteration cap inside the
    block (``DesignWarning``) into ``gaps`` instead of printing one warning per round; other
    warnings pass through. The studies report how many there were and the largest gap."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DesignWarning)
        yield gaps
    for w in caught:
        if issubclass(w.category, DesignWarning):
            m = re.search(r"relative gap of (\S+) >", str(w.message))
            gaps.append(float(m.group(1)) if m else math.inf)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def run_algorithm(name: str, problems: list, seeds: list[int], *, budget: int, beta=None,
                  convention: str = "paper") -> list[dict]:
    """Run ``name`` once per (problem, seed) pair; greedy learners in one vectorised batch.

    Learner seed ``s``; the answers' noise seed ``s + 10_000`` (round-based) or
    ``SeedSequence(s)`` (greedy batch). ``S = ||phi||`` (the simulator knows it) for Proposition 3.
    ``convention``: ``"paper"`` or ``"authors"`` (``algorithms.convention_options``, issue 16).
    """
    cls, fixed = ALGORITHMS[name]
    conv = convention_options(name, convention)
    out = []
    if issubclass(cls, Greedy):
        b = fixed["beta"] if beta is None else beta
        res = simulate_greedy_batch(problems, rule=conv.get("rule", fixed["rule"]), pool=fixed["pool"], beta=b,
                                    seeds=seeds, max_queries=budget)
        for r in res:
            out.append({"queries": r.queries, "finished": r.finished, "correct": bool(r.correct)})
        return out
    for p, s in zip(problems, seeds):
        learner = make_learner(name, p.arms, p.theta, p.tau, phi=p.phi, feedback=p.feedback, seed=s,
                               convention=convention)
        r = simulate(learner, p, seed=s + 10_000, max_queries=budget)
        out.append({"queries": r.queries, "finished": r.finished, "correct": bool(r.correct)})
    return out


def summarise(runs: list[dict], budget: int) -> dict:
    """Median and quartiles of the number of queries; runs stopped by the budget count as the
    budget (a lower bound), and ``censored`` says how many there were."""
    q = np.array([r["queries"] if r["finished"] else budget for r in runs], dtype=float)
    fin = np.array([r["finished"] for r in runs])
    ok = np.array([r["correct"] for r in runs])
    med = float(np.median(q))
    return {"median": med, "q25": float(np.percentile(q, 25)), "q75": float(np.percentile(q, 75)),
            "censored": int((~fin).sum()), "median_is_lower_bound": bool((~fin).sum() * 2 >= len(runs)),
            "correct_fraction": float(ok.mean()), "finished_fraction": float(fin.mean()), "runs": len(runs),
            "budget": budget}


def fmt_median(s: dict) -> str:
    m = s["median"]
    txt = f"{m:,.0f}"
    if s["median_is_lower_bound"]:
        txt = ">= " + txt
    if s["censored"]:
        txt += f" ({s['censored']} of {s['runs']} hit the budget)"
    return txt
