"""Look inside posteriors: ArviZ InferenceData, summaries, plots, calibration, coverage.

One concept per module; every public name is re-exported here, so
``from bayes_safe.diagnostics import save_models`` keeps working:

* ``conversion``: ``to_inference_data`` converts every posterior model of the toolkit into an
  ``arviz.InferenceData`` with several chains (4 by default, so ``az.rhat`` is defined): exact
  draws for conjugate models (``BayesianLinear``, ``PerArmLinear``, the per-arm
  ``CTSPosterior`` of BCTS), independent copies of the Gibbs and Langevin chains with every
  latent variable (the horseshoe's scales, mixing variances, the noise), chains with sample
  statistics for NUTS, guide draws for SVI, and draws of the latent function at given points
  for the probit GP (``ProbitGP`` and its views); with ``log_likelihood`` (pointwise, so
  ``az.loo`` and ``az.compare`` work), ``observed_data`` and ``posterior_predictive`` groups
  when the data are known; coordinates named after the features. Also ``summary`` (ArviZ: mean, sd,
  HDI, ESS and r-hat where chains exist), ``prior_predictive`` (checks a custom prior before
  any data arrives) and ``ACCEPTED_MODELS``.
* ``calibration``: ``brier_score``, ``expected_calibration_error``, ``reliability_diagram``
  for Bernoulli models, and ``interval_coverage``: simulated problems know the truth, so the
  share of replications whose central credible interval covers the true parameter can be
  checked against its level.
* ``convergence``: ``convergence_warnings`` (one line per posterior variable whose r-hat is
  above 1.01 or whose bulk / tail ESS is below 100: how many of its values fail, the worst
  named), ``ConvergenceWarning``, ``RHAT_MAX``, ``ESS_MIN``; ``summary`` and ``diagnose_run``
  (``bayes-safe diagnose``) show those lines.
* ``recorder``: ``PosteriorRecorder``, a ``simulate`` callback that records the posterior of
  each model over time (watching a Thompson posterior evolve).
* ``persistence``: ``save_models`` / ``load_models`` / ``load_policy`` (what ``bayes-safe
  simulate`` and the studies write to ``RUN_DIR/models/``, in the portable, code-free state
  format of ``bayes_safe.state``), ``save_no_models`` and ``NO_MODELS_FILE`` (a run that fits no
  posterior says why).
* ``report``: ``diagnose_run`` (``bayes-safe diagnose RUN_DIR``): a self-contained HTML report
  and one NetCDF InferenceData per saved posterior.

``_common`` holds the private helpers the modules share. ArviZ and matplotlib are imported only
inside the functions that use them.
"""

from __future__ import annotations

from .calibration import (
    brier_score,
    expected_calibration_error,
    interval_coverage,
    reliability_diagram,
)
from .chance import chance_calibration, chance_trial_metrics, format_chance_calibration  # noqa: F401 (issue 39)
from .convergence import ESS_MIN, RHAT_MAX, ConvergenceWarning, convergence_warnings
from .conversion import ACCEPTED_MODELS, prior_predictive, summary, to_inference_data
from .persistence import NO_MODELS_FILE, load_models, load_policy, save_models, save_no_models
from .recorder import PosteriorRecorder
from .report import diagnose_run

__all__ = [
    "ACCEPTED_MODELS",
    "ESS_MIN",
    "NO_MODELS_FILE",
    "RHAT_MAX",
    "ConvergenceWarning",
    "PosteriorRecorder",
    "brier_score",
    "convergence_warnings",
    "diagnose_run",
    "expected_calibration_error",
    "interval_coverage",
    "load_models",
    "load_policy",
    "prior_predictive",
    "reliability_diagram",
    "save_models",
    "save_no_models",
    "summary",
    "to_inference_data",
]
