"""Tuning TS-ASC's safety knobs with an Ax/BoTorch outer loop whose trials are A/B tests.

Daulton et al. (2019), section 5.3. The pieces:

* ``ABTest`` evaluates one parameterization (alpha, reward offsets) by a simulated A/B
  test of the policy against the baseline on common random numbers, returning the mean and
  standard error of every metric as a % change against the baseline;
* ``Study`` is the persistent Ax experiment (``ax.api.Client``, Sobol then BoTorch with
  qLogNoisyExpectedImprovement, outcome constraints) in SQLite or a server database, run with
  several trials in flight in local processes or on a Dask cluster, resumable after a crash;
* ``LoggedDataProblem`` makes the trials off-policy estimates from logged data instead
  of simulations (train on part of the logs, estimate value and violations on the rest);
* ``write_report`` draws the paper's Figure 3 and writes ``report.md``.

Example:
    >>> from bayes_safe.tuning import ABTest, Study, VideoUploadProblem, write_report      # doctest: +SKIP
    >>> study = Study(ABTest(n_users=4_000, batches=2), storage="runs/s.sqlite") # doctest: +SKIP
    >>> study.run(trials=20, parallel=2)                                          # doctest: +SKIP
    >>> write_report(study, "runs")                                               # doctest: +SKIP
"""

from .ab_test import ABProblem, ABTest, Range, VideoUploadProblem, make_problem
from .logged import LoggedDataProblem
from .report import write_report
from .study import Study, make_generation_strategy

__all__ = [
           "ABProblem",
           "ABTest",
           "LoggedDataProblem",
           "Range",
           "Study",
           "VideoUploadProblem",
           "make_generation_strategy",
           "make_problem",
           "write_report",
]
