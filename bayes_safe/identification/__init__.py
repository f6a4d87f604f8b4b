"""Learning unknown constraints: constrained linear best-arm identification (Lindner et al. 2022).

A decision maker knows the reward ``theta^T x`` of every arm (controller, recipe, ...) but not
the constraint ``phi^T x <= tau``, which can only be queried with noise (a person's judgement).
The learners here choose which arm to query next, keep confidence intervals on ``phi^T x``,
and stop once the best feasible arm is certain (section 3 of the paper):

>>> from bayes_safe.identification import irrelevant_dimensions, ACOL, GACOL, simulate
>>> problem = irrelevant_dimensions(d=5, epsilon=0.1)
>>> learner = GACOL(problem.arms, problem.theta, problem.tau, beta=0.25, seed=0)
>>> result = simulate(learner, problem, seed=1)
>>> result.finished, result.correct
(True, True)

Modules: ``.design`` (optimal designs, rounding), ``.problems`` (CBAI instances),
``.algorithms`` (ACOL, G-ACOL, the baselines of Table D.2, the step interface),
``.driving`` (the driving application of appendix C).
"""

from __future__ import annotations

import contextlib

from .algorithms import (
    ACOL,
    ALGORITHMS,
    CONVENTIONS,
    GACOL,
    TUNED_BETA,
    ConstraintLearner,
    GAllocation,
    Greedy,
    IdentificationResult,
    Oracle,
    RoundBased,
    Uniform,
    convention_options,
    make_learner,
    simulate,
)
from .design import (
    DesignResult,
    DesignWarning,
    design_value,
    optimal_design,
    round_design,
    rounding_min_samples,
)
from .problems import CBAIProblem, connected_1d, irrelevant_dimensions, unit_sphere

__all__ = [
    "ACOL",
    "ALGORITHMS",
    "CONVENTIONS",
    "GACOL",
    "TUNED_BETA",
    "CBAIProblem",
    "ConstraintLearner",
    "DesignResult",
    "DesignWarning",
    "GAllocation",
    "Greedy",
    "IdentificationResult",
    "Oracle",
    "RoundBased",
    "Uniform",
    "connected_1d",
    "convention_options",
    "design_value",
    "irrelevant_dimensions",
    "make_learner",
    "optimal_design",
    "round_design",
    "rounding_min_samples",
    "simulate",
    "single_blas_thread",
    "unit_sphere",
]


@contextlib.contextmanager
def single_blas_thread():
    """Limit BLAS (OpenBLAS/MKL) to one thread inside the block.

    The design solver and the learners multiply small matrices in loops; measured on this
    project's loaded 2-core machines, a 1,000-arm, d = 50 design took 0.06 s with one BLAS
    thread and 0.2 to 2.5 s with two. A no-op if ``threadpoolctl`` is not installed.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        yield
        return
    with threadpool_limits(1):
        yield
