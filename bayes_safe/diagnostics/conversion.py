"""Posteriors as ArviZ ``InferenceData``: ``to_inference_data``, ``summary``, ``prior_predictive``.

``to_inference_data`` picks one converter per model type: exact draws for the
conjugate linear models and BCTS's ``CTSPosterior``, independent copies of the Gibbs and
Langevin chains (every latent variable), chains and sample statistics for NUTS, guide draws
for SVI, and draws of the latent function at points for the probit GP; several chains by
default, and a pointwise ``log_likelihood`` group whenever the observed data are known (so
``az.loo`` and ``az.compare`` work). ArviZ is imported inside the functions that need it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from .._validation import check_positive_int
from ..threads import single_thread
from ._common import _batch_dims, _converter, _feature_names, _np, _probit_types

__all__ = ["ACCEPTED_MODELS", "prior_predictive", "summary", "to_inference_data"]

#: what ``to_inference_data`` converts (named in its errors)
ACCEPTED_MODELS = (
    "BayesianLinear (conjugate, NUTS or SVI), PerArmLinear, CTSPosterior (BCTS), ProbitGP or its "
    "SuccessProbability / ScaledOutcome views, or a model with a to_inference_data method"
)


def to_inference_data(model, *, X=None, y=None, num_draws: int = 1000, num_chains: int = 4,
                      feature_names: Sequence[str] | None = None, seed: int = 0, max_batch: int | None = None,
                      max_points: int = 500, max_rows: int | None = None):
    """An ``arviz.InferenceData`` of ``model``'s posterior, with several chains and, when the
    observed data are known, a ``log_likelihood`` group (so ``az.loo``, ``az.waic``,
    ``az.compare`` and ``az.rhat`` work).

    What each model gives (``C = num_chains``, ``S = num_draws``; ``*batch`` the model's batch
    dimensions, named ``batch0, batch1, ...``):

    * ``BayesianLinear``, conjugate (Gaussian prior with a known noise, or Normal-Inverse-Gamma):
      ``C x S`` independent exact draws split into ``C`` chains, ``w (chain, draw, *batch,
      feature)`` and, for NIG, ``noise_var (chain, draw, *batch)`` (drawn jointly with ``w``).
    * ``BayesianLinear`` sampled by the Gibbs engine: ``C`` independent copies of the model's
      chain (deep copies, each with its own generator seeded from ``seed`` and the chain index),
      each run for ``burn_in`` sweeps and then ``S`` sweeps; ``w`` and every other latent
      variable of the sampler: the horseshoe's global and local scales ``tau (chain, draw,
      *batch)`` and ``lam (chain, draw, *batch, feature)``, the Laplace / Student-t mixing
      variances ``prior_var (chain, draw, *batch, feature)`` (``w_j ~ N(m_j, prior_var_j)``)
      and ``noise_var`` when the noise variance is sampled. The Langevin engine:
      ``C`` copies of the chains, each after its own burn-in (a preconditioner refresh and
      ``burn_in`` steps), ``S`` MALA steps each; every latent site of the prior on its own scale,
      ``w``, and ``sample_stats`` ``acceptance_rate`` (the acceptance probability of each step)
      and ``step_size``. The model's own chain never moves.
    * ``BayesianLinear`` fitted by NUTS: its chains as stored (``inference_options={"num_chains":
      4}`` gives four; with one, ``az.rhat`` is NaN), every latent site of the prior per chain
      (``w``, the prior's hyperparameters, ``noise_var``) and ``sample_stats`` (``diverging``,
      ``acceptance_rate``, ``step_size``, ``lp``, ``energy``: so ``az.bfmi`` and
      ``az.plot_energy`` work); by SVI: the stored guide draws of every latent site, split into
      ``C`` chains of ``num_samples // C`` draws (``num_draws`` does not apply). When
      observations arrived after the last fit, a ``UserWarning`` says so and
      ``attrs["unfitted_observations"]`` counts them.
    * ``PerArmLinear``: as a conjugate ``BayesianLinear`` whose last batch dimension is ``arm``;
      ``X [*batch, arm, n, d]``, ``y [*batch, arm, n]`` are each arm's own rows (or rows shared
      by every arm, ``X [n, d]``, ``y [n]``), scored under that arm's weights.
    * ``CTSPosterior`` (BCTS, Balakrishnan et al. 2018 Algorithm 1): ``C x S`` exact draws of
      every arm's ``w_k ~ N(mu_hat_k, v^2 B_k^-1)``, ``w (chain, draw, *batch, arm, feature)``,
      and the observations per arm as ``constant_data.num_observations (*batch, arm)``. It keeps
      sufficient statistics, not rows, so ``X, y`` are not accepted (and there is no
      ``log_likelihood`` group).
    * ``ProbitGP`` (Daulton et al. 2019 s.5.2) or a ``SuccessProbability`` / ``ScaledOutcome``
      view of one: ``C x S`` exact draws of the GP's weights over its learned features ``w
      (chain, draw, feature)`` (features ``phi0 ..``, ``intercept``), the latent function ``f
      (chain, draw, point)`` at the points ``X [n, D]`` and the success probability ``p =
      Phi(f)`` there. Without ``X`` the points are the model's stored observations (an evenly
      spaced subset of at most ``max_points``) with their outcomes; when the outcomes are known,
      ``posterior_predictive.y`` holds Bernoulli(``p``) draws and ``log_likelihood.y`` the
      Bernoulli log-probability of each outcome.

    The observed data and the ``log_likelihood`` group: with data (``X, y`` given, or the rows a
    model stored), ``observed_data.y (*batch, obs)``, ``posterior_predictive.y (chain, draw,
    *batch, obs)`` and ``log_likelihood.y (chain, draw, *batch, obs)``: the log-likelihood of
    each observation under each draw, ``log N(y_i | x_i^T w, s2)`` with the known noise
    variance or the drawn ``noise_var``, or for 0/1 models ``log Phi(s_i x_i^T w)`` (probit) /
    ``log sigmoid(s_i x_i^T w)`` (logistic), ``s_i = 2 y_i - 1``. ``az.loo`` counts every
    ``(batch element, observation)`` as one data point. Which models store rows: NUTS and SVI
    fits, and the Gibbs and Langevin engines under a probit or logistic likelihood; conjugate
    models (``BayesianLinear``, ``PerArmLinear``) and the Gibbs and Langevin engines under a
    Gaussian likelihood keep sufficient statistics only, so for them pass the ``X, y`` they
    learned from, or the InferenceData has no ``log_likelihood`` group (``az.loo`` then fails;
    ``attrs["log_likelihood"]`` says why).

    Args:
        model: one of the models above, or any object with a ``to_inference_data(X=, y=,
            num_draws=, seed=)`` method of its own (given ``num_chains=`` too if it accepts it).
        X, y: the observed data: for linear models ``X [n, d]`` or ``[*batch, n, d]`` and ``y``
            to match (for ``likelihood="probit"`` / ``"logistic"``, 0/1 outcomes); for the probit
            GP the points ``X [n, D]`` (and optional 0/1 outcomes ``y [n]``). Without them, models
            that store their rows use those.
        num_draws: draws per chain (exact draws, Gibbs sweeps or Langevin steps; not NUTS or SVI,
            whose draws are stored).
        num_chains: chains (default 4): independent chains of exact draws, independent copies of
            a Gibbs or Langevin chain, or SVI draws split into chains. NUTS keeps its own chains.
        feature_names: names of the ``d`` features (coordinates of the ``feature`` dimension);
            for the probit GP, of its ``p`` weights. ``None``: the names the model keeps
            (``BayesianLinear(feature_names=...)``, saved with its state), else ``x0, x1, ...``.
        seed: seed of the draws, of the chain copies and of the predictive noise.
        max_batch: keep only the first ``max_batch`` elements of the leading batch dimension
            (replications); ``None`` keeps all.
        max_points: probit GP only: at most this many stored points when ``X`` is not given.
        max_rows: linear models that store their rows, when ``X`` is not given: use at most this
            many of them (an evenly spaced subset, in arrival order; ``attrs["rows"]`` says so),
            to bound the size of the data groups (``C * S * batch * rows`` numbers each);
            ``None`` (default) uses every row, as ``az.loo`` of the whole data needs.

    Returns:
        ``arviz.InferenceData`` with a ``posterior`` group and, where they apply,
        ``sample_stats``, ``log_likelihood``, ``observed_data``, ``posterior_predictive`` and
        ``constant_data``.

    Raises:
        TypeError: ``model`` has no converter (the message names its type and the accepted ones).
        ValueError: a bad ``num_draws``, ``num_chains``, ``max_batch``, ``max_points``,
            ``max_rows``, ``feature_names``, ``X`` or ``y``.
    """
    kind = _converter(model)
    if kind is None:
        raise TypeError(f"model: no InferenceData converter for {type(model).__name__}; expected {ACCEPTED_MODELS}")
    num_draws = check_positive_int(num_draws, "num_draws")
    num_chains = check_positive_int(num_chains, "num_chains")
    max_batch = check_positive_int(max_batch, "max_batch", allow_none=True)
    max_points = check_positive_int(max_points, "max_points")
    max_rows = check_positive_int(max_rows, "max_rows", allow_none=True)
    if kind == "own":
        kwargs = {"X": X, "y": y, "num_draws": num_draws, "seed": seed}
        if _accepts(model.to_inference_data, "num_chains"):
            kwargs["num_chains"] = num_chains
        return model.to_inference_data(**kwargs)
    if kind == "cts":
        return _cts_inference_data(model, X, y, num_draws, num_chains, feature_names, seed, max_batch)
    if kind == "probit_gp":
        return _probit_inference_data(model, X, y, num_draws, num_chains, feature_names, seed, max_points)
    return _linear_inference_data(model, X, y, num_draws, num_chains, feature_names, seed, max_batch, max_rows)


def _accepts(fn, name: str) -> bool:
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _chain_generator(seed: int, chain: int) -> torch.Generator:
    """The generator of chain ``chain``: its own seed, derived from ``seed`` and the chain index."""
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(chain)]).generate_state(1)
    return torch.Generator().manual_seed(int(state[0]))


def _split_chains(t: torch.Tensor, chains: int) -> torch.Tensor:
    """``[N, ...]`` independent draws as ``[C, N // C, ...]`` (``C = min(chains, N)``; a remainder is dropped)."""
    n = t.shape[0]
    c = max(1, min(int(chains), n))
    s = n // c
    return t[: c * s].reshape(c, s, *t.shape[1:])


def _lower_factor(cov: torch.Tensor) -> torch.Tensor:
    """Lower Cholesky factor of ``cov [..., d, d]``, with a growing diagonal jitter if it is not positive definite."""
    factor, info = torch.linalg.cholesky_ex(cov)
    if not bool(info.any()):
        return factor
    scale = cov.diagonal(dim1=-2, dim2=-1).abs().mean(-1).clamp_min(1e-300)[..., None, None]
    eye = torch.eye(cov.shape[-1], dtype=cov.dtype)
    for k in range(-12, 0):
        factor, info = torch.linalg.cholesky_ex(cov + 10.0**k * scale * eye)
        if not bool(info.any()):
            return factor
    raise ValueError("covariance: not positive definite")


def _conjugate_draws(model, total: int, gen: torch.Generator, max_batch: int | None) -> dict[str, torch.Tensor]:
    """``total`` exact joint draws of a conjugate ``BayesianLinear``: ``w [total, *b, d]`` and, for NIG,
    ``noise_var [total, *b]`` (``w | s2 ~ N(mean, s2 Lambda^-1)``), ``b`` cut to ``max_batch``."""
    from ..random import standard_gamma

    L, mean = model.factor, model.posterior_mean
    nig = model.noise_prior is not None
    if nig:
        post = model.noise_variance_posterior
        a, b = post.concentration.expand(mean.shape[:-1]), post.rate.expand(mean.shape[:-1])
    if max_batch is not None and mean.dim() > 1:
        L, mean = L[:max_batch], mean[:max_batch]
        if nig:
            a, b = a[:max_batch], b[:max_batch]
    z = torch.randn(*mean.shape, total, generator=gen, dtype=torch.float64)  # [*b, d, total]
    dev = torch.linalg.solve_triangular(L.mT, z, upper=True).movedim(-1, 0)  # L^-T z: [total, *b, d]
    out = {}
    if nig:
        s2 = b / standard_gamma(a.expand(total, *a.shape).contiguous(), generator=gen)
        dev = dev * s2.sqrt()[..., None]
        out["noise_var"] = s2
    out["w"] = mean + dev
    return out


def _gibbs_draws(model, num_draws: int, num_chains: int, seed: int) -> dict[str, torch.Tensor]:
    """``num_chains`` deep copies of the Gibbs chain, each ``burn_in`` sweeps then ``num_draws`` sweeps:
    ``w`` and the latent variables (``GibbsLinearPosterior.latent_values``), ``[C, S, *b, ...]``."""
    import copy

    chains: dict[str, list] = {}
    with torch.no_grad():
        for c in range(num_chains):
            gen = _chain_generator(seed, c)
            engine = copy.deepcopy(model.engine)
            engine.fit(gen)  # its own burn-in, after the latest data
            latent = getattr(engine, "latent_values", dict)
            rows: dict[str, list] = {}
            for _ in range(num_draws):
                rows.setdefault("w", []).append(engine.run(1, gen)[0])
                for name, value in latent().items():
                    rows.setdefault(name, []).append(value)
            for name, values in rows.items():
                chains.setdefault(name, []).append(torch.stack(values))
    return {name: torch.stack(values) for name, values in chains.items()}


def _langevin_draws(model, num_draws: int, num_chains: int, seed: int):
    """``num_chains`` deep copies of the Langevin chains, each refreshed and burnt in, then ``num_draws``
    MALA steps: (every latent site and ``w`` ``[C, S, *b, ...]``, sample statistics ``[C, S, *b]``)."""
    import copy

    states, accept, step = [], [], []
    recorded: dict = {}
    for c in range(num_chains):
        gen = _chain_generator(seed, c)
        chain = copy.deepcopy(model.engine)
        chain.__dict__.update(recorded)  # the graphs the first copy recorded (they depend on the model alone)
        chain.fit(gen)  # preconditioner refresh and burn-in after the latest data
        if not recorded:
            recorded = {k: v for k, v in chain.__dict__.items() if k in _RECORDED_GRAPHS}
        st, acc, h = [], [], []
        for _ in range(num_draws):
            k0, rate0 = getattr(chain, "_adapt_count", 0), chain.accept_rate.clone()
            h.append(chain.log_step.exp())
            st.append(chain.run(1, gen)[0])
            k1 = getattr(chain, "_adapt_count", k0 + 1)
            # the running mean acceptance rate_k = rate_{k-1} + (alpha_k - rate_{k-1}) / k gives alpha_k
            acc.append((k1 * chain.accept_rate - k0 * rate0).clamp(0.0, 1.0))
        states.append(torch.stack(st))
        accept.append(torch.stack(acc))
        step.append(torch.stack(h))
    theta = torch.stack(states)  # [C, S, *b, P]
    posterior = dict(model.engine.site_values(theta))
    posterior["w"] = model.engine.weights(theta)
    stats = {"acceptance_rate": torch.stack(accept), "step_size": torch.stack(step)}
    return posterior, stats


_RECORDED_GRAPHS = ("_graph", "_graph_tried", "_step_graph", "_step_graph_tried")  # LangevinLinearPosterior's


def _stored_rows(model):
    """``(X [*b, n, d], y [*b, n])`` the model stored (NUTS / SVI; Gibbs and Langevin under a 0/1
    likelihood), or ``(None, None)`` (conjugate models and Gaussian-likelihood chains keep
    sufficient statistics only)."""
    name = getattr(model, "engine_name", None)
    if name in ("nuts", "svi") and getattr(model, "_X", None):
        return torch.cat(model._X, -2), torch.cat(model._y, -1)
    if name in ("gibbs", "langevin") and model.likelihood != "gaussian":
        engine = model.engine
        n = int(engine.n)
        if n:
            return engine._X[..., :n, :], engine._y[..., :n]
    return None, None


def _pointwise(likelihood: str, f: torch.Tensor, y: torch.Tensor, var, gen: torch.Generator):
    """``(log-likelihood, replicated outcomes)`` of ``y`` given the linear predictor ``f`` (same shape):
    Gaussian with variance ``var`` (broadcastable), or Bernoulli with ``Phi(f)`` / ``sigmoid(f)``."""
    if likelihood == "gaussian":
        var = torch.as_tensor(var, dtype=torch.float64)
        ll = -0.5 * (torch.log(2.0 * math.pi * var) + (y - f) ** 2 / var)
        y_rep = f + var.sqrt() * torch.randn(f.shape, generator=gen, dtype=torch.float64)
        return ll, y_rep
    s = 2.0 * y - 1.0
    if likelihood == "probit":
        ll, p = torch.special.log_ndtr(s * f), torch.special.ndtr(f)
    else:
        ll, p = torch.nn.functional.logsigmoid(s * f), torch.sigmoid(f)
    return ll, (torch.rand(f.shape, generator=gen, dtype=torch.float64) < p).double()


def _linear_inference_data(model, X, y, num_draws, num_chains, feature_names, seed, max_batch, max_rows=None):
    import arviz as az

    from ..models import PerArmLinear

    arms = None
    if isinstance(model, PerArmLinear):
        arms, model = model.num_arms, model.arms
    d = model.dim
    if feature_names is None:  # the names saved with the model (BayesianLinear(feature_names=...)), if any
        feature_names = getattr(model, "feature_names", None)
    features = _feature_names(d, feature_names)
    batch = list(model.batch_shape)
    full_batch = list(batch)
    if max_batch is not None and batch:
        batch[0] = min(batch[0], max_batch)
    bdims = _batch_dims(batch)
    if arms is not None:
        bdims[-1] = "arm"
    likelihood = getattr(model, "likelihood", "gaussian")
    if (X is None) != (y is None):
        raise ValueError("X, y: give both (the observed data: log-likelihood, observed and posterior predictive groups) "
                         "or neither")
    gen = torch.Generator().manual_seed(int(seed))
    engine_name = getattr(model, "engine_name", None) or ("conjugate" if model.conjugate else model.engine.method)
    sample_stats: dict[str, torch.Tensor] = {}
    if model.conjugate:
        draws = _conjugate_draws(model, num_chains * num_draws, gen, max_batch)
        posterior = {k: _split_chains(v, num_chains) for k, v in draws.items()}
    elif engine_name == "gibbs":
        with single_thread():  # small tensors: intra-op threads only add overhead (see BayesianLinear.fit)
            posterior = _gibbs_draws(model, num_draws, num_chains, seed)
    elif engine_name == "langevin":
        with single_thread():
            posterior, sample_stats = _langevin_draws(model, num_draws, num_chains, seed)
    elif engine_name == "laplace":  # the online Gaussian (issue 42): independent exact draws of the approximation
        posterior = {"w": _split_chains(model.sample((num_chains * num_draws,), generator=gen), num_chains)}
    else:
        engine = model.engine
        chains = engine.chains
        if chains:  # NUTS: [C, D, *b, ...] as stored
            posterior = dict(chains)
            sample_stats = dict(engine.sample_stats)
        else:  # SVI guide draws (every latent site), or prior draws before any fit: [N, *b, ...] split
            svi_draws = getattr(engine, "svi_draws", None) or {}  # older engines lack it
            flat = dict(svi_draws) if svi_draws else {"w": model._draws}
            if not svi_draws and engine.noise_draws is not None:
                flat["noise_var"] = engine.noise_draws
            posterior = {k: _split_chains(torch.as_tensor(v), num_chains) for k, v in flat.items()}
    if max_batch is not None and full_batch and batch[0] < full_batch[0]:
        posterior = {k: v[:, :, : batch[0]] for k, v in posterior.items()}
        sample_stats = {k: v[:, :, : batch[0]] for k, v in sample_stats.items()}
    attrs = {"model": "PerArmLinear" if arms is not None else "BayesianLinear", "inference": engine_name,
             "likelihood": likelihood}
    groups: dict = {"posterior": {k: _np(v) for k, v in posterior.items()}}
    dims = {"w": [*bdims, "feature"], "noise_var": list(bdims)}
    for name, value in groups["posterior"].items():  # other sites: batch dims, then their own
        if name in ("lam", "prior_var") and engine_name == "gibbs":  # one scale per weight
            dims[name] = [*bdims, "feature"]
        elif name not in dims:
            dims[name] = [*bdims, *[f"{name}_dim{i}" for i in range(value.ndim - 2 - len(bdims))]]
    if sample_stats:
        groups["sample_stats"] = {k: _np(v) for k, v in sample_stats.items()}
        for name in sample_stats:
            dims[name] = list(bdims)
    if X is None:
        X, y = _stored_rows(model)
        if X is not None and max_batch is not None and full_batch:
            X, y = X[: batch[0]], y[: batch[0]]
        if X is not None and max_rows is not None and X.shape[-2] > max_rows:
            n_all = X.shape[-2]
            rows = torch.linspace(0, n_all - 1, max_rows, dtype=torch.float64).round().long().unique()
            X, y = X[..., rows, :], y[..., rows]
            attrs["rows"] = f"{rows.numel()} of the {n_all} stored rows, evenly spaced in arrival order"
    else:
        X = torch.as_tensor(np.asarray(X, dtype=np.float64) if not isinstance(X, torch.Tensor) else X,
                            dtype=torch.float64)
        y = torch.as_tensor(np.asarray(y, dtype=np.float64) if not isinstance(y, torch.Tensor) else y,
                            dtype=torch.float64)
        if X.dim() < 2 or X.shape[-1] != d or tuple(y.shape) != tuple(X.shape[:-1]):
            raise ValueError(f"X, y: expected X [..., n, {d}] and y [..., n], got {list(X.shape)} and {list(y.shape)}")
        lead = list(X.shape[:-2])
        try:
            ok = list(torch.broadcast_shapes(tuple(lead), tuple(full_batch))) == full_batch
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"X, y: the leading dimensions {lead} of X do not match the model's batch shape "
                             f"{full_batch} (give X [n, {d}] or [*batch, n, {d}])")
        if not (bool(torch.isfinite(X).all()) and bool(torch.isfinite(y).all())):
            raise ValueError("X, y: expected finite numbers (no NaN or infinity)")
        if likelihood != "gaussian" and not bool(((y == 0) | (y == 1)).all()):
            raise ValueError(f"y: likelihood={likelihood!r} models 0/1 outcomes; expected values in {{0, 1}}")
        if max_batch is not None and full_batch and len(lead) == len(full_batch) and lead[0] == full_batch[0]:
            X, y = X[: batch[0]], y[: batch[0]]
    if X is not None:
        n = X.shape[-2]
        B = int(np.prod(batch)) if batch else 1
        w = posterior["w"]  # [C, S, *b, d]
        C, S = w.shape[:2]
        Xb = X.expand(*batch, n, d).reshape(B, n, d)
        f = torch.einsum("bnd,sbd->sbn", Xb, w.reshape(C * S, B, d)).reshape(C, S, *batch, n)
        yb = y.expand(*batch, n)
        var = None
        if likelihood == "gaussian":
            var = posterior["noise_var"][..., None] if "noise_var" in posterior else float(model.noise_std) ** 2
        ll, y_rep = _pointwise(likelihood, f, yb, var, gen)
        groups["log_likelihood"] = {"y": _np(ll)}
        groups["posterior_predictive"] = {"y": _np(y_rep)}
        groups["observed_data"] = {"y": _np(yb)}
        dims["y"] = [*bdims, "obs"]
    elif engine_name in ("nuts", "svi"):
        attrs["log_likelihood"] = "absent: no observations stored yet (pass X, y)"
    else:
        attrs["log_likelihood"] = ("absent: this model keeps sufficient statistics, not its rows; pass the X, y it "
                                   "learned from for the log_likelihood, observed_data and posterior_predictive groups")
    coords: dict = {"feature": features}
    if arms is not None:
        coords["arm"] = list(range(arms))
    unfitted = int(getattr(model, "unfitted_observations", 0))
    if unfitted:  # NUTS / SVI draws that do not reflect the latest observations yet
        import warnings

        attrs["unfitted_observations"] = unfitted
        warnings.warn(f"model: {unfitted} observations arrived after the last {engine_name.upper()} fit and are "
                      "not in these draws; call model.fit() first for the current posterior", UserWarning, stacklevel=3)
    return az.from_dict(**groups, coords=coords, dims={k: v for k, v in dims.items() if _used(k, groups)},
                        attrs=attrs)


def _used(name: str, groups: dict) -> bool:
    return any(name in g for g in groups.values())


def _cts_inference_data(model, X, y, num_draws, num_chains, feature_names, seed, max_batch):
    """Exact draws of a ``CTSPosterior``: ``w_k ~ N(mu_hat_k, v^2 B_k^-1)``, split into chains."""
    import arviz as az

    if X is not None or y is not None:
        raise ValueError(
            "X, y: not accepted for a CTSPosterior: it keeps per-arm sufficient statistics, not rows, and a "
            "posterior predictive check would need the arm played at each row"
        )
    d, K = model.dim, model.num_arms
    if feature_names is None:  # the names saved with the model (CTSPosterior(feature_names=...)), if any
        feature_names = getattr(model, "feature_names", None)
    features = _feature_names(d, feature_names)
    mean = model.posterior_mean  # [*b, K, d]
    cov = model.posterior_covariance  # [*b, K, d, d]
    counts = model.num_observations  # [*b, K]
    batch = list(model.batch_shape)
    if max_batch is not None and batch:
        mean, cov, counts = mean[:max_batch], cov[:max_batch], counts[:max_batch]
        batch[0] = mean.shape[0]
    gen = torch.Generator().manual_seed(int(seed))
    factor = _lower_factor(cov)
    z = torch.randn(*mean.shape, int(num_chains) * int(num_draws), generator=gen, dtype=torch.float64)
    w = mean + (factor @ z).movedim(-1, 0)  # [C S, *b, K, d]
    bdims = _batch_dims(batch)
    return az.from_dict(
        posterior={"w": _np(_split_chains(w, num_chains))}, constant_data={"num_observations": _np(counts)},
        coords={"feature": features, "arm": list(range(K))},
        dims={"w": [*bdims, "arm", "feature"], "num_observations": [*bdims, "arm"]},
        attrs={"model": "CTSPosterior", "inference": "conjugate", "v": float(model.v),
               "log_likelihood": "absent: a CTSPosterior keeps per-arm sufficient statistics, not rows"},
    )


def _probit_inference_data(model, X, y, num_draws, num_chains, feature_names, seed, max_points):
    """Draws of the probit GP's weights and of its latent function ``f`` (and ``Phi(f)``) at points."""
    import arviz as az

    _, view_type = _probit_types()
    gp = model.model if isinstance(model, view_type) else model
    names = _feature_names(gp.feature_dim, gp.weight_names if feature_names is None else feature_names)
    gen = torch.Generator().manual_seed(int(seed))
    z = torch.randn(int(num_chains) * int(num_draws), gp.feature_dim, generator=gen, dtype=torch.float64)
    w = _split_chains(gp.weight_mean + z @ gp._weight_factor.mT, num_chains)  # [C, S, p]: draws of q(w)
    posterior = {"w": _np(w)}
    dims = {"w": ["feature"]}
    coords: dict = {"feature": names}
    groups: dict = {"posterior": posterior}
    attrs = {"model": "ProbitGP", "view": type(model).__name__, "num_observations": int(gp.num_observations),
             "num_fits": int(gp.num_fits), "likelihood": "probit"}
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
        X = torch.as_tensor(np.asarray(X, dtype=np.float64) if not isinstance(X, torch.Tensor) else X,
                            dtype=torch.float64)
        if X.dim() != 2 or X.shape[-1] != gp.input_dim:
            raise ValueError(f"X: expected points of shape [n, {gp.input_dim}], got {list(X.shape)}")
        points = torch.arange(X.shape[0])
        if y is not None:
            y = torch.as_tensor(np.asarray(y, dtype=np.float64) if not isinstance(y, torch.Tensor) else y,
                                dtype=torch.float64)
            if tuple(y.shape) != (X.shape[0],):
                raise ValueError(f"y: expected shape [{X.shape[0]}] to match X, got {list(y.shape)}")
            if not bool(((y == 0) | (y == 1)).all()):
                raise ValueError("y: expected binary outcomes in {0, 1} (the probit GP is a Bernoulli model)")
        attrs["points"] = f"{X.shape[0]} given points"
    if X is not None:
        phi = gp.features(X)  # [n, p]
        f = w @ phi.T  # [C, S, n]: one draw of the whole latent function per row
        posterior["f"], posterior["p"] = _np(f), _np(torch.special.ndtr(f))
        dims["f"] = dims["p"] = ["point"]
        coords["point"] = points.tolist()
        if y is not None:
            ll, y_rep = _pointwise("probit", f, y.to(torch.float64), None, gen)
            groups["posterior_predictive"] = {"y": _np(y_rep)}
            groups["log_likelihood"] = {"y": _np(ll)}
            groups["observed_data"] = {"y": _np(y)}
            dims["y"] = ["point"]
    if "log_likelihood" not in groups:
        attrs["log_likelihood"] = "absent: no outcomes known at the points (pass X and y)"
    scale = getattr(model, "scale", None)
    if scale is not None:
        attrs["scale"] = [float(v) for v in scale]
    return az.from_dict(**groups, coords=coords, dims=dims, attrs=attrs)


def summary(idata, var_names: Sequence[str] | None = None, hdi_prob: float = 0.94, *, check: bool = True):
    """ArviZ summary table (mean, sd, HDI, ESS and r-hat where chains exist) as a DataFrame.

    With ``check`` (default), the mixing of every summarised variable is checked
    (``convergence_warnings``: r-hat <= 1.01, bulk and tail ESS >= 100): each failing variable
    gives one ``ConvergenceWarning`` whose message is a line such as ``warning: tau r-hat 1.28 >
    1.01, bulk ESS 12 < 100: the chains have not mixed; ...`` (the number of failing weights and
    the worst ones named), and the lines are kept in the table's ``attrs["convergence_warnings"]``
    (empty when every value passes).
    """
    import warnings

    import arviz as az

    from .convergence import ConvergenceWarning, convergence_warnings

    table = az.summary(idata, var_names=var_names, hdi_prob=hdi_prob)
    if check:
        lines = convergence_warnings(idata, var_names=var_names)
        table.attrs["convergence_warnings"] = lines
        for line in lines:
            warnings.warn(line, ConvergenceWarning, stacklevel=2)
    return table


def prior_predictive(prior, X, *, noise_std: float | None = None, noise_prior=None, num_draws: int = 500,
                     seed: int = 0, feature_names: Sequence[str] | None = None):
    """Prior and prior-predictive draws for a custom prior, before any data (``prior`` and
    ``prior_predictive`` groups). Check that outcomes it implies at ``X [n, d]`` are plausible.

    ``prior`` is what ``BayesianLinear`` accepts: a distribution with
    event shape ``[d]`` or a callable Pyro model returning ``w``. A prior whose support does not
    match the weights (draws that are not finite real vectors of width ``d``) is rejected.
    """
    import arviz as az

    from ..models._gaussian import check_real_support
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
