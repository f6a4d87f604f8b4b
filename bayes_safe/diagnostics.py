"""Look inside posteriors: ArviZ InferenceData, summaries, plots, calibration, coverage.

* :func:`to_inference_data` converts any posterior model of the toolkit into an
  ``arviz.InferenceData``: exact draws for conjugate models, chains with sample statistics for
  NUTS, guide draws for SVI; with ``observed_data`` and ``posterior_predictive`` groups when
  data is known; coordinates named after the features.
* :func:`prior_predictive` checks a custom prior before any data arrives.
* :func:`brier_score`, :func:`expected_calibration_error`, :func:`reliability_diagram` for
  Bernoulli models.
* :func:`interval_coverage`: simulated problems know the truth, so the share of replications
  whose central credible interval covers the true parameter can be checked against its level.
* :class:`PosteriorRecorder`: a ``simulate`` callback that records the posterior of each model
  over time (watching a Thompson posterior evolve).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "to_inference_data", "summary", "prior_predictive", "brier_score", "expected_calibration_error",
    "reliability_diagram", "interval_coverage", "PosteriorRecorder", "save_models", "load_models",
    "diagnose_run",
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


def to_inference_data(model, *, X=None, y=None, num_draws: int = 1000, feature_names: Sequence[str] | None = None,
                      seed: int = 0):
    """An ``arviz.InferenceData`` of ``model``'s posterior.

    Args:
        model: a ``BayesianLinear`` (conjugate, NUTS or SVI), a ``PerArmLinear``, or any model
            with a ``to_inference_data`` method of its own (e.g. the probit GP).
        X, y: data for the ``observed_data`` and ``posterior_predictive`` groups
            (``X: [n, d]`` or ``[*batch, n, d]``, ``y`` to match). Non-conjugate models fall back
            to the data they stored.
        num_draws: exact draws for conjugate models (one chain).
        feature_names: names of the ``d`` features (coordinates of the ``w`` dimension).
        seed: seed of the exact draws and of the predictive noise.

    Returns:
        InferenceData with ``posterior`` (``w`` with dims ``(chain, draw, *batch, feature)``
        and ``noise_var`` when the noise has a prior), ``sample_stats`` for NUTS, and
        ``observed_data`` / ``posterior_predictive`` (``y``) when data is known.
    """
    import arviz as az

    from .models import BayesianLinear, PerArmLinear

    if hasattr(model, "to_inference_data") and not isinstance(model, (BayesianLinear, PerArmLinear)):
        return model.to_inference_data(X=X, y=y, num_draws=num_draws, seed=seed)
    arms = None
    if isinstance(model, PerArmLinear):
        arms, model = model.num_arms, model.arms
    if not isinstance(model, BayesianLinear):
        raise TypeError(
            f"model: no InferenceData converter for {type(model).__name__}; expected BayesianLinear, "
            "PerArmLinear or a model with a to_inference_data method"
        )
    if int(num_draws) < 1:
        raise ValueError(f"num_draws: expected a positive int, got {num_draws!r}")
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
    coords = {"feature": features}
    if arms is not None:
        coords["arm"] = list(range(arms))
    groups = {"posterior": posterior}
    if sample_stats:
        groups["sample_stats"] = sample_stats
    if X is not None and y is not None:
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
    return az.from_dict(**groups, coords=coords, dims=dims)


def summary(idata, var_names: Sequence[str] | None = None, hdi_prob: float = 0.94):
    """ArviZ summary table (mean, sd, HDI, ESS and r-hat where chains exist) as a DataFrame."""
    import arviz as az

    return az.summary(idata, var_names=var_names, hdi_prob=hdi_prob)


def prior_predictive(prior, X, *, noise_std: float | None = None, noise_prior=None, num_draws: int = 500,
                     seed: int = 0, feature_names: Sequence[str] | None = None):
    """Prior and prior-predictive draws for a custom prior, before any data (``prior`` and
    ``prior_predictive`` groups). Check that outcomes it implies at ``X [n, d]`` are plausible.

    ``prior`` is what :class:`~bayes_safe.models.BayesianLinear` accepts: a distribution with
    event shape ``[d]`` or a callable Pyro model returning ``w``. A prior whose support does not
    match the weights (draws that are not finite real vectors of width ``d``) is rejected.
    """
    import arviz as az

    from .models.pyro_inference import PyroLinearPosterior

    X = torch.as_tensor(X, dtype=torch.float64)
    if X.dim() != 2:
        raise ValueError(f"X: expected shape [n, d], got {list(X.shape)}")
    d = X.shape[-1]
    if isinstance(prior, torch.distributions.Distribution):
        if prior.event_shape != (d,):
            raise ValueError(f"prior: event shape {list(prior.event_shape)} does not match the {d} features of X")
        if not isinstance(prior.support, torch.distributions.constraints.independent) or \
                prior.support.base_constraint is not torch.distributions.constraints.real:
            if prior.support is not torch.distributions.constraints.real_vector:
                raise ValueError(
                    f"prior: its support is {prior.support}, but linear weights take any real value; "
                    "use a prior on R^d (e.g. Normal, Laplace, StudentT, MultivariateNormal)"
                )
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
    edges, count, conf, acc = _bins(p, y, int(num_bins))
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


class PosteriorRecorder:
    """A ``simulate`` callback recording each model's posterior mean and sd every ``every`` steps.

    Example:
        >>> rec = PosteriorRecorder(every=50)
        >>> trace = simulate(policy, env, 500, seed=0, callback=rec)   # doctest: +SKIP
        >>> rec.to_dataframe()                                         # doctest: +SKIP
    """

    def __init__(self, every: int = 10):
        if int(every) < 1:
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
            mean = model.posterior_mean
            cov = model.posterior_covariance if getattr(model, "conjugate", getattr(getattr(model, "arms", None), "conjugate", False)) else None
            sd = cov.diagonal(dim1=-2, dim2=-1).sqrt() if cov is not None else torch.full_like(mean, float("nan"))
            self.means.setdefault(role, []).append(mean.clone())
            self.sds.setdefault(role, []).append(sd.clone())

    def to_dataframe(self):
        """Long format: step, model role, replication, feature, posterior mean and sd."""
        import pandas as pd

        frames = []
        for role in self.means:
            m = torch.stack(self.means[role])  # [n_steps, R, d]
            s = torch.stack(self.sds[role])
            n, *rest = m.shape
            idx = np.array(np.meshgrid(*[np.arange(k) for k in (n, *rest)], indexing="ij")).reshape(len(m.shape), -1)
            frames.append(pd.DataFrame({
                "step": np.asarray(self.steps)[idx[0]], "model": role,
                "replication": idx[1] if len(rest) > 1 else 0, "feature": idx[-1],
                "mean": _np(m).reshape(-1), "sd": _np(s).reshape(-1),
            }))
        return pd.concat(frames, ignore_index=True)


# ---------------------------------------------------------------------------- saving and reports
def save_models(policy, directory) -> list[Path]:
    """Save every model of ``policy`` to ``directory/<role>.pt`` (``torch.save`` of the object).

    Files are pickles: load only files you wrote yourself (:func:`load_models`).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for role, model in policy.models().items():
        path = directory / f"{role}.pt"
        torch.save(model, path)
        paths.append(path)
    return paths


def load_models(directory) -> dict[str, object]:
    """The models saved by :func:`save_models`, by role. Raises if there are none."""
    directory = Path(directory)
    files = sorted(directory.glob("*.pt")) if directory.is_dir() else []
    if not files:
        raise FileNotFoundError(
            f"{directory}: no saved models (*.pt); runs write them to RUN_DIR/models/ "
            "(bayes-safe simulate and the studies do)"
        )
    return {f.stem: torch.load(f, weights_only=False) for f in files}


def _png_base64(fig) -> str:
    from .plots import plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def diagnose_run(run_dir, *, num_draws: int = 500, max_batch: int = 4) -> Path:
    """Write ``run_dir/diagnostics/``: ``report.html`` (figures embedded) and one NetCDF per model.

    For batched models (replications), the report shows the first ``max_batch`` batch elements.
    """
    import arviz as az

    from .io import atomic_output_dir, atomic_write_text
    from .plots import plt

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"RUN_DIR: {run_dir} is not a directory")
    models = load_models(run_dir / "models")
    sections = []
    with atomic_output_dir(run_dir / "diagnostics") as tmp:
        for role, model in models.items():
            idata = to_inference_data(model, num_draws=num_draws)
            idata.to_netcdf(str(tmp / f"{role}.nc"), engine="h5netcdf")
            post = idata.posterior
            sel = {dim: slice(0, max_batch) for dim in post.dims if dim.startswith("batch") or dim == "arm"}
            small = post.isel(**sel)
            table = az.summary(small, kind="stats" if post.sizes.get("chain", 1) == 1 else "all")
            axes = az.plot_posterior(small, var_names=["w"])
            fig = np.ravel(axes)[0].figure
            img = _png_base64(fig)
            sections.append(
                f"<h2>{role}</h2><p>{type(model).__name__}; {post.sizes.get('chain', 1)} chain(s) x "
                f"{post.sizes.get('draw', 0)} draws</p>{table.to_html(float_format=lambda v: f'{v:.4g}')}"
                f'<img alt="posterior of {role}" src="data:image/png;base64,{img}"/>'
            )
            if post.sizes.get("chain", 1) > 1 or "sample_stats" in idata.groups():
                fig = np.ravel(az.plot_trace(small, var_names=["w"]))[0].figure
                sections.append(f'<img alt="trace of {role}" src="data:image/png;base64,{_png_base64(fig)}"/>')
            plt.close("all")
        html = (
            "<!doctype html><html><head><meta charset='utf-8'><title>bayes_safe diagnostics</title>"
            "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse;font-size:12px}"
            "td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}</style></head><body>"
            f"<h1>Posterior diagnostics: {run_dir.name}</h1>" + "".join(sections) + "</body></html>"
        )
        atomic_write_text(tmp / "report.html", html)
    return run_dir / "diagnostics" / "report.html"


