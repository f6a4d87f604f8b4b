"""Posteriors as ArviZ ``InferenceData``: ``to_inference_data``, ``summary``, ``prior_predictive``.

``to_inference_data`` picks one converter per model type: exact draws for the
conjugate linear models and BCTS's ``CTSPosterior``, chains and sample statistics for NUTS,
guide draws for SVI, and draws of the latent function at points for the probit GP. ArviZ is
imported inside the functions that need it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .._validation import check_positive_int
from ._common import _batch_dims, _converter, _feature_names, _np, _probit_types

__all__ = ["ACCEPTED_MODELS", "prior_predictive", "summary", "to_inference_data"]

#: what ``to_inference_data`` converts (named in its errors)
ACCEPTED_MODELS = (
    "BayesianLinear (conjugate, NUTS or SVI), PerArmLinear, CTSPosterior (BCTS), ProbitGP or its "
    "SuccessProbability / ScaledOutcome views, or a model with a to_inference_data method"
)


def to_inference_data(model, *, X=None, y=None, num_draws: int = 1000, feature_names: Sequence[str] | None = None,
                      seed: int = 0, max_batch: int | None = None, max_points: int = 500):
    """An ``arviz.InferenceData`` of ``model``'s posterior.

    What each model gives (``S = num_draws``; ``*batch`` the model's batch dimensions, named
    ``batch0, batch1, ...``):

    * ``BayesianLinear``, conjugate (Gaussian prior with a known noise, or Normal-Inverse-Gamma):
      ``S`` exact draws in one chain: ``w (chain, draw, *batch, feature)`` and, for NIG,
      ``noise_var (chain, draw, *batch)``.
    * ``BayesianLinear`` sampled by the Gibbs engine: ``S`` consecutive sweeps of a copy of the
      chain, ``w`` (one chain); by the Langevin engine: ``S`` consecutive MALA steps of a copy of
      the chains after a burn-in, every latent site of the prior on its own scale and ``w``. The
      model's own chain does not move.
    * ``BayesianLinear`` fitted by NUTS: every latent site of the prior per chain (``w``, the
      prior's hyperparameters, ``noise_var``) and ``sample_stats`` (``diverging``,
      ``acceptance_rate``, ``step_size``, ``lp``, ``energy``: so ``az.bfmi`` and
      ``az.plot_energy`` work); by SVI: the stored guide draws of every latent site (one chain).
      Their stored data are the ``observed_data`` unless ``X, y`` are given. When observations
      arrived after the last fit, a ``UserWarning`` says so and ``attrs["unfitted_observations"]``
      counts them.
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

    from ..models import PerArmLinear

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
    if not model.conjugate and getattr(model, "engine_name", None) == "langevin":
        # consecutive MALA steps of a copy of the chains: every latent site of the prior, and w
        import copy

        chain = copy.deepcopy(model.engine)
        chain.fit(gen)  # burn-in on the copy after the latest data (the model's own chain is not moved)
        states = chain.run(int(num_draws), gen)  # [S, *batch, P]
        for name, value in chain.site_values(states).items():
            posterior[name] = _np(value)[None]
        posterior["w"] = _np(chain.weights(states))[None]
        w_flat = torch.as_tensor(posterior["w"][0])
    elif not model.conjugate and getattr(model, "engine_name", None) == "gibbs":
        # consecutive sweeps of a copy of the chain (one chain; the model's own chain is not moved)
        import copy

        chain = copy.deepcopy(model)
        draws = torch.stack([chain.sample(gen) for _ in range(int(num_draws))])  # [S, *batch, d]
        posterior["w"] = _np(draws)[None]
        w_flat = draws
    elif model.conjugate:
        draws = torch.stack([model.sample(gen) for _ in range(int(num_draws))])  # [S, *batch, d]
        posterior["w"] = _np(draws)[None]
        if model.noise_prior is not None:
            post = model.noise_variance_posterior
            a = post.concentration.expand(num_draws, *batch)
            b = post.rate.expand(num_draws, *batch)
            from ..random import standard_gamma

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
            svi_draws = getattr(engine, "svi_draws", None) or {}  # older engines lack it
            if svi_draws:  # every latent site (hyperparameters too), as one chain
                for name, value in svi_draws.items():
                    posterior[name] = _np(value)[None]
            else:
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
             "inference": getattr(model, "engine_name", None) or ("conjugate" if model.conjugate else model.engine.method)}
    unfitted = int(getattr(model, "unfitted_observations", 0))
    if unfitted:  # NUTS / SVI draws that do not reflect the latest observations yet
        import warnings

        attrs["unfitted_observations"] = unfitted
        warnings.warn(f"model: {unfitted} observations arrived after the last {attrs['inference'].upper()} fit and are "
                      "not in these draws; call model.fit() first for the current posterior", UserWarning, stacklevel=2)
    return az.from_dict(**groups, coords=coords, dims={k: v for k, v in dims.items() if _used(k, groups)},
                        attrs=attrs)


def _used(name: str, groups: dict) -> bool:
    return any(name in g for g in groups.values())


def _cts_inference_data(model, X, y, num_draws, feature_names, seed, max_batch):
    """Exact draws of a ``CTSPosterior``: ``w_k ~ N(mu_hat_k, v^2 B_k^-1)``."""
    import arviz as az

    from ..models.linear import _cholesky

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

    from ..models.linear import check_real_support
    from ..models.pyro_inference import PyroLinearPosterior

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
