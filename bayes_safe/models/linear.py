"""Bayesian linear regression with any Pyro prior on the weights.

``BayesianLinear`` models an outcome as ``y = x^T w + noise`` and keeps a posterior over
``w``. Two kinds of prior are recognised and handled exactly (the *conjugate fast path*):

* a Gaussian prior (``MultivariateNormal`` or ``Normal(...).to_event(1)``) with a known
  ``noise_std``;
* Normal-Inverse-Gamma: the same Gaussian prior, read as ``w | s2 ~ N(m0, s2 * V0)``, with
  ``noise_prior=InverseGamma(a0, b0)`` on the noise variance ``s2``.

On that path the posterior is kept in precision form (``Lambda = Lambda0 + X^T X / s2`` and
``eta = Lambda0 m0 + X^T y / s2``) in float64. Cholesky factors are computed lazily and
cached until the next update; means and draws come from triangular solves, never an explicit
inverse. A single observation per batch element is a rank-one update ``Lambda += x x^T / s2``;
the factor itself is recomputed rather than rank-one updated, because for the small ``d`` of
bandit problems one batched LAPACK call beats ``d`` Python-level rotation steps (measured:
d = 4, batched ``cholesky`` of 1,000 4x4 matrices takes ~30 us, a vectorised rank-one
update with a Python loop over ``d`` ~60 us).

Gaussian scale-mixture priors (``Laplace``, ``StudentT``, ``Cauchy`` ``.expand([d]).to_event(1)``
and a horseshoe written as a Pyro model) are sampled by the warm-started Gibbs engine of
``gibbs.py`` (``engine_name == "gibbs"``): each Thompson draw advances the chain by a sweep
from its last state, so a decision costs a small multiple of a conjugate one. The same
engine handles 0/1 outcomes (``likelihood="probit"``: Albert & Chib 1993;
``likelihood="logistic"``: Polson, Scott & Windle 2013). ``inference="laplace"`` serves the same
priors with 0/1 outcomes from an online Gaussian (Laplace) approximation instead
(``laplace.py``, ``engine_name == "laplace"``): a Newton step per row against a running quadratic
summary of the rows before, so an update, a draw or ``predict`` costs the same at any history.

Any other prior (a Pyro distribution on ``R^d``, or a callable Pyro model with continuous
hyperparameters) is sampled by the warm-started Langevin engine of ``langevin.py``
(``engine_name == "langevin"``): each Thompson draw advances a preconditioned MALA chain by a
step, with any likelihood. ``inference="nuts"`` / ``"svi"`` select Pyro's NUTS or SVI
(``PyroLinearPosterior``, Gaussian likelihood) as the exact reference and the fast
approximation: Thompson draws then come from stored posterior draws, refitted from scratch
when the data have doubled since the last fit (or every ``refit_every`` observations).

**Devices and dtypes** (issue 46). A model follows the device of its prior (the prior
distribution's parameters; ``BayesianLinear.device``): every tensor it makes is made there, and its
random numbers are drawn by the generator given (a ``ReplicationRNG``'s numpy numbers put on the
model's device, a ``torch.Generator`` on its own device, copied when that differs). Per engine:

* conjugate and Normal-Inverse-Gamma: on any device, float64 (the running precision ``Lambda``
  and its Cholesky factor lose too many digits in float32 after many rank-one updates);
  ``DrawBatch`` propensity draws use float32 normals widened to float64, as on the CPU;
* Langevin: on the device of the prior's draws, float64 (the MALA acceptance ratio and autograd);
* Gibbs: the CPU only, float64 (numpy / scipy samplers); ``inference="gibbs"`` refuses a prior on
  another device and ``"auto"`` takes the Langevin engine there;
* laplace, NUTS and SVI (``pyro_inference.py``) and the probit GP: not made device-agnostic yet
  (CPU).

On the CPU nothing changed: the same dtypes and the same numbers as before devices were named.

Example:
    >>> import torch, pyro.distributions as dist
    >>> m = BayesianLinear(prior=dist.Normal(0.0, 1.0).expand([3]).to_event(1), noise_std=0.1)
    >>> m.update(torch.randn(20, 3), torch.randn(20))
    >>> mean, var = m.predict(torch.randn(5, 3))
    >>> m.sample().shape
    torch.Size([3])
"""

from __future__ import annotations

import functools
import math
import threading
import warnings
import weakref
from collections.abc import Sequence

import numpy as np
import torch
import torch.distributions as tdist

from .. import _validation
from .._validation import (
    as_tensor,
    check_batch_shape,
    check_distribution_parameters,
    check_feature_names,
    check_finite,
    check_positive_int,
    check_std,
)
from ..random import (
    DrawBatch,
    Generator,
    ReplicationRNG,
    check_generator,
    standard_gamma,
    standard_normal,
    standard_uniform,
)
from ..threads import single_thread
from ._gaussian import check_real_support, gaussian_prior_parameters
from ._gaussian import cholesky as _cholesky

__all__ = ["BayesianLinear", "check_real_support", "gaussian_prior_parameters"]

_DTYPE = torch.float64
_ONE = torch.ones((), dtype=_DTYPE)  # (torch.where of two Python floats is float32: 0.99 would be 0.9900000095)
_CPU = torch.device("cpu")


def _prior_device(prior) -> torch.device:
    """The device of a prior distribution's parameters (torch's default device for a callable prior)."""
    if isinstance(prior, tdist.Distribution):
        base = prior
        while isinstance(getattr(base, "base_dist", None), tdist.Distribution):  # Independent, expanded, ...
            base = base.base_dist
        for name in getattr(base, "arg_constraints", {}):
            value = base.__dict__.get(name)
            if isinstance(value, torch.Tensor):
                return value.device
    return torch.get_default_device()


@functools.cache
def _dtrsv():
    """BLAS's triangular solve of one vector (scipy's wrapper, imported on first use)."""
    from scipy.linalg import blas

    return blas.dtrsv


class _TransposedCache:
    """``features.mT`` made contiguous, ``[*batch, d, K]``, kept for the last ``size`` feature
    tensors seen.

    Scores ``w^T X^T`` with ``X^T`` contiguous ran 1.7x faster than ``X w`` on
    ``[1000, 100, 4]`` (155 us vs 264 us); problems with fixed arms hand the same features
    tensor every step, so the transpose is paid once. An entry is keyed on the tensor's identity
    and version counter, so an in-place change is never served stale, and holds the tensor only
    weakly: the copy is let go with the features (a 305 MiB block at R = 10,000, K = 1,000, d = 4
    is not kept alive by the cache once its problem is gone).

    Inference tensors (made under ``torch.inference_mode()``, e.g. by a user's problem inside
    ``simulate``) have no version counter: an in-place change could not be detected, so they
    are transposed every call and never cached (a new tensor each step gains nothing from the
    cache anyway).
    """

    def __init__(self, size: int):
        self.size = size
        self.entries: dict[int, tuple[weakref.ref, torch.Tensor, int]] = {}

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        if features.device.type != "cpu":
            # off the CPU a batched product reads the transposed view as it is (cuBLAS takes the layout as
            # a flag): no copy, which at R = 1,000,000, K = 100, d = 4 is 3 GiB of device memory (issue 46)
            return features.mT
        if features.is_inference():
            return features.mT.contiguous()
        key = id(features)
        hit = self.entries.get(key)
        if hit is not None and hit[0]() is features and hit[2] == features._version:
            return hit[1]
        out = features.mT.contiguous()
        if len(self.entries) >= self.size:
            self.entries.clear()
        entries = self.entries

        def drop(ref, key=key):  # the features are gone: so is their copy (unless the key was reused)
            kept = entries.get(key)
            if kept is not None and kept[0] is ref:
                del entries[key]

        self.entries[key] = (weakref.ref(features, drop), out, features._version)
        return out


#: the cache of ``sample_at`` (``simulate``'s lean path keeps its own for the run)
_transposed = _TransposedCache(8)


class BayesianLinear:
    """Posterior over the weights ``w`` of ``y = x^T w + noise``, batched over ``batch_shape``.

    Args:
        prior: a ``pyro.distributions`` distribution with event shape ``[d]`` (batch shape
            broadcastable to ``batch_shape``) supported on all of ``R^d`` (a ``Gamma`` or
            ``Beta`` prior on the weights is rejected, see ``check_real_support``), or a
            callable Pyro model that samples its own hyperparameters and returns ``w`` of shape
            ``[d]`` (then pass ``dim=d``).
        noise_std: known noise standard deviation (> 0). Exactly one of ``noise_std`` and
            ``noise_prior`` is required.
        noise_prior: ``InverseGamma(a0, b0)`` prior on the noise variance. With a Gaussian
            ``prior`` this is the Normal-Inverse-Gamma model, in which the prior covariance is
            read as ``V0`` in ``w | s2 ~ N(m0, s2 V0)``.
        batch_shape: shape of a batch of independent models (replications, or arms for disjoint
            per-arm models). All tensors then carry these leading dimensions.
        inference: ``"auto"`` (conjugate when recognised; else Gibbs for a Laplace, Student-t,
            Cauchy or horseshoe prior; else Langevin; ``inference_options`` holding NUTS/SVI
            options select NUTS, as before), ``"conjugate"`` (error if the prior is not
            conjugate), ``"gibbs"`` (error if the Gibbs engine cannot sample the prior; runs
            for a Gaussian prior too), ``"langevin"`` (any prior on ``R^d``), ``"nuts"`` or
            ``"svi"``, or ``"laplace"`` (0/1 outcomes only, ``likelihood="logistic"`` or
            ``"probit"``, with any prior the Gibbs engine takes: an online Gaussian (Laplace)
            approximation refreshed by a Newton step per row, scale-mixture priors by EM; the
            cost of an update, a draw or ``predict`` does not grow with the history;
            ``laplace.py``. For a sparse click model served online: d = 90, K = 20, 20,000 warm
            rows, horseshoe prior, TS-ASC in a ``Decider``: about 1-2 ms a decision against
            Gibbs' 150 ms, predicted probabilities within 0.01 of a long Gibbs chain,
            ``benchmarks/sparse_logistic.py``). ``engine_name`` reports the choice; the user
            guide's "Which engine" table says why.
        dim: the weight dimension; inferred from a distribution prior, required for a callable.
        refit_every: NUTS / SVI only: refit after this many new observations. ``None``
            (default): refit when the observations have doubled since the last fit (1, 2, 4,
            ... observations: the posterior learns at ``log2(n)`` refits). The refit runs lazily,
            at the next ``sample`` / ``predict``. The Gibbs and Langevin engines follow the
            data at every draw and ignore it.
        inference_options: non-conjugate only: keyword arguments for
            ``PyroLinearPosterior`` (``num_samples``, ``progress``: the fit's progress bar, ``"auto"`` / True / False,
            ``warmup_steps``, ``svi_steps``, ``seed``, ...), or for the Gibbs engine
            (``sweeps``: sweeps per Thompson draw, default 1; ``burn_in``, default 20;
            ``predict_sweeps``, default 200; ``pg_terms``, default 20; ``seed``), or for the
            Langevin engine (``steps``: MALA steps per Thompson draw, default 1; ``burn_in``,
            default 50; ``predict_steps``, default 200; ``seed``), or for the laplace engine
            (``refresh_every``: rows between EM refreshes of a scale-mixture prior, default 20;
            ``em_steps``, default 5; ``newton_steps``: most Newton iterations of a many-row
            ``update``, default 50; ``tol``, default 1e-9).
        likelihood: ``"gaussian"`` (default), or ``"probit"`` / ``"logistic"`` for 0/1
            outcomes (Gibbs or Langevin engine; give neither ``noise_std`` nor ``noise_prior``). Then
            ``update`` rejects outcomes outside {0, 1} (NaN too), and ``sample_at`` /
            ``predict`` answer for the success probability ``Phi(x^T w)`` / ``sigmoid(x^T w)``.
        forgetting: ``lambda`` in (0, 1], or None (no forgetting, the default; 1 is the same): the
            world drifts, so before each observation a batch element receives, what it learned so
            far is weighted by ``lambda`` (an observation ``n`` observations old counts
            ``lambda^n``; the effective memory is about ``1 / (1 - lambda)`` observations, a
            half-life of ``log(1/2) / log(lambda)``). Conjugate engines (Gaussian and
            Normal-Inverse-Gamma); the Gibbs and Langevin engines with the same meaning, each
            row's likelihood raised to the power ``lambda^(rows since)`` and the prior kept (the
            stabilized rule): Gibbs with a Gaussian or logistic likelihood (Polya-Gamma ``PG(w, .)``
            latents), Langevin with any likelihood. The Gibbs engine refuses ``"probit"`` (its
            augmentation has no exact weighted form; use ``"logistic"`` or ``inference="langevin"``);
            NUTS and SVI weigh each stored row's log-likelihood by its age at the refit.

            ``"adaptive"`` (or ``AdaptiveForgetting(threshold=10, drift=0.5)`` for other settings
            of its test; the recommended setting when the world may change, issue 30): forget only
            when the data say the world changed. Every observation is kept (exactly the posterior
            of no forgetting) until a two-sided CUSUM test (Page 1954) on the model's own
            standardised one-step predictive residuals ``(y - x^T m) / sqrt(sigma^2 + x^T Sigma
            x)`` raises an alarm; a batch element that raises one restarts from the prior (the
            stabilised rule at factor 0) and learns the observation that raised it, as the
            change-detection bandits reset an arm (CUSUM-UCB, Liu, Lee & Shroff 2018). Each batch
            element tests on its own; ``change_points`` counts its alarms. Deterministic. For 0/1
            outcomes (a logistic or probit model; ``AdaptiveForgetting(outcomes="binary")`` for a
            Gaussian model of a 0/1 metric) the test is a Bernoulli likelihood-ratio CUSUM on the
            predictive probability, set by ``false_alarm_rate`` (issue 43). Every engine: the
            conjugate and laplace engines exactly; Gibbs, Langevin, NUTS and SVI from their
            estimated predictive, tested after a warm-up of ``20 d`` rows (the Gibbs engine's probit
            likelihood and, for 0/1 outcomes, Langevin with ``keep > 0`` refuse it by name); see
            ``bayes_safe.models.change_detection`` for the tests' error rates and each engine's restart.
        forgetting_rule: ``"stabilized"`` (default) forgets the data and keeps the prior: the
            sufficient statistics are pulled toward the prior's, ``Lambda <- Lambda0 + lambda
            (Lambda - Lambda0)`` (and so ``eta``, and the noise posterior's ``a`` and ``y^T y``),
            the stabilised forgetting of Kulhavy & Zarrop (1993), so that the uncertainty in a
            direction no longer observed returns to the prior's and never grows past it.
            ``"exponential"`` weighs everything, the prior included, by ``lambda``
            (``Lambda <- lambda Lambda``): the classic recursive-least-squares rule, whose
            uncertainty in an unobserved direction grows without bound (the posterior's variance
            there is ``lambda^-n`` times the prior's after ``n`` observations elsewhere). Rows
            given in one ``update`` count as that many observations in order (the same posterior
            as one ``update`` per row).
        feature_names: names of the ``d`` features (``d`` distinct non-empty strings, e.g. a
            DataFrame's ``columns``), or None (default). Kept with the model: saved and loaded
            with its state (``bayes_safe.state``, ``save_models``), and used by
            ``to_inference_data`` and ``bayes-safe diagnose`` as the ``feature`` coordinates
            (without them: ``x0, x1, ...``). A wrong number of names, a non-string or a repeated
            name is a ``ValueError`` naming ``feature_names``, raised before anything is built.

        base_prior: the Gaussian that forgetting returns to (stabilised forgetting keeps it, an
            adaptive restart starts from it), when it is not ``prior``: name the weak prior a
            ``power_prior`` warm start was built on, so that a model warm-started from the old
            world forgets back to the weak prior and not to the old world (issue 43), or
            ``redraw_prior`` of the warm start. Conjugate engines and the laplace engine (from a
            Gaussian prior), with ``forgetting`` given; a Gaussian with event shape ``[d]``. It can
            also be set after a warm start by ``update``: ``model.base_prior = redraw_prior(model)``.

    Attributes:
        engine_name: ``"conjugate"``, ``"gibbs"``, ``"langevin"``, ``"nuts"``, ``"svi"`` or ``"laplace"``.
        engine: the ``GibbsLinearPosterior``, ``LangevinLinearPosterior``, ``PyroLinearPosterior`` or
            ``LaplaceLinearPosterior`` (non-conjugate only).
        needs_autograd: False for the conjugate, Gibbs and laplace engines (they may run under
            ``torch.inference_mode``), True for Langevin, NUTS and SVI.
        unfitted_observations: NUTS / SVI: observations given to ``update`` that the stored
            draws do not reflect yet (0 for the other engines); ``repr`` shows it.
        feature_names: ``list[str]`` of length ``d``, or None (as given).

    Shapes: ``update(X: [*batch, n, d] or [*batch, d], y: [*batch, n] or [*batch])``,
    ``predict(X: [*batch, k, d]) -> ([*batch, k], [*batch, k])``, ``sample() -> [*batch, d]``.
    """

    @property
    def device(self) -> torch.device:
        """The device of the model's tensors: its prior's (the prior distribution's parameters; for a
        callable Pyro prior, torch's default device when the model was made). Every tensor the model
        makes follows it; give it data on this device. Dtypes: the conjugate engines keep float64 on
        every device (the precision's Cholesky factor and the running sums lose too much in float32
        after many updates); ``DrawBatch`` propensity draws use float32 normals as on the CPU."""
        precision = self.__dict__.get("precision")
        if precision is not None:
            return precision.device
        return self.__dict__.get("_device", _CPU)

    @property
    def binary_outcomes(self) -> bool:
        """Whether the outcomes this model learns are 0 / 1 (probit and logistic likelihoods)."""
        return self.likelihood != "gaussian"

    @property
    def needs_autograd(self) -> bool:
        """Whether ``update`` / ``fit`` / ``sample`` need autograd (Langevin, NUTS and SVI); the
        conjugate and Gibbs engines do not, so a simulation loop may run them under
        ``torch.inference_mode``."""
        return self.engine_name in ("langevin", "nuts", "svi")

    @property
    def _chain_engine(self) -> bool:
        """Whether an engine object that follows the data at every update holds the posterior: a
        warm-started chain (Gibbs or Langevin) or the online Laplace approximation (``"laplace"``,
        whose ``draw`` / ``summary`` / ``add`` / ``fit`` have the same signatures)."""
        return self.engine_name in ("gibbs", "langevin", "laplace")

    def __init__(
        self,
        prior,
        noise_std: float | None = None,
        noise_prior=None,
        *,
        batch_shape: Sequence[int] = (),
        inference: str = "auto",
        dim: int | None = None,
        refit_every: int | None = None,
        inference_options: dict | None = None,
        likelihood: str = "gaussian",
        forgetting: float | None = None,
        forgetting_rule: str = "stabilized",
        feature_names: Sequence[str] | None = None,
        base_prior=None,
    ):
        from .gibbs import LIKELIHOODS

        feature_names = check_feature_names(feature_names)  # before any work (the length once d is known)

        if not isinstance(likelihood, str) or likelihood not in LIKELIHOODS:
            raise ValueError(f"likelihood: expected 'gaussian', 'probit' or 'logistic', got {likelihood!r}")
        self.likelihood = likelihood
        self.batch_shape = check_batch_shape(batch_shape, "batch_shape")
        if likelihood != "gaussian":
            if noise_std is not None or noise_prior is not None:
                raise ValueError(f"noise_std / noise_prior: likelihood={likelihood!r} models 0/1 outcomes through a latent "
                                 "variable of fixed scale; give neither")
        elif (noise_std is None) == (noise_prior is None):
            raise ValueError("noise_std / noise_prior: give exactly one (a known noise_std > 0, or an InverseGamma noise_prior)")
        if noise_std is not None:
            noise_std = check_std(noise_std, "noise_std")
        if noise_prior is not None and not isinstance(noise_prior, tdist.InverseGamma):
            raise TypeError(f"noise_prior: expected pyro.distributions.InverseGamma on the noise variance, got {type(noise_prior).__name__}")
        if noise_prior is not None:
            check_distribution_parameters(noise_prior, "noise_prior")
        dim = check_positive_int(dim, "dim", allow_none=True)
        refit_every = check_positive_int(refit_every, "refit_every", allow_none=True)
        if inference_options is not None and not isinstance(inference_options, dict):
            raise TypeError(f"inference_options: expected a dict of PyroLinearPosterior keyword arguments, "
                            f"got {type(inference_options).__name__}")
        engines = ("auto", "conjugate", "gibbs", "langevin", "nuts", "svi", "laplace")
        if not isinstance(inference, str) or inference not in engines:
            raise ValueError(f"inference: expected one of {list(engines)}, got {inference!r}")
        if inference == "laplace" and likelihood == "gaussian":
            raise ValueError("likelihood: inference='laplace' approximates the posterior of 0/1 outcomes "
                             "(likelihood='logistic' or 'probit'); a Gaussian likelihood is exact with the conjugate "
                             "engine (a Gaussian prior) or sampled by 'gibbs' / 'langevin', got likelihood='gaussian'")
        if likelihood != "gaussian" and inference in ("conjugate", "nuts", "svi"):
            raise ValueError(f"inference: likelihood={likelihood!r} is sampled by the Gibbs or Langevin engine; use "
                             f"inference='auto', 'gibbs' or 'langevin', got {inference!r}")
        from .change_detection import CusumDetector, parse_forgetting

        forgetting, adaptive = parse_forgetting(forgetting)
        if forgetting_rule not in ("stabilized", "exponential"):
            raise ValueError(f"forgetting_rule: expected 'stabilized' or 'exponential', got {forgetting_rule!r}")
        if adaptive is not None and forgetting_rule != "stabilized":
            raise ValueError("forgetting_rule: adaptive forgetting restarts from the prior (the stabilized rule at "
                             f"factor 0); expected 'stabilized', got {forgetting_rule!r}")
        # ``forgetting``: the factor, or "adaptive" (then ``adaptive`` holds the detector's settings)
        self.forgetting = "adaptive" if adaptive is not None else forgetting
        self.forgetting_rule, self.adaptive = forgetting_rule, adaptive
        self.prior = prior
        self.noise_std = noise_std
        self.noise_prior = noise_prior

        if isinstance(prior, tdist.Distribution):
            if len(prior.event_shape) != 1:
                raise ValueError(
                    f"prior: expected a distribution with event shape [d] (e.g. Normal(0, 1).expand([d]).to_event(1)), "
                    f"got event shape {list(prior.event_shape)}"
                )
            check_real_support(prior, "prior")
            check_distribution_parameters(prior, "prior")
            d = int(prior.event_shape[0])
            if d < 1:
                raise ValueError("prior: expected an event shape [d] with d >= 1, got [0]")
            if dim is not None and int(dim) != d:
                raise ValueError(f"dim: got {dim} but the prior's event shape is [{d}]")
            try:
                torch.broadcast_shapes(prior.batch_shape, self.batch_shape)
            except RuntimeError:
                raise ValueError(
                    f"prior: batch shape {list(prior.batch_shape)} does not broadcast to batch_shape {list(self.batch_shape)}"
                ) from None
            gaussian = gaussian_prior_parameters(prior)
        elif callable(prior):
            if dim is None:
                raise ValueError("dim: required when prior is a callable Pyro model")
            d = int(dim)
            gaussian = None
        else:
            raise TypeError(f"prior: expected a pyro.distributions distribution with event shape [d] or a callable Pyro model, got {type(prior).__name__}")
        self.feature_names = check_feature_names(feature_names, d)
        self._device = _prior_device(prior)  # the conjugate engines read it from their precision
        self.dim = d
        self._sample_shape = (*self.batch_shape, d)
        self._column_shape = (*self.batch_shape, d, 1)

        if inference == "conjugate" and gaussian is None:
            raise ValueError("inference='conjugate' needs a Gaussian prior (MultivariateNormal or Normal(...).to_event(1))")
        self.conjugate = gaussian is not None and inference in ("auto", "conjugate") and likelihood == "gaussian"
        mixture = None
        langevin = inference == "langevin"
        if not self.conjugate and inference in ("auto", "gibbs"):
            from .gibbs import GIBBS_OPTIONS, recognise_prior
            from .langevin import LANGEVIN_OPTIONS

            pyro_keys = sorted(set(inference_options or {}) - set(GIBBS_OPTIONS) - set(LANGEVIN_OPTIONS))
            gibbs_only = sorted(set(inference_options or {}) - set(GIBBS_OPTIONS))
            if inference == "gibbs" and gibbs_only:
                raise ValueError(f"inference_options: the Gibbs engine takes {list(GIBBS_OPTIONS)}, got {gibbs_only}")
            if inference == "gibbs" and self._device != _CPU:
                raise ValueError(f"prior: the Gibbs engine runs on the CPU (its samplers are numpy's and scipy's), got a "
                                 f"prior on {self._device}; use inference='langevin' (or 'auto', which picks it there) "
                                 "or a prior on the CPU")
            if not pyro_keys:  # NUTS / SVI options with inference='auto' keep the Pyro engine (as before)
                # off the CPU 'auto' takes the Langevin engine (the Gibbs engine is the CPU's)
                if self._device == _CPU and not (set(inference_options or {}) - set(GIBBS_OPTIONS)):
                    mixture = recognise_prior(prior, d, self.batch_shape)
                langevin = mixture is None and inference == "auto"
            if mixture is None and inference == "gibbs":
                raise ValueError(
                    "prior: the Gibbs engine (inference='gibbs') samples Gaussian, Laplace, StudentT and Cauchy priors "
                    "(.expand([d]).to_event(1)) and a horseshoe Pyro model; use inference='langevin' (or 'auto') for "
                    f"any other prior, got {type(prior).__name__}")
        if inference == "laplace":
            from .gibbs import recognise_prior
            from .laplace import LAPLACE_OPTIONS

            unknown = sorted(set(inference_options or {}) - set(LAPLACE_OPTIONS))
            if unknown:
                raise ValueError(f"inference_options: the laplace engine takes {list(LAPLACE_OPTIONS)}, got {unknown}")
            mixture = recognise_prior(prior, d, self.batch_shape)
            if mixture is None:
                raise ValueError(
                    "prior: the laplace engine (inference='laplace') takes Gaussian, Laplace, StudentT and Cauchy priors "
                    "(.expand([d]).to_event(1)) and a horseshoe Pyro model (the Gibbs engine's priors); use "
                    f"inference='langevin' for any other prior, got {type(prior).__name__}")
            if forgetting_rule != "stabilized" and (forgetting is not None or adaptive is not None):
                raise ValueError("forgetting_rule: the laplace engine forgets under the stabilized rule (its data "
                                 f"summary weighed, the prior kept); expected 'stabilized', got {forgetting_rule!r}")
        self.engine_name = "laplace" if inference == "laplace" else "conjugate" if self.conjugate else (
            "gibbs" if mixture is not None else "langevin" if langevin else "svi" if inference == "svi" else "nuts")
        if adaptive is not None and self.engine_name == "gibbs" and likelihood == "probit":
            raise ValueError("forgetting: the Gibbs engine's probit likelihood does not forget (adaptively or by a "
                             "factor); use likelihood='logistic', or inference='langevin' for a probit model that "
                             "forgets")
        if adaptive is not None and adaptive.keep > 0 and self.engine_name == "langevin" and likelihood != "gaussian":
            raise ValueError(f"forgetting: the Langevin engine restarts a 0/1 likelihood from its prior alone "
                             f"(AdaptiveForgetting keep=0), got keep={adaptive.keep!r}; use inference='laplace' or "
                             f"the Gibbs engine's logistic likelihood for a discounted restart")
        # the chain engines forget under the stabilized rule (the data weighed, the prior kept); the Gibbs
        # engine's probit likelihood is refused by the engine itself (GibbsLinearPosterior says why)
        chain_forgets = self.engine_name in ("gibbs", "langevin", "nuts", "svi", "laplace") and forgetting_rule == "stabilized"
        if self.forgetting is not None and not self.conjugate and not chain_forgets:
            raise ValueError(f"forgetting: the {self.engine_name} engine (this prior{'' if likelihood == 'gaussian' else ', likelihood=' + repr(likelihood)}, "
                             f"forgetting_rule={forgetting_rule!r}) does not forget; forgetting works with the conjugate "
                             "engines (a Gaussian prior and likelihood, known noise or an InverseGamma noise_prior), and "
                             "with the Gibbs (Gaussian or logistic likelihood), Langevin, NUTS and SVI engines under the "
                             "stabilized rule (the data weighed, the prior kept)")
        # adaptive forgetting: the change detector's statistics per batch element
        self._detector = None if adaptive is None else CusumDetector(
            adaptive, self.batch_shape, binary=adaptive.is_binary(likelihood), dim=d, device=self._device,
            sampled=self.engine_name in SAMPLED_ENGINES)
        if base_prior is not None:
            self._check_base_allowed()
        # decay on the clock of the batch elements a masked update skips (set by ``PerArmLinear``)
        self.decay: float | None = None
        self._count = 0  # observations given to every batch element
        self._masked_count: torch.Tensor | None = None  # per-element counts of masked (per-arm) updates

        if self.conjugate:
            loc, cov = gaussian
            loc = loc.expand(*self.batch_shape, d).clone()
            cov = cov.expand(*self.batch_shape, d, d).clone()
            prior_factor = _cholesky(cov)
            self._prior_loc = loc
            self._prior_precision = torch.cholesky_inverse(prior_factor)  # once, at construction
            self._scale = 1.0 if noise_prior is not None else 1.0 / noise_std**2
            self.precision = self._prior_precision.clone()
            self.eta = (self._prior_precision @ loc[..., None])[..., 0]
            self._prior_eta = self.eta.clone()
            # what stabilised forgetting keeps and a restart returns to: the prior, or the base prior
            self._base: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (loc, precision, eta)
            if base_prior is not None:
                self._set_base_prior(base_prior, d)
            if noise_prior is not None:
                # on the prior's device (a noise prior given with CPU numbers follows the weights' prior)
                self._a = noise_prior.concentration.to(device=loc.device, dtype=_DTYPE).expand(self.batch_shape).clone()
                self._b0 = noise_prior.rate.to(device=loc.device, dtype=_DTYPE).expand(self.batch_shape).clone()
                # running y^T y + m0^T Lambda0 m0, for b_n = b0 + (sq - eta^T Lambda^-1 eta) / 2
                self._sq = (loc[..., None, :] @ self._prior_precision @ loc[..., None])[..., 0, 0]
                self._a0, self._sq0 = self._a.clone(), self._sq.clone()
            self._factor: torch.Tensor | None = None
            # batch elements whose precision changed since the factor was computed (None: none,
            # or the whole factor is stale); masked updates refactor only these
            self._dirty: torch.Tensor | None = None
        elif self.engine_name == "laplace":
            from .laplace import LaplaceLinearPosterior

            self.engine = LaplaceLinearPosterior(mixture, d, self.batch_shape, likelihood=likelihood,
                                                 **(inference_options or {}))
            self.refit_every = None  # updated at every row: nothing to refit
            if base_prior is not None:  # what forgetting returns to, in place of the prior (issue 43)
                self.engine.set_base(*self._base_parameters(base_prior, d))
        elif mixture is not None:
            from .gibbs import GibbsLinearPosterior

            self.engine = GibbsLinearPosterior(
                mixture, d, self.batch_shape, likelihood=likelihood, noise_std=noise_std, noise_prior=noise_prior,
                forgetting=None if adaptive is not None else self.forgetting, **_chain_options(inference_options),
            )
            self.refit_every = None  # the chain follows the data at every draw: nothing to refit
        elif self.engine_name == "langevin":
            from .langevin import LANGEVIN_OPTIONS, LangevinLinearPosterior

            if isinstance(prior, tdist.Distribution) and prior.batch_shape != ():
                raise ValueError(f"prior: the Langevin engine needs a prior with batch shape [] (one prior shared by the "
                                 f"batch), got {list(prior.batch_shape)}")
            options = _chain_options(inference_options)
            unknown = sorted(set(options) - set(LANGEVIN_OPTIONS))
            if unknown:
                raise ValueError(f"inference_options: the Langevin engine takes {list(LANGEVIN_OPTIONS)}, got {unknown}")
            self.engine = LangevinLinearPosterior(
                prior, d, self.batch_shape, likelihood=likelihood, noise_std=noise_std, noise_prior=noise_prior,
                forgetting=None if adaptive is not None else self.forgetting, **options,
            )
            self.refit_every = None
        else:
            from .pyro_inference import PyroLinearPosterior

            method = "nuts" if inference in ("auto", "nuts") else "svi"
            self.engine = PyroLinearPosterior(
                prior, d, noise_std=noise_std, noise_prior=noise_prior, batch_shape=self.batch_shape,
                method=method, forgetting=None if adaptive is not None else self.forgetting, **(inference_options or {}),
            )
            self.refit_every = None if refit_every is None else int(refit_every)
            self._X: list[torch.Tensor] = []
            self._y: list[torch.Tensor] = []
            self._since_fit = 0
            self._fitted_count = 0  # observations in the stored draws
            # adaptive restarts (issue 43): each element's weights of its first rows ``[*b, m]`` (later rows
            # weigh 1; None: no restart yet), and whether a restart waits for its refit
            self._row_weight: torch.Tensor | None = None
            self._restart_pending = False
            # one set of prior draws shared by the batch, so that replication r has a one-replication run's
            self._draws = self.engine.prior_draws(self.engine.num_samples, shared=True)

    # ------------------------------------------------------------------ input handling
    def _rows(self, X, y) -> tuple[torch.Tensor, torch.Tensor, bool]:
        if _validation.trusted() and isinstance(X, torch.Tensor) and isinstance(y, torch.Tensor):
            return X, y, X.dim() == len(self.batch_shape) + 1  # library-made data (simulation loop)
        if not isinstance(X, torch.Tensor) or X.dtype != _DTYPE:
            X = as_tensor(X, "X")
        if not isinstance(y, torch.Tensor) or y.dtype != _DTYPE:
            y = as_tensor(y, "y")
        nb = len(self.batch_shape)
        if X.dim() not in (nb + 1, nb + 2) or X.shape[-1] != self.dim:
            raise ValueError(
                f"X: expected shape [*batch_shape, n, {self.dim}] or [*batch_shape, {self.dim}] with batch_shape "
                f"{list(self.batch_shape)}, got {list(X.shape)}"
            )
        if tuple(y.shape) != tuple(X.shape[:-1]):
            raise ValueError(f"y: expected shape {list(X.shape[:-1])} to match X {list(X.shape)}, got {list(y.shape)}")
        if any(x != b and x != 1 for x, b in zip(X.shape[:nb], self.batch_shape)):
            raise ValueError(f"X: leading dimensions {list(X.shape[:nb])} do not match batch_shape {list(self.batch_shape)}")
        check_finite(X, "X")
        check_finite(y, "y")
        return X, y, X.dim() == nb + 1

    @property
    def num_observations(self) -> torch.Tensor:
        """Number of observations each batch element has seen, ``[*batch]`` (long)."""
        out = torch.full(self.batch_shape, self._count, dtype=torch.long, device=self.device)
        return out if self._masked_count is None else out + self._masked_count

    # ------------------------------------------------------------------ updates
    def update(self, X, y, actions=None) -> None:
        """Add observations. ``X: [*batch, n, d]`` with ``y: [*batch, n]``, or one row each.

        ``actions`` is accepted for interface compatibility with per-arm models and ignored.
        """
        X, y, single = self._rows(X, y)
        self._update_rows(X, y, single)

    def _update_checked(self, X: torch.Tensor, y: torch.Tensor | None, views: tuple | None = None) -> None:
        """``update`` of one row per batch element that a policy has checked already (float64
        ``X [*batch, d]`` and ``y [*batch]`` of this model's shapes, scanned for NaN): the same
        update without ``_rows``' second look at them.

        ``views``: ``(X.unsqueeze(-1), X.unsqueeze(-2), y.unsqueeze(-1))`` made by the caller, or
        anything that broadcasts as they do (one row: ``(X.mT, X, y)``); a policy whose models learn
        the same rows shares the first two, and the third may be a column of the outcomes
        (``y`` then None): the same products, fewer view operations."""
        single = X.dim() == len(self.batch_shape) + 1
        if (not single and not self.batch_shape and X.dim() == 2 and X.shape[0] == 1 and self.conjugate
                and self.forgetting is None and self.noise_prior is None):
            # the one-stream case: an unbatched model told one row ``X [1, d]`` (the Decider's rows): the
            # same sums as ``_update_rows``' n = 1 path, without its matrix products
            self._count += 1
            s = self._scale
            self.precision.addcmul_(X.mT, X, value=s)
            self.eta.addcmul_((views[2] if y is None else y).reshape(1), X[0], value=s)
            self._factor, self._dirty = None, None  # ``_invalidate(None)``
            return
        if single and self.conjugate and self.forgetting is None and self.noise_prior is None:
            # ``_update_rows``' one-row conjugate path without its dispatch: the same operations
            self._count += 1
            s = self._scale
            if views is None:
                # one row ``X [1, d]``: ``X^T [d, 1]``, ``X`` and ``y [1]`` broadcast as the unsqueezed views do
                # (the same products, one view instead of three); otherwise the column and row views
                views = (X.mT, X, y) if X.dim() == 2 and X.shape[0] == 1 else (
                    X.unsqueeze(-1), X.unsqueeze(-2), y.unsqueeze(-1))
            self.precision.addcmul_(views[0], views[1], value=s)
            self.eta.addcmul_(views[2], X, value=s)
            self._factor, self._dirty = None, None  # ``_invalidate(None)``
            return
        self._update_rows(X, views[2][..., 0] if y is None else y, single)

    def _update_rows(self, X: torch.Tensor, y: torch.Tensor, single: bool, weight: torch.Tensor | None = None) -> None:
        """Trusted update (inputs already validated). ``weight [*batch]`` in {0, 1} masks batch
        elements that receive no observation (per-arm models)."""
        n = 1 if single else X.shape[-2]
        if self.forgetting is not None and n > 1 and (self.conjugate or self._chain_engine or self._detector is not None):
            # in order, one row at a time: each forgets the ones before it, or is tested before it is learned
            # (NUTS / SVI under a fixed factor weigh the stored rows by their age at the fit)
            for i in range(n):
                self._update_rows(X[..., i, :], y[..., i], True, weight)
            return
        if weight is None:
            self._count += n
        else:
            self._masked_count = weight.long() if self._masked_count is None else self._masked_count + weight.long()
        if self.conjugate:
            s = self._scale
            if self.decay is not None and weight is not None:
                self._decay_unplayed(weight)
            if self._detector is not None:
                self._detect_change(X if single else X[..., 0, :], y if single else y[..., 0], weight)  # n = 1 here
            elif self.forgetting is not None:
                self._forget(weight)
            # in place: one fused op each instead of building X X^T and adding it
            if single:
                # unsqueeze: the views of X[..., :, None] and X[..., None, :] at a third of the call cost
                self.precision.addcmul_(X.unsqueeze(-1), X.unsqueeze(-2), value=s)
                self.eta.addcmul_(y.unsqueeze(-1), X, value=s)
                if self.noise_prior is not None:
                    self._sq = self._sq + y * y
                    self._a = self._a + (0.5 if weight is None else 0.5 * weight)
            else:
                self.precision.add_(X.mT @ X, alpha=s)
                self.eta.add_((X.mT @ y[..., None])[..., 0], alpha=s)
                if self.noise_prior is not None:
                    self._sq = self._sq + (y * y).sum(-1)
                    self._a = self._a + 0.5 * n
            # (under decay the unplayed elements moved too: every factor is stale)
            self._invalidate(None if weight is None or self.decay is not None else weight > 0)
            return
        if weight is not None:
            raise ValueError("masked updates need a conjugate model")
        if single:
            X, y = X[..., None, :], y[..., None]
        if self._chain_engine:
            if self.likelihood != "gaussian":
                bad = (y != 0) & (y != 1)  # NaN too
                if bool(bad.any()):
                    self._count -= n
                    raise ValueError(f"y: likelihood={self.likelihood!r} needs outcomes in {{0, 1}}, got "
                                     f"{y[bad].reshape(-1)[:3].tolist()}")
            if self._detector is not None:  # one row here (forgetting: in order)
                self._detect_change(X[..., 0, :], y[..., 0], None)
            elif self.engine_name == "laplace" and self.forgetting is not None:
                self.engine.forget(torch.full(self.batch_shape, self.forgetting, dtype=_DTYPE, device=self.device))
            self.engine.add(X, y)
            return
        if self._detector is not None:  # one row here
            self._detect_change(X[..., 0, :], y[..., 0], None)
        self._X.append(X.expand(*self.batch_shape, *X.shape[-2:]))
        self._y.append(y.expand(*self.batch_shape, y.shape[-1]))
        self._since_fit += n

    def _set_base_prior(self, base_prior, d: int) -> None:
        """Check and keep ``base_prior`` (a Gaussian with event shape ``[d]``): the prior that
        stabilised forgetting keeps and a restart after an alarm returns to, in place of ``prior``."""
        self._set_base(*self._base_parameters(base_prior, d))

    def _base_parameters(self, base_prior, d: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loc [*batch, d], precision [*batch, d, d])`` of ``base_prior``, checked by name."""
        if not isinstance(base_prior, tdist.Distribution) or tuple(base_prior.event_shape) != (d,):
            raise ValueError(f"base_prior: expected a Gaussian distribution with event shape [{d}] (e.g. the weak "
                             "prior a power_prior was built on), got "
                             f"{type(base_prior).__name__}{'' if not isinstance(base_prior, tdist.Distribution) else ' with event shape ' + str(list(base_prior.event_shape))}")
        gaussian = gaussian_prior_parameters(base_prior)
        if gaussian is None:
            raise ValueError(f"base_prior: expected a Gaussian (MultivariateNormal or Normal(...).to_event(1)), got "
                             f"{type(base_prior).__name__}")
        try:
            device = self.device  # the base prior follows the prior's device
            loc = gaussian[0].to(device=device, dtype=_DTYPE).expand(*self.batch_shape, d).clone()
            cov = gaussian[1].to(device=device, dtype=_DTYPE).expand(*self.batch_shape, d, d)
        except RuntimeError:
            raise ValueError(f"base_prior: batch shape {list(base_prior.batch_shape)} does not broadcast to "
                             f"batch_shape {list(self.batch_shape)}") from None
        return loc, torch.cholesky_inverse(_cholesky(cov))

    def _set_base(self, loc: torch.Tensor, precision: torch.Tensor) -> None:
        self._base = (loc, precision, (precision @ loc[..., None])[..., 0])
        if self.noise_prior is not None:
            self._set_sq0(loc, precision)

    def _set_sq0(self, loc: torch.Tensor, precision: torch.Tensor) -> None:
        """The quadratic ``m0^T P0 m0`` ``[*b]`` of the Gaussian (``loc [*b, d]``, ``precision [*b, d, d]``)
        that the normal-inverse-gamma noise statistic ``sq`` returns to when it forgets or restarts."""
        self._sq0 = (loc[..., None, :] @ precision @ loc[..., None])[..., 0, 0]

    @property
    def base_prior(self):
        """The Gaussian that stabilised forgetting keeps and a restart returns to: ``prior``, unless a
        ``base_prior`` was given (conjugate models and the laplace engine; None for the other engines)."""
        if self.engine_name == "laplace":
            base = self.engine.base()
            return self.prior if base is None else tdist.MultivariateNormal(base[0], precision_matrix=base[1])
        if not self.conjugate:
            return None
        if self._base is None:
            return self.prior
        loc, precision, _ = self._base
        return tdist.MultivariateNormal(loc, precision_matrix=precision)

    @base_prior.setter
    def base_prior(self, value) -> None:
        """Name the base after the model has learned: a model warm-started by ``update`` on a log
        takes ``model.base_prior = redraw_prior(model)`` (``None``: back to ``prior``). What the model
        learned is unchanged; the next forgetting step or restart returns there."""
        self._check_base_allowed()
        if value is None:
            if self.engine_name == "laplace":
                self.engine.base_H = self.engine.base_g = None
            else:
                self._base = None
                if self.noise_prior is not None:
                    self._set_sq0(self._prior_loc, self._prior_precision)
            return
        loc, precision = self._base_parameters(value, self.dim)
        if self.engine_name == "laplace":
            self.engine.set_base(loc, precision)
        else:
            self._set_base(loc, precision)

    def _check_base_allowed(self) -> None:
        """Refuse a ``base_prior`` (at construction or set later) by name where nothing forgets or the
        engine forgets back to its own prior."""
        if self.forgetting is None:
            raise ValueError("base_prior: the prior forgetting returns to; give it with forgetting (a factor or "
                             "'adaptive'), got forgetting=None")
        if not self.conjugate and self.engine_name != "laplace":
            raise ValueError(f"base_prior: the {self.engine_name} engine forgets back to its own prior; base_prior "
                             "works with the conjugate engines and the laplace engine (warm-start the others by "
                             "update)")

    def _anchor(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(precision [*b, d, d], eta [*b, d])`` of the base prior (forgetting's anchor)."""
        if self._base is None:
            return self._prior_precision, self._prior_eta
        return self._base[1], self._base[2]

    def _decay_unplayed(self, weight: torch.Tensor) -> None:
        """Decay on the clock: the batch elements that receive no observation this step (``weight
        [*batch] == 0``: the arms not played) forget at ``decay`` toward the base prior, so the
        uncertainty about an arm left unplayed grows back with time (the stabilised rule, Kulhavy &
        Zarrop 1993, applied per step rather than per observation; as bayesianbandits' ``decay``)."""
        one = _ONE if weight.device == _CPU else _ONE.to(weight.device)
        f = torch.where(weight > 0, one, torch.tensor(self.decay, dtype=_DTYPE, device=weight.device))
        self._pull_to_base(f, f[..., None], f[..., None, None])

    def _pull_to_base(self, f, f2, f3) -> None:
        """The stabilised rule in place: what the batch elements learned weighed by ``f`` (a number,
        or ``[*batch]`` with ``f2``, ``f3`` its views for ``eta`` and the precision), the base
        prior kept (``Lambda <- Lambda0 + f (Lambda - Lambda0)``, and so ``eta``, ``a``, ``y^T y``)."""
        p0, eta0 = self._anchor()
        self.precision.sub_(p0).mul_(f3).add_(p0)
        self.eta.sub_(eta0).mul_(f2).add_(eta0)
        if self.noise_prior is not None:
            self._sq = self._sq0 + f * (self._sq - self._sq0)
            self._a = self._a0 + f * (self._a - self._a0)

    def _forget(self, weight: torch.Tensor | None) -> None:
        """Weigh what the batch elements learned by ``forgetting`` before one more observation
        (only the elements ``weight [*batch] > 0`` receive it); ``forgetting_rule`` says whether the
        prior is kept (stabilised) or weighed too (exponential)."""
        lam = self.forgetting
        f = lam if weight is None else torch.where(weight > 0, torch.tensor(lam, dtype=_DTYPE, device=weight.device),
                                                   _ONE if weight.device == _CPU else _ONE.to(weight.device))
        f2 = f if weight is None else f[..., None]
        f3 = f if weight is None else f[..., None, None]
        if self.forgetting_rule == "exponential":
            self.precision.mul_(f3)
            self.eta.mul_(f2)
            if self.noise_prior is not None:
                self._sq, self._a = self._sq * f, self._a * f
            return
        self._pull_to_base(f, f2, f3)

    def _detect_change(self, X: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None) -> None:
        """Adaptive forgetting, before one more observation ``X [*batch, d]``, ``y [*batch]``: the
        test sees its standardised one-step predictive residual (Gaussian outcomes) or its
        predictive success probability and the 0/1 outcome, and the batch elements that raise an
        alarm (of those with ``weight > 0``) restart from the base prior, keeping ``keep`` of what
        they learned (``bayes_safe.models.change_detection``)."""
        det = self._detector
        active = None if weight is None else weight > 0
        if det.binary and not bool(((y == 0) | (y == 1)).all()):
            bad = y[(y != 0) & (y != 1)].reshape(-1)[:3].tolist()
            raise ValueError(f"y: this model's change test reads 0/1 outcomes (AdaptiveForgetting outcomes="
                             f"{det.config.outcomes!r}), got {bad}")
        if not self.conjugate and not bool((det.tested() if active is None else det.tested() & active).any()):
            # nothing tested here: skip the predictive (a Langevin copy of the chains, a NUTS / SVI refit)
            alarm = torch.zeros(self.batch_shape, dtype=torch.bool, device=det.since.device)
        elif det.binary:
            alarm = det.step_binary(self.predictive_probability(X), y, active)
        else:
            alarm = det.step(self.predictive_residual(X, y), active)
        det.learned(active, alarm, y if det.binary else None)
        if bool(alarm.any()):
            self._restart(alarm, det.config.keep)

    def _restart(self, alarm: torch.Tensor, keep: float) -> None:
        """The batch elements ``alarm [*batch]`` return to the base prior, keeping ``keep`` of what
        they learned (the stabilised rule at factor ``keep``)."""
        if self.engine_name == "laplace":
            self.engine.forget(torch.where(alarm, torch.tensor(keep, dtype=_DTYPE, device=alarm.device),
                                           _ONE if alarm.device == _CPU else _ONE.to(alarm.device)))
            return
        if self.engine_name in ("gibbs", "langevin"):
            self.engine.restart(alarm, keep)
            self._test_draws = None  # (Langevin: the change test's held draws)
            return
        if self.engine_name in ("nuts", "svi"):
            self._restart_rows(alarm, keep)
            return
        p0, eta0 = self._anchor()
        a3, a2 = alarm[..., None, None], alarm[..., None]
        self.precision = torch.where(a3, p0 + keep * (self.precision - p0), self.precision)
        self.eta = torch.where(a2, eta0 + keep * (self.eta - eta0), self.eta)
        if self.noise_prior is not None:
            self._sq = torch.where(alarm, self._sq0 + keep * (self._sq - self._sq0), self._sq)
            self._a = torch.where(alarm, self._a0 + keep * (self._a - self._a0), self._a)
        self._invalidate(alarm)

    def predictive_probability(self, X) -> torch.Tensor:
        """The one-step posterior predictive probability that one more 0/1 outcome at ``X [*batch,
        d]`` is 1, ``[*batch]``: a logistic or probit model's ``E[link(x^T w)]`` under its Gaussian
        posterior (laplace engine: ``sigmoid(mu / sqrt(1 + pi s^2 / 8))``, MacKay 1992; probit:
        ``Phi(mu / sqrt(1 + s^2))`` exactly); a Gaussian model of a 0/1 metric (a linear
        probability model): its mean ``x^T m`` clipped to ``[1e-4, 1 - 1e-4]``."""
        if self.likelihood == "gaussian":
            return self._one_step_moments(X)[0].clamp(1e-4, 1.0 - 1e-4)
        if self.engine_name == "laplace":
            L, u = self.engine.factor()  # x^T w ~ N(x^T m, |L^-1 x|^2)
        elif self.engine_name == "gibbs" and self.engine.last_conditional is not None:
            L, u = self.engine.last_conditional  # the chain's Gaussian conditional at its current latents
        else:
            mean, var = self._one_step_moments(X)  # the success probability's mean: the predictive probability
            return mean
        a = torch.linalg.solve_triangular(L, X.to(_DTYPE).expand(*self.batch_shape, self.dim)[..., None], upper=False)
        mean = (a * u).sum((-2, -1))
        var = (a * a).sum((-2, -1))
        if self.likelihood == "probit":
            return torch.special.ndtr(mean / (1.0 + var).sqrt())
        return torch.sigmoid(mean / (1.0 + math.pi * var / 8.0).sqrt())

    def _one_step_moments(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``predict(X)`` for one point per batch element ``X [*batch, d]``, as the change test reads it.

        The Langevin engine under adaptive forgetting reads it from held posterior draws
        (``engine.posterior_draws``: ``predict_steps`` steps of a copy of the chains), drawn anew
        once the rows since they were drawn reach 2 % of the fewest any batch element has learned
        since its (re)start (at least one row), and after a restart: a warm model's posterior moves
        little in 2 % more rows, and one copy of the chains per tested row would cost
        ``burn_in + predict_steps`` steps per observation. Other engines: ``predict``."""
        det = self._detector
        if self.engine_name != "langevin" or det is None:
            return self.predict(X)
        n = self.engine.n
        cache = getattr(self, "_test_draws", None)
        if cache is None or n - cache[0] >= max(1, int(0.02 * cache[1])):
            cache = self._test_draws = (n, int(det.since.min()), self.engine.posterior_draws())
        f = (cache[2] * X.to(_DTYPE).expand(*self.batch_shape, self.dim)).sum(-1)  # [S, *b]
        link = _LINKS.get(self.likelihood)
        if link is not None:
            f = link(f)
        return f.mean(0), f.var(0, unbiased=False)

    def predictive_residual(self, X, y) -> torch.Tensor:
        """The standardised one-step posterior predictive residual of one more observation,
        ``(y - x^T m) / s`` with ``s^2 = sigma^2 + x^T Sigma x`` the predictive variance (the
        Normal-Inverse-Gamma model: the predictive Student-t's squared scale ``b_n / a_n (1 + x^T
        V_n x)``; a sampled engine: the draws' variance of ``x^T w`` plus ``noise_std^2``), under
        the posterior as it stands. Adaptive forgetting tests it (``_detect_change``) and the
        ``Decider``'s outlier guard refuses an outcome whose size exceeds its ``outlier_sd``.

        Args:
            X: ``[*batch, d]``, one observation per batch element.
            y: ``[*batch]``.
        Returns:
            ``z``, ``[*batch]``. A ``ValueError`` for a model of 0/1 outcomes (no noise scale).

        Engines: conjugate and Normal-Inverse-Gamma exact; Gibbs from the chain's Gaussian
        conditional of ``w`` at its current scales (``L^-T u``, ``(L L^T)^-1``: cheap, and the
        noise variance floors ``s^2`` so no scale draw can make an ordinary outcome look far out);
        Langevin, NUTS and SVI from ``predict`` (a copy of the chains, or the held draws); with a
        ``noise_prior`` off the conjugate path the noise variance is its prior mean.
        """
        if self.binary_outcomes:
            raise ValueError("predictive_residual: this model learns 0/1 outcomes; it has no noise scale to "
                             "standardise by")
        if self.conjugate:
            L = self.factor  # the posterior before this observation (cached when a draw has just used it)
            x = X.unsqueeze(-1).expand(*self.batch_shape, self.dim, 1)
            a = torch.linalg.solve_triangular(L, x, upper=False)  # L^-1 x: x^T m = u . a, x^T Lambda^-1 x = |a|^2
            mean = (self._whitened_mean() * a).sum((-2, -1))
            spread = (a * a).sum((-2, -1))
            if self.noise_prior is None:
                var = 1.0 / self._scale + spread
            else:
                a_n, b_n = self._noise_posterior()
                var = b_n / a_n * (1.0 + spread)
        else:
            conditional = getattr(self.engine, "last_conditional", None) if self.engine_name == "gibbs" else None
            if conditional is not None:
                # the Gibbs chain's Gaussian conditional of w at its current scales (the Rao-Blackwell
                # term of ``summary`` at the chain's state): O(d^2), where ``predict`` runs a copy of
                # the chain for burn_in + predict_sweeps sweeps, each O(n d^2)
                L, u = conditional
                x = X.unsqueeze(-1).expand(*self.batch_shape, self.dim, 1)
                a = torch.linalg.solve_triangular(L, x, upper=False)
                mean = (a * u).sum((-2, -1))
                spread = (a * a).sum((-2, -1))
            else:
                mean, spread = self._one_step_moments(X)
            if self.noise_std is not None:
                noise = float(self.noise_std) ** 2
            else:  # an uncertain noise variance off the conjugate path: its prior mean (infinite when a0 <= 1)
                a0, b0 = self.noise_prior.concentration, self.noise_prior.rate
                noise = torch.where(a0 > 1, b0 / (a0 - 1), torch.full_like(a0, math.inf)).to(spread)
            var = spread + noise
        return (y - mean) / var.sqrt()

    def _residual_one(self, x, y: float) -> float:
        """``predictive_residual`` of one observation of a one-stream conjugate model (batch of one
        element) in numpy and BLAS's triangular solve: the same number in about a tenth of the
        time (the Decider's outlier guard asks it at every feedback)."""
        factor = self._factor if self._dirty is None else None  # ``self.factor`` without the property's calls
        if factor is None:
            factor = self.factor
        if factor.device != _CPU:  # numpy and BLAS: the CPU's path; elsewhere the tensor one
            X = torch.as_tensor(np.asarray(x, dtype=np.float64), device=factor.device).reshape(*self.batch_shape, self.dim)
            return float(self.predictive_residual(X, torch.full(self.batch_shape, float(y), dtype=_DTYPE,
                                                                device=factor.device)).reshape(-1)[0])
        kept = self.__dict__.get("_residual_kept")
        if kept is None or kept[0] is not factor:  # numpy views of the factor and mean, kept with the factor
            d = self.dim
            noise = kept[3] if kept is not None else (1.0 / float(self._scale) if self.noise_prior is None else None)
            kept = self._residual_kept = (factor, factor.numpy().reshape(d, d), self._u.numpy().reshape(d), noise)
        _, L, u, noise = kept
        a = _dtrsv()(L, np.asarray(x, dtype=np.float64), lower=1)  # L^-1 x
        spread = float(a @ a)
        if noise is not None:
            var = noise + spread
        else:
            a_n, b_n = self._noise_posterior()
            var = float(b_n.reshape(-1)[0]) / float(a_n.reshape(-1)[0]) * (1.0 + spread)
        return (y - float(u @ a)) / math.sqrt(var)

    @property
    def change_points(self) -> torch.Tensor:
        """Adaptive forgetting: how many changes each batch element has detected (and restarted
        from the prior at), ``[*batch]`` long; an AttributeError for the other settings."""
        if self._detector is None:
            raise AttributeError("change_points: only a model with forgetting='adaptive' detects changes")
        return self._detector.alarms.clone()

    def _update_elements(self, index: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
        """Trusted conjugate update of some batch elements only: element ``index[i]`` (a flat
        index into ``batch_shape``) observes ``x [n, d]`` row ``i`` with outcome ``y [n]``.

        What per-arm models do each step (only the played arm of each replication learns):
        ``O(n d^2)`` work and a refactorisation of those elements only, instead of a masked
        update of every element. Indices may repeat (their contributions add up).
        """
        d = self.dim
        s = self._scale
        ones = torch.ones_like(index)
        flat_count = torch.zeros(self.batch_shape.numel(), dtype=torch.long, device=index.device).index_add_(0, index, ones)
        count = flat_count.reshape(self.batch_shape)
        self._masked_count = count if self._masked_count is None else self._masked_count + count
        self.precision.view(-1, d, d).index_add_(0, index, x[:, :, None] * x[:, None, :], alpha=s)
        self.eta.view(-1, d).index_add_(0, index, y[:, None] * x, alpha=s)
        if self.noise_prior is not None:
            self._sq = self._sq.clone()
            self._sq.view(-1).index_add_(0, index, y * y)
            self._a = self._a + 0.5 * count.to(self._a.dtype)
        self._invalidate(count > 0)

    def fit(self, force: bool = False) -> bool:
        """Refit a non-conjugate posterior on all data so far (conjugate models are always exact;
        the Gibbs engine runs ``burn_in`` sweeps from its current state). Returns whether it fitted.

        NUTS / SVI: when no observation arrived since the last fit (the automatic one at a draw
        included), the stored draws are already the posterior of these data and nothing runs
        (``force=True`` refits anyway, e.g. with other inference options). Before any ``update``
        there is nothing to fit: a ``UserWarning`` says so and it returns False."""
        if not self.conjugate and not int(self.num_observations.sum()):
            warnings.warn("fit(): the model has no observations yet, so its posterior is its prior and there is "
                          "nothing to fit (update it with data first)", UserWarning, stacklevel=2)
            return False
        if (not force and not self.conjugate and not self._chain_engine and self._X
                and self._since_fit == 0 and self._fitted_count):
            return False
        self._fit()
        return not self.conjugate

    def _fit(self, seeds=None) -> None:
        if self.conjugate:
            return
        if self._chain_engine:
            with single_thread():
                self.engine.fit()
            return
        if not self._X:
            raise ValueError("fit: no observations yet; call update(X, y) first")
        X = torch.cat(self._X, dim=-2)
        y = torch.cat(self._y, dim=-1)
        if self.forgetting is not None and self._detector is None:  # rows weighing less than 2^-60 no
            # longer move the posterior
            from ._forgetting import forgetting_weights

            start, _ = forgetting_weights(self.forgetting, X.shape[-2], X.device)
            X, y = X[..., start:, :], y[..., start:]
        weights = self._restart_row_weights(X.shape[-2])
        if weights is not None:  # rows every element has forgotten no longer enter the fit
            kept = (weights > 0).reshape(-1, weights.shape[-1]).any(0).nonzero()
            start = int(kept[0]) if kept.numel() else weights.shape[-1]
            X, y, weights = X[..., start:, :], y[..., start:], weights[..., start:]
            self._row_weight = weights
        self._X, self._y = [X], [y]
        with single_thread():  # small-model fits ran 10-20x slower with 2 threads on a loaded machine
            self.engine.fit(X, y, seeds=seeds, weights=weights)
        self._draws = self.engine.draws
        self._since_fit = 0
        self._restart_pending = False
        # the rows the least-informed element fitted (after a restart its own, weighed): the next refit
        # comes when that count doubled, so a restarted element is refitted as often as a new one
        self._fitted_count = X.shape[-2] if weights is None else max(int(weights.sum(-1).min()), 1)

    def _restart_row_weights(self, n: int) -> torch.Tensor | None:
        """NUTS / SVI: the ``[*batch, n]`` weights of the stored rows left by adaptive restarts (rows
        learned since the last restart weigh 1), or None when no element has restarted."""
        w = self._row_weight
        if w is None:
            return None
        if w.shape[-1] < n:
            w = torch.cat([w, torch.ones((*self.batch_shape, n - w.shape[-1]), dtype=_DTYPE, device=w.device)], -1)
        return w

    def _restart_rows(self, alarm: torch.Tensor, keep: float) -> None:
        """NUTS / SVI restart (issue 43): the rows the batch elements ``alarm [*batch]`` learned so far
        weigh ``keep`` in every later fit (row ``i``'s log-likelihood times its weight; the prior
        kept), and the next query refits."""
        n = sum(X.shape[-2] for X in self._X)
        w = self._restart_row_weights(n)
        if w is None:
            w = torch.ones((*self.batch_shape, n), dtype=_DTYPE, device=self.device)
        self._row_weight = torch.where(alarm[..., None], keep * w, w)
        self._restart_pending = True

    @property
    def unfitted_observations(self) -> int:
        """NUTS / SVI: observations not yet reflected in the stored draws (0 for other engines)."""
        if self.conjugate or self._chain_engine:
            return 0
        return self._since_fit

    def _refit_due(self) -> bool:
        """NUTS / SVI: whether the lazy refit schedule calls for a refit before the next query."""
        if self._restart_pending:
            return True
        if self._since_fit == 0:
            return False
        if self.refit_every is not None:
            return self._since_fit >= self.refit_every
        return self._since_fit >= max(self._fitted_count, 1)  # the data doubled since the last fit

    # ------------------------------------------------------------------ conjugate state
    def _invalidate(self, changed: torch.Tensor | None) -> None:
        """The precision of the batch elements ``changed [*batch]`` (bool; None: all) moved: their
        factor is recomputed on next use, the others' is kept."""
        if changed is None or self._factor is None:
            self._factor, self._dirty = None, None
        else:
            self._dirty = changed if self._dirty is None else self._dirty | changed

    def _invalidate_one(self, index: int) -> None:
        """``_invalidate`` of the one batch element at flat ``index``, in place: the mask this method
        made is reused while it is the model's (``PerArmLinear``'s one-stream path marks the played
        arm after every update; a new mask per update cost as much as the update's arithmetic)."""
        if self._factor is None:
            return
        own = getattr(self, "_own_dirty", None)
        if own is None or self._dirty is not own[0]:
            mask = torch.zeros(self.batch_shape, dtype=torch.bool, device=self._factor.device) if self._dirty is None \
                else self._dirty.clone()
            self._dirty = mask
            # the CPU's numpy view (an element written without a tensor call); elsewhere the flat view
            own = self._own_dirty = (mask, mask.numpy().reshape(-1) if mask.device == _CPU else mask.view(-1))
        own[1][index] = True

    def _stale(self) -> bool:
        return self._factor is None or self._dirty is not None

    def _factorize(self) -> None:
        if self._factor is not None and self._dirty is not None:
            # masked updates (per-arm models) changed some batch elements only: refactor those
            d = self.dim
            idx = self._dirty.reshape(-1).nonzero().reshape(-1)
            self._dirty = None
            if idx.numel():
                sub = _cholesky(self.precision.reshape(-1, d, d).index_select(0, idx))
                u_sub = torch.linalg.solve_triangular(sub, self.eta.reshape(-1, d, 1).index_select(0, idx), upper=False)
                # out of place: a factor handed out earlier keeps describing the posterior it came from
                self._factor = self._factor.reshape(-1, d, d).index_copy(0, idx, sub).reshape(self._factor.shape)
                self._u = self._u.reshape(-1, d, 1).index_copy(0, idx, u_sub).reshape(self._u.shape)
            return
        if self._count == 0 and self._masked_count is None and self._factorize_shared():
            return
        precision = self.precision
        if precision.dim() == 2 or (precision.dim() == 3 and precision.shape[0] == 1):
            # one matrix (the one-stream case): ``_cholesky``'s first step inline, its jitter if it fails
            factor, info = torch.linalg.cholesky_ex(precision)
            self._factor = _cholesky(precision) if info.item() else factor
        else:
            self._factor = _cholesky(precision)
        self._u = torch.linalg.solve_triangular(self._factor, self._eta_column(), upper=False)

    def _eta_column(self) -> torch.Tensor:
        """``eta[..., None]``, ``[*batch, d, 1]``: one view kept while ``eta`` is the same tensor (every
        update writes it in place; a loaded state assigns a new one), instead of a new view per
        factorisation (a view costs about 1 us, a tenth of a one-stream factorisation)."""
        eta = self.eta
        kept = self.__dict__.get("_eta_view")
        if kept is None or kept[0] is not eta:
            kept = self._eta_view = (eta, eta[..., None])
        return kept[1]

    def _factorize_shared(self) -> bool:
        """Before any observation, when every batch element holds the same prior (a prior without
        batch dimensions): factor one element and copy it to all, True; else False.

        A batched Cholesky factors each matrix on its own, so this is bit for bit the batched
        factor, at the cost of one comparison pass instead of ``R`` factorisations (issue 20:
        0.2 to 0.7 s of the first step at R = 10,000, d = 64).
        """
        if len(self.batch_shape) == 0 or self.batch_shape.numel() < 2:
            return False
        d = self.dim
        precision, eta = self.precision.reshape(-1, d, d), self.eta.reshape(-1, d)
        if not (torch.equal(precision, precision[:1].expand_as(precision)) and torch.equal(eta, eta[:1].expand_as(eta))):
            return False
        factor = _cholesky(precision[:1])
        u = torch.linalg.solve_triangular(factor, eta[:1, :, None], upper=False)
        # expanded views (stride 0 over the batch), not R copies: at R = 10,000, d = 64 a copy is
        # 328 MB written before the first draw; _solve_upper solves against them in chunks
        self._factor = factor[0].expand(*self.batch_shape, d, d)
        self._u = u[0].expand(*self.batch_shape, d, 1)
        return True

    def _solve_upper(self, rhs: torch.Tensor) -> torch.Tensor:
        """``L^-T rhs`` for ``rhs [*batch, d, 1]``: the draw's triangular solve.

        A factor shared by the whole batch (``_factorize_shared``, an expanded view) is solved
        against in chunks of at most 2^20 numbers of materialised factor, instead of letting the
        solver copy it ``R`` times at once; each matrix is still solved on its own, so the numbers
        are those of the dense batched solve.
        """
        L = self._factor
        if rhs.dim() == L.dim() + 1 and rhs.shape[-1] == 1 and rhs.shape[0] > 1:
            # S draws at once (a DrawBatch: rhs [S, *batch, d, 1]): one solve with S right-hand
            # columns per factor, instead of the S broadcast copies of the factor and S one-column
            # solves the batched call makes (R = 1, d = 4, S = 200: 19 us against 44). Each column
            # is the same back substitution, though not always in the same rounding (a few ulp).
            cols = rhs[..., 0].movedim(0, -1)  # [*batch, d, S]
            return torch.linalg.solve_triangular(L.mT, cols, upper=True).movedim(-1, 0)[..., None]
        if L.dim() < 3 or L.stride(0) != 0 or rhs.dim() != 3:
            return torch.linalg.solve_triangular(L.mT, rhs, upper=True)
        R, d = rhs.shape[0], self.dim
        step = max(1, min(R, (1 << 20) // (d * d)))
        dense = L[:step].contiguous()
        out = torch.empty(rhs.shape, dtype=rhs.dtype, device=rhs.device)
        for start in range(0, R, step):
            n = min(step, R - start)
            out[start:start + n] = torch.linalg.solve_triangular(dense[:n].mT, rhs[start:start + n], upper=True)
        return out

    @property
    def factor(self) -> torch.Tensor:
        """Lower Cholesky factor ``L`` of the posterior precision ``L L^T = Lambda``, ``[*batch, d, d]`` (cached)."""
        if self._stale():
            self._factorize()
        return self._factor

    def _whitened_mean(self) -> torch.Tensor:
        """``L^-1 eta``, ``[*batch, d, 1]`` (cached with the factor): the mean is ``L^-T`` of it."""
        if self._stale():
            self._factorize()
        return self._u

    def _noise_posterior(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(a_n, b_n)`` of the Inverse-Gamma posterior on the noise variance (NIG only)."""
        u = self._whitened_mean()[..., 0]
        b = self._b0 + 0.5 * (self._sq - (u * u).sum(-1)).clamp_min(0.0)
        return self._a, b

    def _require_conjugate(self, what: str) -> None:
        if not self.conjugate:
            raise AttributeError(f"{what} is exact only for conjugate models; use sample()/predict() or the draws of a non-conjugate fit")

    @property
    def posterior_mean(self) -> torch.Tensor:
        """Posterior mean of ``w``, ``[*batch, d]``."""
        if self._chain_engine:
            return self.engine.summary(None)[0]
        if not self.conjugate:
            self._refit_if_due()
            return self._draws.mean(0)
        return torch.cholesky_solve(self.eta[..., None], self.factor)[..., 0]

    @property
    def posterior_covariance(self) -> torch.Tensor:
        """Posterior covariance of ``w``, ``[*batch, d, d]`` (for NIG, of the marginal Student-t, ``a_n > 1``;
        for the laplace engine, of its Gaussian approximation)."""
        if self.engine_name == "laplace":
            return self.engine.covariance()
        self._require_conjugate("posterior_covariance")
        cov = torch.cholesky_inverse(self.factor)
        if self.noise_prior is not None:
            a, b = self._noise_posterior()
            cov = cov * (b / (a - 1)).clamp_min(0)[..., None, None]
            cov = torch.where((a > 1)[..., None, None], cov, torch.full_like(cov, float("inf")))
        return cov

    @property
    def noise_variance_posterior(self) -> tdist.InverseGamma:
        """The Inverse-Gamma posterior of the noise variance (NIG models only)."""
        self._require_conjugate("noise_variance_posterior")
        if self.noise_prior is None:
            raise AttributeError("noise_variance_posterior: this model has a known noise_std")
        a, b = self._noise_posterior()
        return tdist.InverseGamma(a, b)

    # ------------------------------------------------------------------ queries
    def predict(self, X) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance of the linear function ``x^T w`` (noise excluded).

        Args:
            X: ``[*batch, k, d]`` (or ``[*batch, d]`` for one point per batch element).
        Returns:
            ``(mean, variance)``, each ``[*batch, k]`` (or ``[*batch]``).
        """
        X = check_finite(as_tensor(X, "X"), "X")
        nb = len(self.batch_shape)
        single = X.dim() == nb + 1
        expected = (f"X: expected shape [*batch_shape, k, {self.dim}] or [*batch_shape, {self.dim}] with "
                    f"batch_shape {list(self.batch_shape)}, got {list(X.shape)}")
        if X.dim() == 0 or X.shape[-1] != self.dim:
            raise ValueError(f"X: expected last dimension {self.dim} (shape [*batch_shape, k, {self.dim}]), got shape {list(X.shape)}")
        if X.dim() < nb + 1:
            raise ValueError(expected)
        try:
            torch.broadcast_shapes(X.shape[:-1] if single else X.shape[:-2], self.batch_shape)
        except RuntimeError:
            raise ValueError(expected) from None
        Xk = X[..., None, :] if single else X
        if self.conjugate:
            L = self.factor
            mean = (Xk @ self.posterior_mean[..., None])[..., 0]
            v = torch.linalg.solve_triangular(L, Xk.mT, upper=False)  # [*b, d, k]
            var = (v * v).sum(-2)
            if self.noise_prior is not None:
                a, b = self._noise_posterior()
                scale = torch.where(a > 1, b / (a - 1), torch.full_like(a, float("inf")))
                var = var * scale[..., None]
        elif self._chain_engine:
            Xk = Xk.expand(*self.batch_shape, *Xk.shape[-2:])
            _, mean, var = self.engine.summary(Xk, link=_LINKS.get(self.likelihood))
        else:
            self._refit_if_due()
            f = Xk @ self._draws[..., None]  # [S, *b, k, 1]
            f = f[..., 0]
            mean, var = f.mean(0), f.var(0)
        return (mean[..., 0], var[..., 0]) if single else (mean, var)

    def sample(self, sample_shape=(), generator: Generator = None, key: str = "weights") -> torch.Tensor:
        """Joint posterior draws of the weights, ``[*sample_shape, *batch, d]``, as torch's and Pyro's
        ``sample(sample_shape)``: ``m.sample()`` is one draw ``[*batch, d]``, ``m.sample((100,))``
        100 of them. A generator in first place, ``m.sample(generator)``, is one draw (the form
        the policies use).

        Args:
            sample_shape: the leading shape of the draws (a tuple, list or ``torch.Size``; default
                ``()``: one draw).
            generator: ``None``, a ``torch.Generator`` or a ``ReplicationRNG``.
            key: the stream name when ``generator`` is a ReplicationRNG (models sampled in the
                same step need distinct keys).

        Several draws are independent for the conjugate engines and the stored NUTS / SVI draws,
        and consecutive states of the chain for the Gibbs and Langevin engines (which move on).
        """
        if sample_shape is None or isinstance(sample_shape, (torch.Generator, ReplicationRNG)):
            sample_shape, generator = (), sample_shape  # ``sample(generator)``
        check_generator(generator)
        try:
            shape = torch.Size(sample_shape)
        except TypeError:
            shape = None
        if shape is None or any(n < 0 for n in shape):
            raise ValueError(f"sample_shape: expected a tuple of sizes >= 0 (torch.Size), e.g. (100,), got "
                             f"{sample_shape!r} (the generator goes by keyword: sample((100,), generator=g))")
        if not len(shape):
            return self._sample_one(generator, key)
        n = shape.numel()
        if (self.conjugate and self.noise_prior is None and not isinstance(generator, ReplicationRNG)):
            # independent draws in one solve: z [n, *batch, d, 1]
            if self._stale():
                self._factorize()
            z = standard_normal((n, *self._column_shape), generator, dtype=_DTYPE, device=self.device)
            draws = self._solve_upper(self._u + z)[..., 0]
        else:
            draws = torch.stack([self._sample_one(generator, key) for _ in range(n)]) if n else \
                torch.empty((0, *self.batch_shape, self.dim), dtype=_DTYPE, device=self.device)
        return draws.reshape(*shape, *self.batch_shape, self.dim)

    def _sample_one(self, generator: Generator = None, key: str = "weights") -> torch.Tensor:
        """One joint posterior draw of the weights, ``[*batch, d]`` (``sample``)."""
        if self.conjugate:
            z = standard_normal(self._column_shape, generator, key=key, device=self.precision.device)  # [*batch, d, 1]
            if self._stale():
                self._factorize()
            if self.noise_prior is not None:
                a, b = self._noise_posterior()
                s2 = b / standard_gamma(a, generator, key=key + "/noise")
                z = z * s2.sqrt()[..., None, None]
            return self._solve_upper(self._u + z)[..., 0]
        if self._chain_engine:
            return self.engine.draw(generator, key)
        self._refit_if_due(generator, key)
        S = self._draws.shape[0]
        # [*b] stored draws picked uniformly ([num_draws, *b] under a DrawBatch: the stored draws do not change)
        idx = (standard_uniform(self.batch_shape, generator, key=key, device=self._draws.device) * S).long().clamp_max(S - 1)
        flat = self._draws.reshape(S, -1, self.dim)
        picked = flat[idx.reshape(-1, flat.shape[1]), torch.arange(flat.shape[1], device=flat.device)]
        return picked.reshape(*idx.shape, self.dim)

    def sample_at(self, features, generator: Generator = None, key: str = "weights") -> torch.Tensor:
        """One joint draw of ``f(x) = x^T w`` at candidate features ``[*batch, k, d]`` -> ``[*batch, k]``."""
        if generator is not None and not isinstance(generator, (torch.Generator, ReplicationRNG)):
            check_generator(generator)
        if not isinstance(features, torch.Tensor) or features.dtype != _DTYPE:
            features = as_tensor(features, "features")
        if features.dim() < 2 or features.shape[-1] != self.dim:
            raise ValueError(f"features: expected shape [*batch_shape, k, {self.dim}], got {list(features.shape)}")
        if type(generator) is DrawBatch and generator.independent_rows and features.dim() == 3 and self.row_draws:
            return self._row_draws_at(features, generator)
        if self.conjugate and self.noise_prior is None and features.dim() == len(self.batch_shape) + 2:
            if type(generator) is DrawBatch and features.dim() == 3:
                return self._draws_at(features, generator)
            # ``sample``'s draw kept as the solve's column [.., d, 1]: w^T X^T without the reshaping
            # views (the same operations and numbers; a tenth of a decision at R = 1)
            device = self.precision.device
            if generator is None or (type(generator) is torch.Generator and generator.device == device):
                # standard_normal's own call; the fresh normals take u in place (z + u is u + z, bit for bit)
                z = torch.randn(self._column_shape, generator=generator, dtype=_DTYPE, device=device)
                if self._factor is None or self._dirty is not None:
                    self._factorize()
                rhs = z.add_(self._u)
            else:  # a stream's numbers are a view of its block: not written
                z = standard_normal(self._column_shape, generator, key=key, device=device)
                if self._factor is None or self._dirty is not None:
                    self._factorize()
                rhs = self._u + z
            L = self._factor
            if L.dim() < 3 or L.stride(0) != 0:  # _solve_upper's one-solve case, without its dispatch
                w = torch.linalg.solve_triangular(L.mT, rhs, upper=True)
            else:
                w = self._solve_upper(rhs)
            if w.dim() == 3:  # [R, d, 1]: bmm, half matmul's call cost (the same product)
                return torch.bmm(w.mT, _transposed(features)).squeeze(-2)
            return (w.mT @ _transposed(features))[..., 0, :]
        w = self.sample(generator, key=key)
        extra = features.dim() - 2 - len(self.batch_shape)
        if extra > 0 and w.dim() > len(self.batch_shape) + 1:
            # S draws (a DrawBatch) of a model with fewer batch axes than the features (the unbatched
            # model at features [1, k, d]): [S, 1, d], so that the result keeps the features' axes
            lead = w.dim() - len(self.batch_shape) - 1
            w = w.reshape(*w.shape[:lead], *(1,) * extra, *w.shape[lead:])
        return self._link_at(w, _transposed(features))

    def _link_at(self, w: torch.Tensor, ft: torch.Tensor) -> torch.Tensor:
        """``link(w^T X^T)`` of weights ``w [.., d]`` at transposed features ``ft [.., d, k]`` (``_transposed``)
        -> ``[.., k]``: ``sample_at``'s last step (the identity for a Gaussian likelihood)."""
        f = (w[..., None, :] @ ft)[..., 0, :]
        if self.likelihood == "gaussian":
            return f
        from .gibbs import lanewise

        return lanewise(_LINKS[self.likelihood], f)

    def _chain_draws_at(self, features: torch.Tensor, S: int, generator: Generator, key: str) -> torch.Tensor | None:
        """``S`` successive ``sample_at(features, generator, key=key)``, ``[S, *batch, K]``, of a chain engine
        (Gibbs, Langevin, the online Laplace) at float64 features ``[*batch, K, d]`` under an ordinary
        generator: the same operations and numbers, the checks of the features and the generator made once
        (the chance bank's draws, ``TSASC(chance_refresh=)``). None where that does not apply."""
        if (self.conjugate or not self._chain_engine or isinstance(generator, DrawBatch)
                or type(features) is not torch.Tensor or features.dtype != _DTYPE
                or features.dim() != len(self.batch_shape) + 2 or features.shape[-1] != self.dim):
            return None
        check_generator(generator)
        ft = _transposed(features)
        return torch.stack([self._link_at(self.engine.draw(generator, key), ft) for _ in range(S)])

    @property
    def row_draws(self) -> bool:
        """Whether this model draws the rows of features ``[n, K, d]`` as separate decisions in one call
        under a ``DrawBatch(independent_rows=True)`` (``_row_draws_at``): a model of one stream (batch
        shape ``[]`` or ``[1]``) whose draws are a function of fixed posterior parameters (the conjugate
        engines, NUTS / SVI's stored draws). Not the chain engines (Gibbs, Langevin), whose propensity
        draws come from copies of the chain with shared latent variables: ``Policy.row_probabilities``
        asks them row by row."""
        return len(self.batch_shape) <= 1 and self.batch_shape.numel() == 1 and not self._chain_engine

    def _row_draws_at(self, features: torch.Tensor, batch: DrawBatch) -> torch.Tensor:
        """``S`` draws of ``f(x) = x^T w`` at each row of ``features [n, K, d]``, independent across
        rows: ``[S, n, K]`` (a model of one stream under ``DrawBatch(independent_rows=True)``).

        Each row's ``S`` draws have the law of ``S`` draws of ``sample_at`` at that row alone; the
        random numbers differ. Conjugate engines: with ``L L^T`` the precision, ``u = L^-1 eta`` and
        ``C = L^-1 X^T [d, K]`` a row's ``f = C^T (u + z)``, ``z ~ N(0, I_d)``. With ``C = Q R`` its
        reduced QR (``Q [d, m]`` orthonormal columns, ``R [m, K]``, ``m = min(d, K)``), ``Q^T z ~ N(0,
        I_m)``, so ``f = C^T u + R^T z'`` with ``z' ~ N(0, I_m)``: ``m`` normals a draw instead of ``d``
        and one ``[S, m] x [m, K]`` product a row instead of a ``d x d`` solve a draw (exact in law,
        also for rank-deficient candidates: repeated or zero rows of padding). ``C^T = X L^-T`` is
        one matrix product of all rows with the inverse factor. Normal-Inverse-Gamma: ``z'`` scaled
        by ``sigma`` drawn per row and draw (as ``sample`` scales ``z``). The mean ``X mu`` in float64,
        the spread ``R^T z'`` in float32 (as the float32 normals of every ``DrawBatch``: a relative
        error near 1e-7 of a posterior sd, far below any Monte-Carlo error). NUTS / SVI: each row's draws
        picked uniformly among the stored draws (as ``sample``'s picks), a refit that is due first.
        Cost (d = 90, K = 20, S = 100, one thread): about 40 us a row, against 0.36 ms a row of a
        two-model TS-ASC through ``action_probabilities`` (benchmarks/log_propensities.py).
        """
        S = batch.num_draws
        n, K, d = features.shape
        if self.conjugate:
            if self._stale():
                self._factorize()
            L = self._factor.reshape(d, d)
            mean = features @ torch.linalg.solve_triangular(L.mT, self._u.reshape(d, 1), upper=True)  # [n, K, 1]: X mu
            # the spread in float32 (the float32 normals of every DrawBatch; a relative error near 1e-7 of
            # a posterior sd), the mean in float64: half the time of the product and the QR
            inv = torch.linalg.solve_triangular(L, torch.eye(d, dtype=_DTYPE, device=L.device), upper=False).to(torch.float32)
            ct = (features.reshape(n * K, d).to(torch.float32) @ inv.mT).reshape(n, K, d)  # C^T = X L^-T, per row
            r = torch.linalg.qr(ct.mT, mode="r").R  # [n, m, K]
            z = standard_normal((n, S, r.shape[-2]), batch.generator, dtype=torch.float32, device=L.device)
            if self.noise_prior is not None:
                a, b = self._noise_posterior()
                s2 = b / standard_gamma(a.reshape(()).expand(n), batch, key="rows/noise")  # [S, n]
                z = z * s2.sqrt().mT[..., None].to(torch.float32)
            f = torch.bmm(z, r).to(_DTYPE).add_(mean.mT)  # [n, S, K]
        else:
            self._refit_if_due(batch)
            stored = self._draws.reshape(self._draws.shape[0], d)
            idx = (standard_uniform((n, S), batch.generator, dtype=_DTYPE, device=stored.device) * stored.shape[0]).long()
            w = stored[idx.clamp_max(stored.shape[0] - 1)]  # [n, S, d]
            f = torch.bmm(w, features.mT)  # [n, S, K]
        f = f.transpose(0, 1)
        if self.likelihood == "gaussian":
            return f
        from .gibbs import lanewise

        return lanewise(_LINKS[self.likelihood], f)

    def _thompson_argmax(self, features: torch.Tensor, generator: Generator) -> torch.Tensor | None:
        """``sample_at(features, generator).argmax(-1)``, actions ``[R]``, for features ``[R, K, d]``
        checked by a policy (float64, this model's ``R`` and ``d``, ``R K <= 1024``) of a conjugate
        known-noise model with ``batch_shape [R]`` and ``generator`` None or a ``torch.Generator``; None
        otherwise (the caller then takes ``sample_at``).

        ``ThompsonSampling.select``'s one decision: the same numbers as ``sample_at``'s (the normals
        and ``u + z`` as one ``torch.normal(u, 1)``, the solve, ``w^T X^T``), written into buffers kept
        per shape whose row views are made once (the draw's ``w^T [R, 1, d]``, the scores ``[R, K]``):
        three operations and three allocations fewer a decision. Only the argmax leaves (a new tensor).
        """
        if (generator is not None and type(generator) is not torch.Generator) or not self.conjugate \
                or self.noise_prior is not None or len(self.batch_shape) != 1:
            return None
        device = self.precision.device
        if generator is not None and generator.device != device:  # sample_at draws on the generator's device
            return None
        R, K, d = features.shape
        if R * K > 1024 or R != self.batch_shape[0]:
            return None
        if self._factor is None or self._dirty is not None:
            self._factorize()
        L = self._factor
        if L.stride(0) == 0 and R > 1:  # a factor shared by the batch: _solve_upper's chunks
            return None
        # per thread (a policy shared by threads never shares a buffer; the ones a thread is using stay
        # its own when another replaces them), and per mode (inference buffers are not written outside it)
        ident = (R, K, threading.get_ident())
        bufs = self.__dict__.get("_argmax_buffers")
        if bufs is None or bufs[0] != ident or bufs[1].is_inference() != torch.is_inference_mode_enabled():
            z, w, scores = (torch.empty(R, d, 1, dtype=_DTYPE, device=device), torch.empty(R, d, 1, dtype=_DTYPE, device=device),
                            torch.empty(R, 1, K, dtype=_DTYPE, device=device))
            bufs = self._argmax_buffers = (ident, z, w, w.view(R, 1, d), scores, scores.view(R, K))
        _, z, w, w_row, scores, flat = bufs
        # normal(u, 1): torch's standard normals of randn, then + u (z * 1 is z): sample_at's u + z in one call
        torch.linalg.solve_triangular(L.mT, torch.normal(self._u, 1.0, generator=generator, out=z), upper=True, out=w)
        torch.bmm(w_row, _transposed(features), out=scores)
        return flat.argmax(-1)

    def _draws_at(self, features: torch.Tensor, batch: DrawBatch) -> torch.Tensor:
        """``S`` joint draws of ``f = X w`` at ``features [R, K, d]`` under a ``DrawBatch``:
        ``[S, R, K]`` (conjugate, known noise; the propensity draws of a ``Decider``).

        With ``L L^T`` the precision and ``u = L^-1 eta``, a draw is ``w = L^-T (u + z)``, so
        ``f = C^T (u + z)`` with ``C = L^-1 X^T [R, d, K]``: one triangular solve against the ``K``
        candidates (not the ``S`` draws) and one product of the ``S`` shifted normals with ``C``, the
        result ``[S, K]`` contiguous in ``K`` for the argmax. The normals are those ``sample``
        would use, ``z [S, R, d]`` in the same order; the sums are associated differently (a few
        ulp from ``X (L^-T (u + z))``). R = 1, d = 4, K = 5, S = 200: seven operations (the solve,
        the normals, their widening addition, one ``[S, d] x [d, K]`` product, three views), with the
        factor cached. TS-ASC draws its reward and constraint models together
        (``_stacked_draws_at``).
        """
        R = features.shape[0]
        if self._factor is None or self._dirty is not None:
            self._factorize()
        C = torch.linalg.solve_triangular(self._factor, features.mT, upper=False)  # [R, d, K]
        if R == 1:
            # the float32 normals that ``_full`` widens, widened by the addition itself (float64 sums,
            # the same numbers, one operation fewer); [S, 1, d] x [d, K]: matmul folds the S rows into
            # one product (against C [1, d, K] it ran S batched products, 10 us against 4.5)
            z = batch._normal32((R, self.dim), C.device)  # [S, 1, d] float32
            return torch.matmul(torch.add(z, self._u.mT), C[0])  # [S, 1, K]
        z = batch._full("normal", (R, self.dim), _DTYPE, C.device)  # [S, R, d]
        return torch.bmm(z.add_(self._u[..., 0]).transpose(0, 1), C).transpose(0, 1)  # [R, S, K] -> [S, R, K]

    @property
    def _stack_key(self) -> tuple | None:
        """``(d, batch_shape)`` when ``_stacked_draws_at`` can draw this model together with others of the
        same key (a conjugate, known-noise Gaussian model of one stream: batch shape ``[]`` or
        ``[1]``), else None."""
        if (self.conjugate and self.noise_prior is None and self.likelihood == "gaussian"
                and len(self.batch_shape) <= 1 and self.batch_shape.numel() == 1):
            return self.dim, tuple(self.batch_shape)
        return None

    @staticmethod
    def _stacked_draws_at(models: Sequence[BayesianLinear], features: torch.Tensor, batch: DrawBatch,
                          with_solve: bool = False, joint: _JointPosterior | None = None, as_numpy: bool = False):
        """``S`` joint draws of ``f = X w`` of each of ``M`` one-stream models at ``features [1, K, d]``
        under a ``DrawBatch``, in one batch: ``[M, S, K]`` (row ``m``: model ``m``'s draws, as
        ``_draws_at`` gives them, ``[S, 1, K]``).

        For TS-ASC's propensity draws (a reward and constraint models at the same candidates): the
        models' factors ``L [M, d, d]`` and whitened means ``u [M, d, 1]`` (each computed and cached
        by its model, so nothing is factored twice; when all changed, factored in one call), one
        triangular solve ``C = L^-1 X^T [M, d, K]``, the normals ``[M, S, d]`` (model ``m``'s the
        ``m``-th of ``M`` successive float32 draws of the generator, as ``_draws_at`` would draw them
        model after model, widened by the addition) and one batched product ``(u + z)^T C``
        (R = 1, d = 4, K = 5, S = 200, M = 2: 15 tensor operations with both factorisations against
        18 with ``_draws_at``, and fewer Python calls; the normals the same, the products' last bits
        possibly not). Every model must have the same ``_stack_key``. ``with_solve``: also return
        ``C = L^-1 X^T [M, d, K]`` and the whitened means ``u [M, d, 1]`` (``(draws, C, u)``): the
        played candidate's column of ``C`` is the Decider's outlier guard's ``L^-1 x`` while the
        models' factors stay the same. ``joint``: the models' ``_JointPosterior`` (their precisions
        and etas views of one buffer each), read in place of joining them (two operations fewer).

        On the CPU the last step, ``(u + z)^T C``, runs in numpy on torch's memory (the same
        widening addition; the product's last bits may differ from ``torch.bmm``'s, as the stacked
        product's already may from one model's ``_draws_at``): two torch calls fewer.

        ``as_numpy`` (``TSASC._stacked_actions``, the Decider's propensity draws): the same numbers
        as numpy arrays, ``(draws [M, K, S], C [M, d, K], u [M, d, 1])`` (the draws in the product's
        own layout, a candidate's ``S`` draws a row; with ``with_solve`` or without), without the
        tensor made of the product and the arrays made again of it (three calls fewer a decision).
        """
        batched = models[0].precision.dim() == 3  # [1, d, d] each (batch shape [1]), else [d, d]
        join = torch.cat if batched else torch.stack  # -> [M, d, d]
        for m in models:  # (a loop: all()'s generator costs more than the test on two models)
            if m._factor is not None:
                fresh = False
                break
        else:
            fresh = True
        if fresh:
            # every model changed (each learned the last outcome): factored in one batched call, each
            # matrix on its own (the numbers of ``_factorize``), and each model keeps its part
            L, info = torch.linalg.cholesky_ex(join([m.precision for m in models]) if joint is None else joint.precision)
            if any(info.tolist()):  # numerically not positive definite: each model's own jitter
                for m in models:
                    m._factorize()
                L = join([m._factor for m in models])
            eta = join([m._eta_column() for m in models]) if joint is None else joint.eta_column
            u = torch.linalg.solve_triangular(L, eta, upper=False)
            # each model's part as a view (the views L[i:i + 1] / L[i] are): all of them in one call each
            # (split_with_sizes / unbind, about 0.7x the time of a slice per model; not Tensor.split's
            # Python wrapper, 8 us)
            parts = (L.split_with_sizes([1] * len(models)), u.split_with_sizes([1] * len(models))) if batched \
                else (L.unbind(0), u.unbind(0))
            for m, factor, mean in zip(models, *parts):
                m._factor, m._u = factor, mean
        else:
            for m in models:
                if m._factor is None or m._dirty is not None:
                    m._factorize()
            L = join([m._factor for m in models])
            u = join([m._u for m in models])  # [M, d, 1]
        C = torch.linalg.solve_triangular(L, features.mT, upper=False)  # [M, d, K]
        # each model's normals drawn in turn, as ``_draws_at`` draws them model after model (the same
        # numbers as TS-ASC's one model at a time: a stream seeded before keeps its decisions)
        M, n = len(models), batch.num_draws * models[0].dim
        cpu = C.is_cpu
        if n % 16 == 0:
            # torch's CPU normal sampler fills blocks of 16 from the stream in order, so M successive
            # draws of S d normals (S d a multiple of 16) are the first M S d normals of one draw: one
            # call instead of M and a stack (4 us of 11 at M = 2, S = 200, d = 4; tested)
            z = torch.randn((M, batch.num_draws, models[0].dim), generator=batch.generator, dtype=torch.float32,
                            device=batch.device)
            if not (cpu and z.is_cpu) and z.device != C.device:  # (both on the CPU: the same device, no objects made)
                z = z.to(C.device)
        else:
            z = torch.stack([batch._normal32((models[0].dim,), C.device) for _ in models])  # [M, S, d] float32
        if cpu and not (C.requires_grad or u.requires_grad):
            # numpy on torch's memory: the same float32 -> float64 widening addition and one stacked
            # product, without two torch calls (about 20 us in the Decider's loop against 8), made as
            # C^T (z^T + u) [M, K, S] and handed out as its [M, S, K] view: TS-ASC's test then reads each
            # candidate's S draws as one contiguous row (``TSASC._stacked_actions``)
            Cn, un = C.numpy(), u.numpy()
            product = np.matmul(Cn.transpose(0, 2, 1), z.numpy().transpose(0, 2, 1) + un)
            if as_numpy:
                return product, Cn, un
            draws = torch.from_numpy(product).transpose(1, 2)
        else:
            draws = torch.bmm(torch.add(z, u.mT), C)  # [M, S, K]
            if as_numpy:  # (what the arrays of these tensors are; a tensor that needs a gradient has none)
                return draws.numpy().transpose(0, 2, 1), C.numpy(), u.numpy()
        return (draws, C, u) if with_solve else draws

    def _refit_if_due(self, generator: Generator = None, key: str = "weights") -> None:
        """Refit when the schedule says so. With a ``ReplicationRNG`` each batch element's fit is
        seeded from its own stream, so replication r of a batch refits as its one-replication run."""
        if not self._refit_due():
            return
        seeds = None
        if isinstance(generator, ReplicationRNG) and not isinstance(generator, DrawBatch):
            u = standard_uniform(self.batch_shape, generator, key=key + "/refit", device=_CPU).reshape(-1)
            seeds = (u * 2**31).long().tolist()
        self._fit(seeds)

    def __repr__(self) -> str:
        noise = f"noise_std={self.noise_std}" if self.noise_std is not None else "noise_prior=InverseGamma"
        if self.likelihood != "gaussian":
            noise = f"likelihood={self.likelihood!r}"
        stale = ""
        if self.unfitted_observations:
            stale = f", unfitted_observations={self.unfitted_observations} (refit at the next draw or fit())"
        forget = "" if self.forgetting is None else f", forgetting={self.adaptive.describe(self._detector.binary)}" if self.adaptive is not None else (
            f", forgetting={self.forgetting} ({self.forgetting_rule})")
        return (f"BayesianLinear(dim={self.dim}, {noise}, batch_shape={list(self.batch_shape)}, "
                f"inference={self.engine_name!r}{forget}{stale})")


class _JointPosterior:
    """The posteriors of ``M`` one-stream conjugate known-noise models that learn the same rows
    (TS-ASC's reward and constraint models, ``_stack_key`` alike), held jointly: each model's
    ``precision`` and ``eta`` are views of one buffer each, ``precision [M, d, d]`` and
    ``eta [M, d]`` (a model of batch shape ``[1]`` the slices ``[m:m + 1]``, an unbatched one
    ``[m]``), so ``BayesianLinear._stacked_draws_at`` factors them without joining them first (two
    operations fewer per decision). ``update`` and every other path still teach each model on its
    views; the Decider's feedback teaches them all at once (``learn``: two operations for all the
    models, the numbers of their own updates).

    The views are assigned to the models (their values unchanged); every other path keeps
    updating them in place as before. ``of`` hands out the kept joint posterior while every model
    still holds its views, else makes a new one: after a model's tensors are replaced (a loaded
    state, a reset, adaptive forgetting's restart), the buffers are rebuilt from the models.
    Only for distinct models with neither forgetting nor a change detector, on the CPU.
    """

    __slots__ = ("eta", "eta_column", "models", "precision", "scale", "scales", "views")

    def __init__(self, models: Sequence[BayesianLinear]):
        self.models = tuple(models)
        batched = models[0].precision.dim() == 3
        join = torch.cat if batched else torch.stack
        M = len(self.models)
        # normal tensors even when made under inference mode (the Decider's): a user's later update of a
        # model outside it writes in place, which an inference tensor refuses
        with torch.inference_mode(False):
            self.precision = join([m.precision for m in models])  # [M, d, d], a new buffer
            self.eta = join([m.eta for m in models])  # [M, d]
            self.eta_column = self.eta[..., None]  # [M, d, 1]
            parts = (self.precision.split_with_sizes([1] * M), self.eta.split_with_sizes([1] * M)) if batched \
                else (self.precision.unbind(0), self.eta.unbind(0))
        for m, precision, eta in zip(self.models, *parts):
            m.precision, m.eta = precision, eta
        self.views = tuple((m.precision, m.eta) for m in self.models)
        # the models' noise scales 1 / sigma^2 (set when a model is made): the one they share, else None and
        # each model's (``learn``)
        self.scales = np.array([float(m._scale) for m in self.models])
        self.scale = self.models[0]._scale if all(m._scale == self.models[0]._scale for m in self.models) else None

    @staticmethod
    def eligible(models: Sequence[BayesianLinear]) -> bool:
        """Whether ``models`` (of one ``_stack_key``) may be held jointly."""
        return (len({id(m) for m in models}) == len(models) and models[0].precision.is_cpu
                and all(m.forgetting is None and m._detector is None and m.precision.dtype == torch.float64
                        for m in models))

    def holds(self, models: Sequence[BayesianLinear]) -> bool:
        """Whether these ``models`` still hold this joint posterior's views."""
        if len(models) != len(self.models):
            return False
        for m, k, v in zip(models, self.models, self.views):  # (a loop: a third of all()'s generator's cost)
            if m is not k or m.precision is not v[0] or m.eta is not v[1]:
                return False
        return True

    def learn(self, x: torch.Tensor, x_row: np.ndarray, values: np.ndarray) -> None:
        """Every model learns one row (TS-ASC's feedback in the Decider, ``TSASC._learn_values``): the
        features ``x [1, d]`` (float64, checked; ``x_row`` its numpy array ``[1, d]``) and model ``m``'s
        outcome ``values[m]`` (``values [M]`` float64), in place on the joint buffers: two operations
        instead of two per model, the numbers of each model's own ``_update_checked`` bit for bit.

        ``addcmul_`` adds ``value * t1 * t2`` as ``(value * t1) * t2`` (possibly fused with the
        addition): with one scale ``s`` for all models the joint call is the models' calls on a
        stacked buffer (``value=s``); else each model's ``s t1`` is formed first in numpy (the same
        correctly rounded products as torch's ``value * t1``) and added with ``value=1.0`` (whose
        product with them is exact), so every element sees the same operations in the same order
        (tests/test_single_stream_speed_paths.py, against the models' own updates). The scaled
        factors formed by torch instead (two more tensor operations) made a joint update slower than
        the models' own (11.5 us against 9.9); formed in numpy (or not needed, one scale), with the
        dispatch of two updates and their views saved, it is faster: the Decider's feedback, TS-ASC
        with two conjugate models, 45 to 35 us (``TSASC._learn_values``, ``Decider._learn_now``)."""
        s = self.scale
        if s is not None:
            self.precision.addcmul_(x.mT, x, value=s)
            self.eta.addcmul_(torch.from_numpy(values[:, None]), x, value=s)
        else:
            scales = self.scales
            self.precision.addcmul_(torch.from_numpy(scales[:, None, None] * x_row.reshape(1, -1, 1)), x, value=1.0)
            self.eta.addcmul_(torch.from_numpy((scales * values)[:, None]), x, value=1.0)
        for m in self.models:  # what each model's ``_update_checked`` records besides its sums
            m._count += 1
            m._factor, m._dirty = None, None  # ``_invalidate(None)``

    @classmethod
    def of(cls, models: Sequence[BayesianLinear], kept: _JointPosterior | None) -> _JointPosterior | None:
        """``kept`` while ``models`` hold its views, else a new joint posterior of them (None when they
        are not ``eligible``)."""
        if kept is not None and kept.holds(models):
            return kept
        return cls(models) if cls.eligible(models) else None


_LINKS = {"probit": torch.special.ndtr, "logistic": torch.sigmoid}
#: the engines whose posterior is estimated from draws (a chain, a refit): their change test reads its own
#: draws, tested after a warm-up (``AdaptiveForgetting.warmup``); replicas refuse them with adaptive forgetting
SAMPLED_ENGINES = ("gibbs", "langevin", "nuts", "svi")


def _chain_options(options: dict | None) -> dict:
    """Checked keyword arguments of ``GibbsLinearPosterior`` / ``LangevinLinearPosterior`` from
    ``inference_options`` (non-negative ints, counts of sweeps or steps at least 1; Langevin's
    ``compile`` a bool)."""
    out = {}
    for name, value in (options or {}).items():
        if name == "compile":  # Langevin: replay the recorded prior graph (a bool)
            if not isinstance(value, bool):
                raise ValueError(f"inference_options: 'compile' must be True or False, got {value!r}")
            out[name] = value
            continue
        low = 1 if name in ("sweeps", "predict_sweeps", "pg_terms", "steps", "predict_steps") else 0
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"inference_options: {name!r} must be an int >= {low}, got {value!r}")
        out[name] = value
    return out


#: feature blocks ``[R, d, K]`` of more bytes than this, with per-replication blocks of at most
#: ``_STREAMED_MAX_BLOCK`` numbers, are scored by ``_ThompsonStep`` in chunks of multiply-and-sum
#: when that gives the batched matmul's bits (see ``_streamed_scores_exact``). Measured (one
#: thread, K = 100, d = 4): the matmul takes 0.34 ms at 7.6 MiB and 0.89 ms at 15 MiB (cache-resident,
#: faster than the chunks: 0.48, 1.13) but 5.0 ms at 30 MiB (the chunks: 2.8); at K = 1,000 the
#: matmul's larger products stream well (30 MiB: 2.15 ms vs 2.28)
_STREAMED_SCORES_BYTES = 16 << 20
_STREAMED_MAX_BLOCK = 1024
#: numbers in one chunk's product ``[C, d, K]`` (2 MiB of float64: it stays in the L2 cache)
_STREAMED_CHUNK_NUMBERS = 1 << 18
_STREAMED_EXACT: dict[tuple[int, int], bool] = {}


def _streamed_scores_exact(num_arms: int, dim: int) -> bool:
    """Whether multiply-and-sum ``(X^T * w).sum(-2)`` gives the bits of the batched matmul
    ``w^T X^T`` for ``K = num_arms`` candidates in ``R^dim`` on this machine (checked once per
    ``(K, d)`` on seeded probes; cached).

    At ``d <= 4`` torch's batched matmul accumulates the ``d`` products in order without fused
    multiply-adds, as the sum does (measured on torch 2.13's CPU build for every K tried); at
    larger ``d`` its kernels block and fuse, so the two differ in the last bits and only the
    matmul is used. A BLAS that rounds otherwise is detected here and keeps the matmul.
    """
    key = (int(num_arms), int(dim))
    hit = _STREAMED_EXACT.get(key)
    if hit is None:
        hit = False
        if dim <= 4:
            g = torch.Generator(device=_CPU).manual_seed(20)  # the CPU's BLAS (the streamed path is the CPU's)
            X = torch.randn(16, dim, num_arms, generator=g, dtype=_DTYPE, device=_CPU) \
                * torch.rand(16, 1, num_arms, generator=g, dtype=_DTYPE, device=_CPU).exp()
            w = torch.randn(16, dim, 1, generator=g, dtype=_DTYPE, device=_CPU) * 1e3
            hit = torch.equal(torch.bmm(w.mT, X)[:, 0], (X * w).sum(1))
        _STREAMED_EXACT[key] = hit
    return hit


class _ThompsonStep:
    """``simulate``'s lean Thompson path for a conjugate, known-noise ``BayesianLinear`` with
    ``batch_shape [R]``: one decision (draw, scores, argmax) and one update per step.

    The operations are those of ``sample`` then ``sample_at`` then the policies'
    ``masked_argmax``, and of ``update`` (so the same numbers, tested against the general path),
    without their per-call checks, and with what does not change between steps set up once per
    run: the random stream (looked up once), the transposed features (fixed arms: one copy for the
    run), a buffer for the draw's right-hand side and one for the scores ``[R, 1, K]`` (a fresh
    7.6 MiB block each step at R = 10,000, K = 100, freed at once, made glibc raise its mmap
    threshold and serve later blocks from a heap that fragments: peak 2.02-2.09x the Trace,
    1.77-1.83x with the buffer).

    Scores of feature blocks larger than the caches (``_STREAMED_SCORES_BYTES``) are computed in
    chunks of multiply-and-sum that stay in the L2 cache, when that gives the matmul's bits
    (``_streamed_scores_exact``: ``d <= 4``): the batched matmul of one ``[1, d] x [d, K]`` product
    per replication streams the features at about 6 GB/s, the chunks at about 11 (R = 10,000,
    K = 100, d = 4: the scores take 2.8 ms a step instead of 5.0).

    Args:
        model: the posterior (updated in place).
        generator: the run's ``ReplicationRNG`` (or any generator ``standard_normal`` takes).
        key: the stream of the posterior draws (``"reward"`` as ``ThompsonSampling`` names it).
    """

    def __init__(self, model: BayesianLinear, generator: Generator, key: str):
        self.model, self.generator, self.key = model, generator, key
        self.stream = None
        self.features_shape = None
        self.rhs = self.scores = self.flat_scores = self.product = None
        self.chunk = 0
        self.small = False
        self.transposed = _TransposedCache(1)  # the run's own: let go with the run

    def _draw(self) -> torch.Tensor:
        """The step's standard normals ``[R, d, 1]``, as ``standard_normal(model._column_shape, ...)``."""
        if self.stream is not None:
            return self.stream.next()
        m = self.model
        device = m.precision.device
        z = standard_normal(m._column_shape, self.generator, key=self.key, device=device)  # checks the batch size once
        if type(self.generator) is ReplicationRNG and self.generator.device == device:
            # the same stream object serves every later draw (its blocks on the model's device)
            self.stream = self.generator._stream("normal", m._column_shape[1:], self.key, z.dtype)
        return z

    def _setup(self, features_t: torch.Tensor) -> None:
        R, d, K = features_t.shape
        device = features_t.device
        self.features_shape = features_t.shape
        self.rhs = torch.empty(R, d, 1, dtype=_DTYPE, device=device)
        self.scores = torch.empty(R, 1, K, dtype=_DTYPE, device=device)
        self.flat_scores = self.scores.view(R, K)
        self.small = R * K <= 1024
        # the chunks fit the CPU's L2 cache (off the CPU: one batched product)
        streamed = (device == _CPU and R * K * d * 8 > _STREAMED_SCORES_BYTES and K * d <= _STREAMED_MAX_BLOCK
                    and _streamed_scores_exact(K, d))
        self.chunk = max(1, _STREAMED_CHUNK_NUMBERS // (d * K)) if streamed else 0
        self.product = torch.empty(min(self.chunk, R), d, K, dtype=_DTYPE, device=device) if streamed else None

    def choose(self, features: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """Actions ``[R]`` (long) for candidates ``features [R, K, d]`` and ``valid`` (``None`` or
        bool ``[R, K]``)."""
        m = self.model
        features_t = self.transposed(features)  # [R, d, K] contiguous
        z = self._draw()
        if m._factor is None or m._dirty is not None:
            m._factorize()
        if features_t.shape != self.features_shape:
            self._setup(features_t)
        w = m._solve_upper(torch.add(m._u, z, out=self.rhs))  # [R, d, 1]
        if self.chunk:
            out, product, C = self.flat_scores, self.product, self.chunk
            for s in range(0, out.shape[0], C):
                chunk = product[: min(C, out.shape[0] - s)]
                n = chunk.shape[0]
                torch.sum(torch.mul(features_t[s:s + n], w[s:s + n], out=chunk), 1, out=out[s:s + n])
        else:
            torch.bmm(w.mT, features_t, out=self.scores)
        scores = self.flat_scores
        if valid is not None:
            scores = scores.masked_fill(~valid, float("-inf"))
        # the first maximal index either way (masked_argmax's max); argmax has the smaller call cost on
        # small tables (1.6 us vs 3.0 at [1, 10]), max the faster loop on large ones (6.6 us vs 7.4 at [64, 100])
        return scores.argmax(-1) if self.small else scores.max(-1).indices

    def update(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Add one observation per replication: ``x [R, d]``, ``y [R]``."""
        self.model._update_rows(x, y, True)
