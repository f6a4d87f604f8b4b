"""Running the learners over seeds and summarising the number of queries (the acol studies).

Used by ``studies/acol_synthetic.py`` and ``studies/acol_driving.py`` (Lindner et al. 2022,
figures 2, 3 and 5: medians over seeds of the number of queries until ``U`` is empty).
"""

from __future__ import annotations

import numpy as np

from .algorithms import ALGORITHMS, Greedy, make_learner, simulate, simulate_greedy_batch

__all__ = ["fmt_median", "run_algorithm", "summarise"]


def run_algorithm(name: str, problems: list, seeds: list[int], *, budget: int, beta=None) -> list[dict]:
    """Run ``name`` once per (problem, seed) pair; greedy learners in one vectorised batch.

    Learner seed ``s``; the answers' noise seed ``s + 10_000`` (round-based) or
    ``SeedSequence(s)`` (greedy batch). ``S = ||phi||`` (the simulator knows it) for Proposition 3.
    """
    cls, fixed = ALGORITHMS[name]
    out = []
    if issubclass(cls, Greedy):
        b = fixed["beta"] if beta is None else beta
        res = simulate_greedy_batch(problems, rule=fixed["rule"], pool=fixed["pool"], beta=b, seeds=seeds,
                                    max_queries=budget)
        for r in res:
            out.append({"queries": r.queries, "finished": r.finished, "correct": bool(r.correct)})
        return out
    for p, s in zip(problems, seeds):
        learner = make_learner(name, p.arms, p.theta, p.tau, phi=p.phi, feedback=p.feedback, seed=s)
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
