"""Look inside posteriors: ArviZ InferenceData, summaries, plots, calibration, coverage.

* ``to_inference_data`` converts every posterior model of the toolkit into an
  ``arviz.InferenceData``: exact draws for conjugate models (``BayesianLinear``,
  ``PerArmLinear``, the per-arm
  ``CTSPosterior`` of BCTS), chains with sample statistics for
  NUTS, guide draws for SVI, and draws of the latent function at given points for the probit
  GP (``ProbitGP`` and its views); with ``observed_data`` and
  ``posterior_predictive`` groups when data is known; coordinates named after the features.
* ``summary`` (ArviZ: mean, sd, HDI, ESS and r-hat where chains exist) and
  ``prior_predictive``, which checks a custom prior before any data arrives.
* ``brier_score``, ``expected_calibration_error``, ``reliability_diagram`` for
  Bernoulli models.
* ``interval_coverage``: simulated problems know the truth, so the share of replications
  whose central credible interval covers the true parameter can be checked against its level.
* ``PosteriorRecorder``: a ``simulate`` callback that records the posterior of each model
  over time (watching a Thompson posterior evolve).
* ``save_models`` / ``load_models`` (what ``bayes-safe simulate`` and the studies
  write to ``RUN_DIR/models/``) and ``diagnose_run`` (``bayes-safe diagnose RUN_DIR``: a
  self-contained HTML report and one NetCDF InferenceData per saved posterior).
"""

from __future__ import annotations

import base64
import copy
import functools
import html
import io
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from ._validation import check_positive_int
from .io import atomic_write

__all__ = [
    "ACCEPTED_MODELS",
    "NO_MODELS_FILE",
    "PosteriorRecorder",
    "brier_score",
    "diagnose_run",
    "expected_calibration_error",
    "interval_coverage",
    "load_models",
    "prior_predictive",
    "reliability_diagram",
    "save_models",
    "save_no_models",
    "summary",
    "to_inference_data",
]


def _np(t) -> np.ndarray:
    return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def _feature_names(d: int, names: Sequence[str] | None) -> list[str]:
    if names is None:
        return [f"x{i}" for i in range(d)]
    names = [str(n) for n in names]
    if len(names) != d:
        raise ValueError(f"feature_names: expected {d} names (one per feature), got {len(names)}")
    return names


def _batch_dims(batch_shape) -> list[str]:
    return [f"batch{i}" for i in range(len(batch_shape))]


#: what ``to_inference_data`` converts (named in its errors)
ACCEPTED_MODELS = (
    "BayesianLinear (conjugate, NUTS or SVI), PerArmLinear, CTSPosterior (BCTS), ProbitGP or its "
    "SuccessProbability / ScaledOutcome views, or a model with a to_inference_data method"
)


def _probit_types() -> tuple:
    """``(ProbitGP, SuccessProbability)`` if the probit-GP module is loaded, else ``()``.

    A ProbitGP object can only exist once its module is imported, so checking ``sys.modules``
    avoids importing GPyTorch to convert a linear model.
    """
    mod = sys.modules.get("bayes_safe.models.probit_gp")
    return (mod.ProbitGP, mod.SuccessProbability) if mod is not None else ()


def _cts_type():
    mod = sys.modules.get("bayes_safe.policies.bcts")
    return mod.CTSPosterior if mod is not None else None


def _converter(model) -> str | None:
    """Which converter handles ``model``: ``"linear"``, ``"per_arm"``, ``"cts"``, ``"probit_gp"``,
    ``"own"`` (its own ``to_inference_data`` method) or ``None`` (no converter)."""
    from .models import BayesianLinear, PerArmLinear

    if isinstance(model, BayesianLinear):
        return "linear"
    if isinstance(model, PerArmLinear):
        return "per_arm"
    cts = _cts_type()
    if cts is not None and isinstance(model, cts):
        return "cts"
    probit = _probit_types()
    if probit and isinstance(model, probit):
        return "probit_gp"
    if callable(getattr(model, "to_inference_data", None)):
        return "own"
    return None


def to_inference_data(model, *, X=None, y=None, num_draws: int = 1000, feature_names: Sequence[str] | None = None,
                      seed: int = 0, max_batch: int | None = None, max_points: int = 500):
    """An ``arviz.InferenceData`` of ``model``'s posterior.

    What each model gives (``S = num_draws``; ``*batch`` the model's batch dimensions, named
    ``batch0, batch1, ...``):

    * ``BayesianLinear``, conjugate (Gaussian prior with a known noise, or Normal-Inverse-Gamma):
      ``S`` exact draws in one chain: ``w (chain, draw, *batch, feature)`` and, for NIG,
      ``noise_var (chain, draw, *batch)``.
    * ``BayesianLinear`` fitted by NUTS: every latent site of the prior per chain (``w``, the
      prior's hyperparameters, ``noise_var``) and ``sample_stats`` (``diverging``,
      ``acceptance_rate``, ``step_size``, ``lp``); by SVI: the stored guide draws (one chain).
      Their stored data are the ``observed_data`` unless ``X, y`` are given.
    * ``PerArmLinear``: as a conjugate ``BayesianLinear`` whose last batch dimension is ``arm``.
    * ``CTSPosterior`` (BCTS, Balakrishnan et al. 2018 Algorithm 1): exact draws of every arm's
      ``w_k ~ N(mu_hat_k, v^2 B_k^-1)``, ``w (chain, draw, *batch, arm, feature)``, and the
      observations per arm as ``constant_data.num_observations (*batch, arm)``. It keeps
      sufficient statistics, not rows, so ``X, y`` are not accepted.
    * ``ProbitGP`` (Daulton et al. 2019 s.5.2) or a ``SuccessProbability`` / ``ScaledOutcome``
      view of one: the GP's weights over its learned features ``w (chain, draw, feature)``
      (features ``phi0 ..``, ``intercept``), the latent function ``f (chain, draw, point)`` at
      the points ``X [n, D]`` and the success probability ``p = Phi(f)`` there. Without ``X``
      the points are the model's stored observations (an evenly spaced subset of at most
      ``max_points``) with their outcomes; ``posterior_predictive.y`` holds Bernoulli(``p``)
      draws when the outcomes are known.

    Args:
        model: one of the models above, or any object with a ``to_inference_data(X=, y=,
            num_draws=, seed=)`` method of its own.
        X, y: data for the ``observed_data`` and ``posterior_predictive`` groups: for linear
            models ``X [n, d]`` or ``[*batch, n, d]`` and ``y`` to match; for the probit GP the
            points ``X [n, D]`` (and optional 0/1 outcomes ``y [n]``). Non-conjugate linear
            models and the probit GP fall back to the data they stored.
        num_draws: exact draws for conjugate models and the probit GP (one chain).
        feature_names: names of the ``d`` features (coordinates of the ``feature`` dimension);
            for the probit GP, of its ``p`` weights.
        seed: seed of the exact draws and of the predictive noise.
        max_batch: keep only the first ``max_batch`` elements of the leading batch dimension
            (replications); ``None`` keeps all.
        max_points: probit GP only: at most this many stored points when ``X`` is not given.

    Returns:
        ``arviz.InferenceData`` with a ``posterior`` group and, where they apply,
        ``sample_stats``, ``observed_data``, ``posterior_predictive`` and ``constant_data``.

    Raises:
        TypeError: ``model`` has no converter (the message names its type and the accepted ones).
        ValueError: a bad ``num_draws``, ``max_batch``, ``max_points``, ``feature_names``, ``X`` or ``y``.
    """
    kind = _converter(model)
    if kind is None:
        raise TypeError(f"model: no InferenceData converter for {type(model).__name__}; expected {ACCEPTED_MODELS}")
    num_draws = check_positive_int(num_draws, "num_draws")
    max_batch = check_positive_int(max_batch, "max_batch", allow_none=True)
    max_points = check_positive_int(max_points, "max_points")
    if kind == "own":
        return model.to_inference_data(X=X, y=y, num_draws=num_draws, seed=seed)
    if kind == "cts":
        return _cts_inference_data(model, X, y, num_draws, feature_names, seed, max_batch)
    if kind == "probit_gp":
        return _probit_inference_data(model, X, y, num_draws, feature_names, seed, max_points)
    idata = _linear_inference_data(model, X, y, num_draws, feature_names, seed)
    if max_batch is not None:
        idata = idata.isel(batch0=slice(0, max_batch), obs_batch0=slice(0, max_batch))
    return idata


def _linear_inference_data(model, X, y, num_draws, feature_names, seed):
    import arviz as az

    from .models import PerArmLinear

    arms = None
    if isinstance(model, PerArmLinear):
        arms, model = model.num_arms, model.arms
    d = model.dim
    features = _feature_names(d, feature_names)
    batch = list(model.batch_shape)
    bdims = _batch_dims(batch)
    if arms is not None:
        bdims[-1] = "arm"
    gen = torch.Generator().manual_seed(int(seed))
    posterior: dict[str, np.ndarray] = {}
    sample_stats: dict[str, np.ndarray] = {}
    if model.conjugate:
        draws = torch.stack([model.sample(gen) for _ in range(int(num_draws))])  # [S, *batch, d]
        posterior["w"] = _np(draws)[None]
        if model.noise_prior is not None:
            post = model.noise_variance_posterior
            a = post.concentration.expand(num_draws, *batch)
            b = post.rate.expand(num_draws, *batch)
            from .random import standard_gamma

            noise = b / standard_gamma(a, gen)
            posterior["noise_var"] = _np(noise)[None]
        w_flat = draws
    else:
        engine = model.engine
        chains = engine.chains
        if chains:
            for name, value in chains.items():
                posterior[name] = _np(value)
            sample_stats = {k: _np(v) for k, v in engine.sample_stats.items()}
        else:  # SVI guide draws, or prior draws before any fit
            posterior["w"] = _np(model._draws)[None]
            if engine.noise_draws is not None:
                posterior["noise_var"] = _np(engine.noise_draws)[None]
        w_flat = torch.as_tensor(posterior["w"]).reshape(-1, *batch, d)
        if X is None and model._X:
            X, y = torch.cat(model._X, -2), torch.cat(model._y, -1)
    dims = {"w": [*bdims, "feature"], "noise_var": list(bdims)}
    for name, value in posterior.items():  # hyperparameter sites of a NUTS fit: batch dims, then their own
        if name not in dims:
            dims[name] = [*bdims, *[f"{name}_dim{i}" for i in range(value.ndim - 2 - len(bdims))]]
    coords = {"feature": features}
    if arms is not None:
        coords["arm"] = list(range(arms))
    groups = {"posterior": posterior}
    if sample_stats:
        groups["sample_stats"] = sample_stats
        for name in sample_stats:
            dims[name] = list(bdims)
    if (X is None) != (y is None):
        raise ValueError("X, y: give both (data for the observed and posterior predictive groups) or neither")
    if X is not None:
        X = torch.as_tensor(X, dtype=torch.float64)
        y = torch.as_tensor(y, dtype=torch.float64)
        if X.shape[-1] != d or tuple(y.shape) != tuple(X.shape[:-1]):
            raise ValueError(f"X, y: expected X [..., n, {d}] and y [..., n], got {list(X.shape)} and {list(y.shape)}")
        mean = (w_flat[..., None, :] * X).sum(-1) if X.dim() - 1 == len(batch) + 1 else w_flat @ X.mT
        if "noise_var" in posterior:
            sd = torch.as_tensor(posterior["noise_var"]).reshape(mean.shape[: 1 + len(batch)]).sqrt()
            sd = sd.reshape(*sd.shape, *([1] * (mean.dim() - sd.dim())))
        else:
            sd = model.noise_std
        y_rep = mean + sd * torch.randn(mean.shape, generator=gen, dtype=torch.float64)
        n_chains = posterior["w"].shape[0]
        groups["posterior_predictive"] = {"y": _np(y_rep).reshape(n_chains, -1, *y_rep.shape[1:])}
        groups["observed_data"] = {"y": _np(y)}
        obs_dims = [f"obs_batch{i}" for i in range(y.dim() - 1)] + ["obs"]
        dims["y"] = obs_dims
    attrs = {"model": "PerArmLinear" if arms is not None else "BayesianLinear",
             "inference": "conjugate" if model.conjugate else model.engine.method}
    return az.from_dict(**groups, coords=coords, dims={k: v for k, v in dims.items() if _used(k, groups)},
                        attrs=attrs)


def _used(name: str, groups: dict) -> bool:
    return any(name in g for g in groups.values())


def _cts_inference_data(model, X, y, num_draws, feature_names, seed, max_batch):
    """Exact draws of a ``CTSPosterior``: ``w_k ~ N(mu_hat_k, v^2 B_k^-1)``."""
    import arviz as az

    from .models.linear import _cholesky

    if X is not None or y is not None:
        raise ValueError(
            "X, y: not accepted for a CTSPosterior: it keeps per-arm sufficient statistics, not rows, and a "
            "posterior predictive check would need the arm played at each row"
        )
    d, K = model.dim, model.num_arms
    features = _feature_names(d, feature_names)
    mean = model.posterior_mean  # [*b, K, d]
    cov = model.posterior_covariance  # [*b, K, d, d]
    counts = model.num_observations  # [*b, K]
    batch = list(model.batch_shape)
    if max_batch is not None and batch:
        mean, cov, counts = mean[:max_batch], cov[:max_batch], counts[:max_batch]
        batch[0] = mean.shape[0]
    gen = torch.Generator().manual_seed(int(seed))
    factor = _cholesky(cov)
    z = torch.randn(int(num_draws), *mean.shape, 1, generator=gen, dtype=torch.float64)
    w = mean + (factor @ z)[..., 0]  # [S, *b, K, d]
    bdims = _batch_dims(batch)
    return az.from_dict(
        posterior={"w": _np(w)[None]}, constant_data={"num_observations": _np(counts)},
        coords={"feature": features, "arm": list(range(K))},
        dims={"w": [*bdims, "arm", "feature"], "num_observations": [*bdims, "arm"]},
        attrs={"model": "CTSPosterior", "inference": "conjugate", "v": float(model.v)},
    )


def _probit_inference_data(model, X, y, num_draws, feature_names, seed, max_points):
    """Draws of the probit GP's weights and of its latent function ``f`` (and ``Phi(f)``) at points."""
    import arviz as az

    _, view_type = _probit_types()
    gp = model.model if isinstance(model, view_type) else model
    names = _feature_names(gp.feature_dim, gp.weight_names if feature_names is None else feature_names)
    gen = torch.Generator().manual_seed(int(seed))
    w = gp.sample(gen, shape=(int(num_draws),))  # [S, p]
    posterior = {"w": _np(w)[None]}
    dims = {"w": ["feature"]}
    coords: dict = {"feature": names}
    groups: dict = {"posterior": posterior}
    attrs = {"model": "ProbitGP", "view": type(model).__name__, "num_observations": int(gp.num_observations),
             "num_fits": int(gp.num_fits)}
    if X is None:
        if y is not None:
            raise ValueError("y: given without X; pass the points X [n, D] the outcomes belong to")
        X_all, y_all = gp.observations()
        n = X_all.shape[0]
        if n:
            points = torch.linspace(0, n - 1, min(n, max_points), dtype=torch.float64).round().long().unique()
            X, y = X_all[points], y_all[points]
            attrs["points"] = f"{points.numel()} of the {n} stored observations, evenly spaced in arrival order"
    else:
        X = torch.as_tensor(X, dtype=torch.float64)
        if X.dim() != 2 or X.shape[-1] != gp.input_dim:
            raise ValueError(f"X: expected points of shape [n, {gp.input_dim}], got {list(X.shape)}")
        points = torch.arange(X.shape[0])
        if y is not None:
            y = torch.as_tensor(y, dtype=torch.float64)
            if tuple(y.shape) != (X.shape[0],):
                raise ValueError(f"y: expected shape [{X.shape[0]}] to match X, got {list(y.shape)}")
            if not bool(((y == 0) | (y == 1)).all()):
                raise ValueError("y: expected binary outcomes in {0, 1} (the probit GP is a Bernoulli model)")
        attrs["points"] = f"{X.shape[0]} given points"
    if X is not None:
        phi = gp.features(X)  # [n, p]
        f = w @ phi.T  # [S, n]: one draw of the whole latent function per row
        prob = torch.special.ndtr(f)
        posterior["f"], posterior["p"] = _np(f)[None], _np(prob)[None]
        dims["f"] = dims["p"] = ["point"]
        coords["point"] = points.tolist()
        if y is not None:
            y_rep = (torch.rand(prob.shape, generator=gen, dtype=torch.float64) < prob).double()
            groups["posterior_predictive"] = {"y": _np(y_rep)[None]}
            groups["observed_data"] = {"y": _np(y)}
            dims["y"] = ["point"]
    scale = getattr(model, "scale", None)
    if scale is not None:
        attrs["scale"] = [float(v) for v in scale]
    return az.from_dict(**groups, coords=coords, dims=dims, attrs=attrs)


def summary(idata, var_names: Sequence[str] | None = None, hdi_prob: float = 0.94):
    """ArviZ summary table (mean, sd, HDI, ESS and r-hat where chains exist) as a DataFrame."""
    import arviz as az

    return az.summary(idata, var_names=var_names, hdi_prob=hdi_prob)


def prior_predictive(prior, X, *, noise_std: float | None = None, noise_prior=None, num_draws: int = 500,
                     seed: int = 0, feature_names: Sequence[str] | None = None):
    """Prior and prior-predictive draws for a custom prior, before any data (``prior`` and
    ``prior_predictive`` groups). Check that outcomes it implies at ``X [n, d]`` are plausible.

    ``prior`` is what ``BayesianLinear`` accepts: a distribution with
    event shape ``[d]`` or a callable Pyro model returning ``w``. A prior whose support does not
    match the weights (draws that are not finite real vectors of width ``d``) is rejected.
    """
    import arviz as az

    from .models.linear import check_real_support
    from .models.pyro_inference import PyroLinearPosterior

    X = torch.as_tensor(X, dtype=torch.float64)
    if X.dim() != 2:
        raise ValueError(f"X: expected shape [n, d], got {list(X.shape)}")
    d = X.shape[-1]
    if isinstance(prior, torch.distributions.Distribution):
        if prior.event_shape != (d,):
            raise ValueError(f"prior: event shape {list(prior.event_shape)} does not match the {d} features of X")
        check_real_support(prior, "prior")
    if (noise_std is None) == (noise_prior is None):
        raise ValueError("noise_std / noise_prior: give exactly one")
    engine = PyroLinearPosterior(prior, d, noise_std=noise_std, noise_prior=noise_prior, seed=seed)
    w = engine.prior_draws(int(num_draws))  # [S, d]
    if not bool(torch.isfinite(w).all()):
        raise ValueError("prior: produced non-finite weight draws")
    noise = engine.noise_draws
    gen = torch.Generator().manual_seed(int(seed))
    sd = noise.sqrt()[:, None] if noise is not None and noise.shape[0] == w.shape[0] else noise_std
    if sd is None:
        sd = 1.0
    y = w @ X.T + sd * torch.randn(w.shape[0], X.shape[0], generator=gen, dtype=torch.float64)
    return az.from_dict(
        prior={"w": _np(w)[None]}, prior_predictive={"y": _np(y)[None]},
        coords={"feature": _feature_names(d, feature_names)}, dims={"w": ["feature"], "y": ["obs"]},
    )


# ---------------------------------------------------------------------------- calibration
def _check_probs(p, y):
    p = torch.as_tensor(p, dtype=torch.float64).reshape(-1)
    y = torch.as_tensor(y, dtype=torch.float64).reshape(-1)
    if p.shape != y.shape:
        raise ValueError(f"p, y: expected the same number of entries, got {p.numel()} and {y.numel()}")
    if not bool(((p >= 0) & (p <= 1)).all()):
        raise ValueError("p: expected probabilities in [0, 1]")
    if not bool(((y == 0) | (y == 1)).all()):
        raise ValueError("y: expected binary outcomes in {0, 1}")
    return p, y


def brier_score(p, y) -> float:
    """Mean squared difference between predicted probabilities and 0/1 outcomes."""
    p, y = _check_probs(p, y)
    return float(((p - y) ** 2).mean())


def _bins(p, y, num_bins):
    edges = torch.linspace(0, 1, num_bins + 1, dtype=torch.float64)
    idx = torch.clamp(torch.bucketize(p, edges[1:-1], right=True), 0, num_bins - 1)
    count = torch.bincount(idx, minlength=num_bins).to(torch.float64)
    conf = torch.bincount(idx, weights=p, minlength=num_bins) / count.clamp_min(1)
    acc = torch.bincount(idx, weights=y, minlength=num_bins) / count.clamp_min(1)
    return edges, count, conf, acc


def expected_calibration_error(p, y, num_bins: int = 10) -> float:
    """ECE: ``sum_b (n_b / n) |mean(y in b) - mean(p in b)|`` over equal-width probability bins."""
    p, y = _check_probs(p, y)
    _, count, conf, acc = _bins(p, y, int(num_bins))
    return float((count / count.sum() * (acc - conf).abs()).sum())


def reliability_diagram(p, y, num_bins: int = 10, path=None, title: str = "Reliability diagram"):
    """Observed frequency against mean predicted probability per bin (matplotlib figure)."""
    from .plots import plt, save_figure

    p, y = _check_probs(p, y)
    _, count, conf, acc = _bins(p, y, int(num_bins))
    keep = count > 0
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
    ax.plot(_np(conf[keep]), _np(acc[keep]), "o-", label="model")
    ax.set(xlabel="mean predicted probability", ylabel="observed frequency", title=title, xlim=(0, 1), ylim=(0, 1))
    ax.legend()
    ax.grid(alpha=0.3)
    if path is not None:
        save_figure(fig, path)
    return fig


# ---------------------------------------------------------------------------- coverage
def interval_coverage(draws: torch.Tensor, truth: torch.Tensor, level: float = 0.9) -> torch.Tensor:
    """Share of replications whose central ``level`` credible interval covers the truth.

    Args:
        draws: posterior draws ``[S, R, ...]`` (S draws, R replications).
        truth: true values ``[R, ...]``.
        level: the interval's probability in (0, 1).

    Returns:
        coverage per parameter, ``[...]``: close to ``level`` for a calibrated posterior.
    """
    if not 0 < level < 1:
        raise ValueError(f"level: expected a value in (0, 1), got {level}")
    draws = torch.as_tensor(draws, dtype=torch.float64)
    truth = torch.as_tensor(truth, dtype=torch.float64)
    if tuple(draws.shape[1:]) != tuple(truth.shape):
        raise ValueError(f"draws, truth: expected draws [S, *{list(truth.shape)}], got {list(draws.shape)}")
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    lo, hi = torch.quantile(draws, q, dim=0)
    return ((truth >= lo) & (truth <= hi)).double().mean(0)


def _moments(model) -> tuple[torch.Tensor, torch.Tensor]:
    """Posterior mean and standard deviation of a model's parameters (the weights).

    Shapes: ``BayesianLinear`` ``[*batch, d]``; ``PerArmLinear`` and ``CTSPosterior``
    ``[*batch, K, d]``; ``ProbitGP`` and its views ``[p]`` (the GP's weights).
    """
    probit = _probit_types()
    if probit:
        gp = model.model if isinstance(model, probit[1]) else model
        if isinstance(gp, probit[0]):
            return gp.weight_mean.clone(), gp.weight_covariance.diagonal().sqrt()
    inner = getattr(model, "arms", model)  # PerArmLinear keeps one batched BayesianLinear
    if getattr(inner, "conjugate", False) and not (getattr(inner, "noise_prior", None) is not None
                                                   and bool((inner._noise_posterior()[0] <= 1).any())):
        return model.posterior_mean.clone(), model.posterior_covariance.diagonal(dim1=-2, dim2=-1).sqrt()
    draws = getattr(inner, "_draws", None)
    if draws is not None:  # a non-conjugate fit: moments of its stored draws
        return draws.mean(0), draws.std(0)
    mean = model.posterior_mean
    return mean.clone(), torch.full_like(mean, float("nan"))


class PosteriorRecorder:
    """A ``simulate`` callback recording each model's posterior mean and sd every ``every`` steps.

    Works for every model ``to_inference_data`` converts: linear models record their
    weights ``[R, d]`` (per-arm models ``[R, K, d]``), the probit GP the weights of its linear
    kernel over learned features ``[p]``. Non-conjugate fits record the moments of their
    stored draws.

    Example:
        >>> rec = PosteriorRecorder(every=50)
        >>> trace = simulate(policy, env, 500, seed=0, callback=rec)   # doctest: +SKIP
        >>> rec.to_dataframe()                                         # doctest: +SKIP
    """

    def __init__(self, every: int = 10):
        if isinstance(every, bool) or int(every) < 1:
            raise ValueError(f"every: expected a positive int, got {every!r}")
        self.every = int(every)
        self.steps: list[int] = []
        self.means: dict[str, list[torch.Tensor]] = {}
        self.sds: dict[str, list[torch.Tensor]] = {}

    def __call__(self, t: int, info: dict) -> None:
        if t % self.every:
            return
        self.steps.append(t)
        for role, model in info["policy"].models().items():
            mean, sd = _moments(model)
            self.means.setdefault(role, []).append(mean.clone())
            self.sds.setdefault(role, []).append(sd.clone())

    def to_dataframe(self):
        """Long format: step, model role, replication, (arm,) feature, posterior mean and sd.

        ``replication`` is the first batch index (0 for an unbatched model), ``arm`` is there
        when some model is per-arm, ``feature`` the index of the weight.
        """
        import pandas as pd

        frames = []
        for role in self.means:
            m = torch.stack(self.means[role])  # [n_steps, *batch, (K,) d]
            s = torch.stack(self.sds[role])
            n, *rest = m.shape
            idx = np.array(np.meshgrid(*[np.arange(k) for k in (n, *rest)], indexing="ij")).reshape(len(m.shape), -1)
            frame = {
                "step": np.asarray(self.steps)[idx[0]], "model": role,
                "replication": idx[1] if len(rest) > 1 else 0, "feature": idx[-1],
                "mean": _np(m).reshape(-1), "sd": _np(s).reshape(-1),
            }
            if len(rest) > 2:
                frame["arm"] = idx[-2]
            frames.append(pd.DataFrame(frame))
        return pd.concat(frames, ignore_index=True)


# ---------------------------------------------------------------------------- saving and reports
#: written to a models directory by a run that fits no posterior (see ``save_no_models``)
NO_MODELS_FILE = "NO_MODELS.txt"
_SHARED_KEY = "__roles__"
_BAD_NAME = re.compile(r"[^A-Za-z0-9.=-]+")


def _name_part(text, what: str) -> str:
    """``text`` made safe for a file name: runs of other characters than letters, digits, ``. = -`` become ``_``."""
    out = _BAD_NAME.sub("_", str(text)).strip("_")
    if not out:
        raise ValueError(f"{what}: expected a name with at least one letter or digit, got {text!r}")
    return out


def _underlying(model):
    """The posterior object a model answers from: the ProbitGP of a view, else the model itself."""
    probit = _probit_types()
    if probit and isinstance(model, probit[1]):
        return model.model
    return model


def save_models(source, directory, *, prefix: str | Sequence[str] | None = None,
                max_observations: int | None = None) -> list[Path]:
    """Save the fitted models of a policy (or a ``{role: model}`` mapping) into ``directory``.

    One file per model, ``<prefix>__<role>.pt`` (``<role>.pt`` without a prefix), written
    atomically. Models that are views of one posterior (TS-ASC's reward and constraint views of
    one ``ProbitGP``) are saved together, once, as
    ``<prefix>__<role1>+<role2>.pt``, so ``load_models`` gives them back sharing it. A run
    that saves several policies gives each its own ``prefix`` (e.g. ``("alpha=0.01", "TS-ASC")``
    -> ``alpha=0.01__TS-ASC__reward.pt``).

    Probit GPs are saved as ``compact`` copies (no per-decision
    draw state; at most ``max_observations`` stored rows if given), so the policy itself is
    left untouched.

    Files are pickles: load only files you wrote yourself (``load_models``).

    Args:
        source: a policy (its ``models()``) or a mapping ``{role: model}``.
        directory: created if missing.
        prefix: a name, or parts joined by ``__``; characters other than letters, digits and
            ``. = -`` become ``_``.
        max_observations: keep at most this many stored observations of each probit GP.

    Returns:
        the paths written.
    """
    models = source.models() if callable(getattr(source, "models", None)) else source
    if not isinstance(models, Mapping):
        raise TypeError(f"source: expected a policy (with .models()) or a mapping {{role: model}}, got {type(source).__name__}")
    max_observations = check_positive_int(max_observations, "max_observations", allow_none=True)
    parts = [] if prefix is None else [prefix] if isinstance(prefix, str) else list(prefix)
    stem = "__".join(_name_part(p, "prefix") for p in parts)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    groups: dict[int, list[str]] = {}
    for role in models:
        groups.setdefault(id(_underlying(models[role])), []).append(role)
    compacted: dict[int, object] = {}

    def prepared(model):
        probit = _probit_types()
        if not probit:
            return model
        base = _underlying(model)
        if not isinstance(base, probit[0]):
            return model
        if id(base) not in compacted:
            compacted[id(base)] = base.compact(max_observations)
        if base is model:
            return compacted[id(base)]
        view = copy.copy(model)
        view.model = compacted[id(base)]
        return view

    paths = []
    for roles in groups.values():
        names = [_name_part(r, "role") for r in roles]
        name = "+".join(names)
        path = directory / f"{stem + '__' if stem else ''}{name}.pt"
        if len(roles) == 1:
            payload = prepared(models[roles[0]])
        else:
            payload = {_SHARED_KEY: {n: prepared(models[r]) for n, r in zip(names, roles)}}
        atomic_write(path, functools.partial(torch.save, payload))
        paths.append(path)
    return paths


def save_no_models(directory, reason: str) -> Path:
    """Record in ``directory`` that a run fits no posterior models, and why.

    ``load_models`` (hence ``bayes-safe diagnose``) then fails with ``reason`` in its message
    instead of a bare "no saved models". The ACOL studies use it: their learners keep
    frequentist confidence intervals, not posteriors (Lindner et al. 2022, Propositions 2-3).

    Args:
        directory: the run's ``models/`` directory (created if missing).
        reason: one or more sentences, written to ``directory/NO_MODELS.txt``.

    Returns:
        the path written.
    """
    from .io import atomic_write_text

    if not str(reason).strip():
        raise ValueError("reason: expected a sentence saying why the run has no posterior models")
    path = Path(directory) / NO_MODELS_FILE
    atomic_write_text(path, str(reason).strip() + "\n")
    return path


def load_models(directory) -> dict[str, object]:
    """The models saved by ``save_models``, keyed ``<prefix>__<role>`` (or ``<role>``).

    Views saved together share their posterior again. Files are unpickled (``torch.load`` with
    ``weights_only=False``): load only directories you wrote yourself.

    Args:
        directory: a run's ``models/`` directory.

    Returns:
        ``{name: model}`` in file-name order.

    Raises:
        FileNotFoundError: ``directory`` holds no saved model (the message names it, with the
            reason a run recorded by ``save_no_models``, if any).
    """
    directory = Path(directory)
    files = sorted(directory.glob("*.pt")) if directory.is_dir() else []
    if not files:
        marker = directory / NO_MODELS_FILE
        if marker.is_file():
            raise FileNotFoundError(f"{directory}: no saved models: {marker.read_text().strip()}")
        raise FileNotFoundError(
            f"{directory}: no saved models (*.pt); runs write them to RUN_DIR/models/ "
            "(bayes-safe simulate and the studies do)"
        )
    out: dict[str, object] = {}
    for f in files:
        obj = torch.load(f, weights_only=False)
        if isinstance(obj, dict) and set(obj) == {_SHARED_KEY}:
            prefix = f.stem.rsplit("__", 1)[0] if "__" in f.stem else ""
            for role, model in obj[_SHARED_KEY].items():
                out[f"{prefix}__{role}" if prefix else role] = model
        else:
            out[f.stem] = obj
    return out


def _png_base64(fig) -> str:
    from .plots import plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=72, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _img(fig, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{_png_base64(fig)}"/>'


def _group_name(keys: list[str]) -> str:
    """``a__reward`` + ``a__constraint0`` -> ``a__reward+constraint0`` (the name their shared file had)."""
    if len(keys) == 1:
        return keys[0]
    split = [k.rsplit("__", 1) if "__" in k else ["", k] for k in keys]
    prefixes = {p for p, _ in split}
    if len(prefixes) == 1:
        prefix = prefixes.pop()
        return (f"{prefix}__" if prefix else "") + "+".join(r for _, r in split)
    return "+".join(keys)


def _head(ds, limits: dict[str, int]):
    """The first ``limits[dim]`` entries of each dimension (``"batch"`` stands for every ``batch*``)."""
    sel = {}
    for dim, size in ds.sizes.items():
        if dim in ("chain", "draw"):
            continue
        key = "batch" if dim.startswith("batch") else "obs_batch" if dim.startswith("obs_batch") else dim
        if key in limits and size > limits[key]:
            sel[dim] = slice(0, limits[key])
    return ds.isel(**sel) if sel else ds


def _summary_html(idata, show_batch: int, max_rows: int = 60) -> str:
    import arviz as az

    post = idata.posterior
    names = [v for v in ("w", "noise_var", "p") if v in post] + [
        v for v in post.data_vars if v not in ("w", "noise_var", "f", "p") and post[v].ndim <= 3]
    names = names or list(post.data_vars)
    view = _head(post[names], {"batch": show_batch, "arm": 3, "point": 8})
    multi = post.sizes.get("chain", 1) > 1
    table = az.summary(view, kind="all" if multi else "stats", hdi_prob=0.94)
    note = ""
    if len(table) > max_rows:
        note = f"<p>First {max_rows} of {len(table)} rows (the NetCDF file has every draw).</p>"
        table = table.iloc[:max_rows]
    what = "mean, sd, 94% HDI, ESS and r-hat over the chains" if multi else "mean, sd and 94% HDI of the draws"
    return f"<p>Summary ({what}).</p>" + table.to_html(float_format=lambda v: f"{v:.4g}") + note


def _model_section(name: str, keys: list[str], views: list, idata, show_batch: int, seed: int) -> str:
    import arviz as az

    from .plots import plt

    model = views[0]
    post = idata.posterior
    chains, draws = post.sizes.get("chain", 1), post.sizes.get("draw", 0)
    kind = str(idata.attrs.get("model", type(model).__name__))
    how = f", {idata.attrs['inference']}" if "inference" in idata.attrs else ""
    role_names = [k.rsplit("__", 1)[-1] for k in keys]
    if _underlying(model) is not model:  # views of one posterior: say which view plays which role
        role_names = [f"{r} ({type(m).__name__} view)" for r, m in zip(role_names, views)]
    info = [(f"{html.escape(kind)}{html.escape(how)}; role{'s' if len(keys) > 1 else ''}: "
             f"{html.escape(', '.join(role_names))}; {chains} chain(s) x {draws} draws")]
    batch_dims = [d for d in post.dims if d.startswith("batch")]
    if batch_dims:
        sizes = " x ".join(str(post.sizes[d]) for d in batch_dims)
        info.append(f"batch {sizes} (in the NetCDF file); the tables show the first {show_batch} of {batch_dims[0]}, "
                    "the figures its first element")
    if "points" in idata.attrs:
        info.append(f"latent function at {html.escape(str(idata.attrs['points']))}")
    if "constant_data" in idata.groups() and "num_observations" in idata.constant_data:
        n_obs = idata.constant_data["num_observations"]
        info.append(f"observations per arm: min {int(n_obs.min())}, median {float(n_obs.median()):.0f}, "
                    f"max {int(n_obs.max())}")
    if "sample_stats" in idata.groups() and "diverging" in idata.sample_stats:
        info.append(f"divergent transitions: {int(idata.sample_stats['diverging'].sum())}")
    out = [f'<h2 id="{html.escape(name)}">{html.escape(name)}</h2>', "<p>" + "; ".join(info) + ".</p>",
           f"<p>NetCDF: <code>{html.escape(name)}.nc</code></p>", _summary_html(idata, show_batch)]
    key = "w" if "w" in post else next(iter(post.data_vars))  # the weights; a custom model's first variable
    fig_view = _head(post[[key]], {"batch": 1, "arm": 2, "feature": 6, "point": 6})
    for dim in [d for d in fig_view.dims if d.startswith("batch")]:
        fig_view = fig_view.isel({dim: 0})
    panels = int(np.prod([n for d, n in fig_view.sizes.items() if d not in ("chain", "draw")]))
    cols = min(3, panels)
    axes = az.plot_posterior(fig_view, var_names=[key], hdi_prob=0.94, textsize=9,
                             figsize=(3.2 * cols, 2.6 * -(-panels // cols)))
    out.append(_img(np.ravel(axes)[0].figure, f"posterior of {key} of {name}"))
    if chains > 1 or "sample_stats" in idata.groups():
        axes = az.plot_trace(fig_view, var_names=[key], compact=True)
        out.append(_img(np.ravel(axes)[0].figure, f"trace of {name}"))
    if "p" in post:
        out.append(_probit_section(name, idata))
    elif "posterior_predictive" in idata.groups():
        first = {d: 0 for d in idata.observed_data.dims if d.startswith("obs_batch")}
        pp = idata.isel(**first) if first else idata
        axes = az.plot_ppc(pp, num_pp_samples=50, random_seed=int(seed))
        out.append("<p>Posterior predictive check: the observed outcomes against 50 replicated data sets.</p>")
        out.append(_img(np.ravel(axes)[0].figure, f"posterior predictive check of {name}"))
    plt.close("all")
    return "\n".join(out)


def _probit_section(name: str, idata) -> str:
    """The success probability at the points and, with outcomes, a reliability diagram, Brier score and ECE."""
    from .plots import plt

    p = idata.posterior["p"].stack(sample=("chain", "draw")).values  # [n, S]
    mean = p.mean(-1)
    lo, hi = np.quantile(p, [0.03, 0.97], axis=-1)
    order = np.argsort(mean)
    x = np.arange(mean.size)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.fill_between(x, lo[order], hi[order], alpha=0.3, label="94% central interval")
    ax.plot(x, mean[order], lw=1.2, label="posterior mean")
    has_y = "observed_data" in idata.groups() and "y" in idata.observed_data
    if has_y:
        y = idata.observed_data["y"].values
        ax.scatter(x, y[order], s=3, color="k", alpha=0.3, label="observed outcome (0/1)")
    ax.set(xlabel="point, sorted by posterior mean", ylabel="success probability Phi(f)", ylim=(-0.03, 1.03))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    out = ["<p>Posterior of the success probability Phi(f) at the points.</p>", _img(fig, f"success probability of {name}")]
    if has_y:
        brier = brier_score(mean, y)
        ece = expected_calibration_error(mean, y)
        base = brier_score(np.full_like(mean, y.mean()), y)
        fig = reliability_diagram(mean, y, title=f"Reliability diagram: {name}")
        out.append(f"<p>Calibration of the posterior mean probability against the stored outcomes (in sample: the "
                   f"model was fitted on them): Brier score {brier:.4f} (a constant at the base rate "
                   f"{float(y.mean()):.3f}: {base:.4f}), expected calibration error {ece:.4f} over 10 bins.</p>")
        out.append(_img(fig, f"reliability diagram of {name}"))
        plt.close(fig)
    return "\n".join(out)


def diagnose_run(run_dir, *, num_draws: int = 500, max_batch: int | None = 10, show_batch: int = 4,
                 seed: int = 0) -> Path:
    """Write ``run_dir/diagnostics/``: ``report.html`` (figures embedded) and one NetCDF per model.

    ``run_dir`` is any directory with a ``models/`` subdirectory written by ``save_models``:
    a ``bayes-safe simulate`` output or a study's output directory. Every saved posterior is
    converted by ``to_inference_data`` (views of one posterior once, named
    ``<prefix>__<role1>+<role2>``) and written as ``<name>.nc``; the report has, per model, the
    ArviZ summary, the posterior of the weights, the trace when there are chains, a posterior
    predictive check when data were stored, and for the probit GP the success probability at the
    stored points with a reliability diagram, Brier score and ECE. Saved models that are not
    posteriors (e.g. a trained policy network) are listed as skipped.

    Args:
        run_dir: the run's output directory.
        num_draws: exact draws per conjugate model (and probit GP).
        max_batch: keep the first ``max_batch`` batch elements (replications) of batched models
            in the NetCDF files; ``None`` keeps all.
        show_batch: batch elements shown in the report's tables (figures show the first).
        seed: seed of the draws.

    Returns:
        the path of ``report.html``.

    Raises:
        FileNotFoundError: ``run_dir`` is not a directory or has no saved models (naming the
            reason a run recorded with ``save_no_models``).
        TypeError: no saved model has an InferenceData converter (naming the types found).
    """
    from .io import atomic_output_dir, atomic_write_text

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"RUN_DIR: {run_dir} is not a directory")
    num_draws = check_positive_int(num_draws, "num_draws")
    max_batch = check_positive_int(max_batch, "max_batch", allow_none=True)
    show_batch = check_positive_int(show_batch, "show_batch")
    models = load_models(run_dir / "models")
    groups: dict[int, list[str]] = {}
    for key, model in models.items():
        groups.setdefault(id(_underlying(model)), []).append(key)
    convertible = [keys for keys in groups.values() if _converter(models[keys[0]]) is not None]
    skipped = [keys for keys in groups.values() if _converter(models[keys[0]]) is None]
    if not convertible:
        found: dict[str, int] = {}
        for keys in skipped:
            found[type(models[keys[0]]).__name__] = found.get(type(models[keys[0]]).__name__, 0) + len(keys)
        raise TypeError(
            f"{run_dir / 'models'}: none of the {len(models)} saved models is a posterior with an InferenceData "
            f"converter (found {', '.join(f'{k} x {v}' for k, v in found.items())}); expected {ACCEPTED_MODELS}"
        )
    sections, index = [], []
    with atomic_output_dir(run_dir / "diagnostics") as tmp:
        for keys in convertible:
            name = _group_name(keys)
            model = models[keys[0]]
            idata = to_inference_data(model, num_draws=num_draws, seed=seed, max_batch=max_batch)
            idata.to_netcdf(str(tmp / f"{name}.nc"), engine="h5netcdf")
            sections.append(_model_section(name, keys, [models[k] for k in keys], idata, show_batch, seed))
            index.append(f'<li><a href="#{html.escape(name)}">{html.escape(name)}</a> '
                         f"({html.escape(type(_underlying(model)).__name__)})</li>")
        skipped_html = ""
        if skipped:
            items = "".join(f"<li>{html.escape(_group_name(keys))}: {html.escape(type(models[keys[0]]).__name__)}</li>"
                            for keys in skipped)
            skipped_html = f"<p>Saved models that are not posteriors (no InferenceData converter), skipped:</p><ul>{items}</ul>"
        page = (
            "<!doctype html><html><head><meta charset='utf-8'><title>bayes_safe diagnostics</title>"
            "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse;font-size:12px}"
            "td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}</style></head><body>"
            f"<h1>Posterior diagnostics: {html.escape(run_dir.name)}</h1>"
            f"<p>{len(convertible)} posterior(s) from <code>{html.escape(str(run_dir / 'models'))}</code>, "
            f"{num_draws} draws per exact posterior, seed {seed}.</p><ul>{''.join(index)}</ul>{skipped_html}"
            + "".join(sections) + "</body></html>"
        )
        atomic_write_text(tmp / "report.html", page)
    return run_dir / "diagnostics" / "report.html"
