"""Experiments: batched runs of a policy against a problem that need more than ``simulate``.

``bayes_safe.simulation.simulate`` runs one policy on a problem that shows candidates every
step and returns a ``Trace``. Some papers' experiments have a protocol of their own; their
runners live here, above the models, policies and problems they combine and below the
studies, the tuning loop and the command line that use them.

* ``bcts``: behaviour-constrained Thompson sampling (Balakrishnan et al. 2018, s.5): a
  teaching phase that learns the constraint posterior from a teacher's verdicts, then an
  online phase where every ``sigma_online`` x teaching strategy x budget x replication (and
  the Constraint Mask) advances in one batch on common random numbers (``run_bcts``,
  ``BCTSResult``, ``SharedStreams``, the paper's Figure 1 plots). The problem it runs on,
  ``BCTSProblem``, is in ``bayes_safe.envs``.
"""

from .bcts import (
    PAPER_SIGMAS,
    BCTSResult,
    SharedStreams,
    plot_bcts,
    plot_errors_by_budget,
    run_bcts,
)

__all__ = ["PAPER_SIGMAS", "BCTSResult", "SharedStreams", "plot_bcts", "plot_errors_by_budget", "run_bcts"]
