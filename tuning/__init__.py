"""Tuning TS-ASC's safety knobs with an Ax/BoTorch outer loop whose trials are A/B tests.

Daulton et al. (2019), section 5.3. The pieces:

* ``ABTest`` evaluates one parameterization (alpha, reward offsets) by a simulated A/B
  test of the policy against the baseline on common random numbers, returning the mean and
  standard error of every metric as a % change against the baseline;
* ``Study`` is the persistent Ax experiment (``ax.api.Client``, Sobol then BoTorch with
  qLogNoisyExpectedImprovement, outcome constraints) in SQLite or a server database, run with
  several trials in flight in local processes or on a Dask cluster, resumable after a crash;
* ``SimulatedProblem`` runs your own ``bayes_safe.envs.Problem`` (``ABTest(problem)`` wraps it):
  TS-ASC with one tuned tolerance per declared constraint, the declarations as outcome constraints;
* ``LoggedDataProblem`` makes the trials off-policy estimates from logged data instead
  of simulations (train on part of the logs, estimate value and violations on the rest);
* ``write_report`` draws the paper's Figure 3 and writes ``report.md``;
* ``MlflowTracker`` (a ``Tracker``) logs every finished trial to MLflow as it finishes
  (``Study(tracker=...)``, ``bayes-safe tune ... --mlflow [URI]``; the ``[mlflow]`` extra).

Example:
    >>> from bayes_safe.tuning import ABTest, Study, VideoUploadProblem, write_report      # doctest: +SKIP
    >>> study = Study(ABTest(n_users=4_000, batches=2), storage="runs/s.sqlite") # doctest: +SKIP
    >>> study.run(trials=20, parallel=2)                                          # doctest: +SKIP
    >>> write_report(study, "runs")                                               # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

from bayes_safe._extras import EXTRA_OF, MissingExtraError

if TYPE_CHECKING:  # the eager imports, for type checkers and IDEs
    from bayes_safe.envs.ab_problem import ABProblem
    from bayes_safe.envs.video_upload import VideoUploadProblem

    from .ab_test import ABTest, Range, make_problem
    from .logged import LoggedDataProblem
    from .own_problem import SimulatedProblem
    from .report import write_report
    from .study import Study, make_generation_strategy
    from .tracking import MlflowTracker, Tracker, TrialRecord

__all__ = [
           "ABProblem",
           "ABTest",
           "LoggedDataProblem",
           "MlflowTracker",
           "Range",
           "SimulatedProblem",
           "Study",
           "Tracker",
           "TrialRecord",
           "VideoUploadProblem",
           "make_generation_strategy",
           "make_problem",
           "write_report",
]

#: public name -> the module that defines it. Imported on first use (PEP 562), so
#: ``bayes_safe.tuning.cli`` builds the ``tune`` parser without torch or Ax. The two problem
#: classes live with the environments (``bayes_safe.envs``) and are re-exported here.
_SOURCES = {
    "ABProblem": "bayes_safe.envs.ab_problem",
    "VideoUploadProblem": "bayes_safe.envs.video_upload",
    "ABTest": ".ab_test",
    "Range": ".ab_test",
    "make_problem": ".ab_test",
    "LoggedDataProblem": ".logged",
    "SimulatedProblem": ".own_problem",
    "write_report": ".report",
    "Study": ".study",
    "make_generation_strategy": ".study",
    "MlflowTracker": ".tracking",
    "Tracker": ".tracking",
    "TrialRecord": ".tracking",
}


def _check_tune_extra() -> None:
    """Fail at ``import bayes_safe.tuning`` with one line naming the extra when a package of
    ``tune`` is missing; looks the packages up without importing them."""
    for package, extra in EXTRA_OF.items():
        if extra != "tune":
            continue
        try:
            found = importlib.util.find_spec(package) is not None
        except ValueError:  # sys.modules[package] is None: the import is blocked
            found = False
        if not found:
            raise MissingExtraError(f"bayes_safe.tuning needs the optional package {package!r}, which is not "
                                    f"installed: pip install 'bayes-safe[{extra}]'", name=package)


_check_tune_extra()


def __getattr__(name: str):
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(source, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
