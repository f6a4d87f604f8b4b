"""``diagnose_run`` (``bayes-safe diagnose RUN_DIR``): an HTML report and one NetCDF per saved posterior.

The private helpers build the report's sections: per model an ArviZ summary table, PSIS-LOO,
the posterior of the weights, the trace, a posterior predictive check, the calibration of 0/1
linear models, and for the probit GP the success probability with its calibration. ArviZ and matplotlib are imported
inside the functions that draw.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import numpy as np

from .._validation import check_positive_int
from ._common import _converter, _underlying
from .calibration import brier_score, expected_calibration_error, reliability_diagram
from .convergence import ConvergenceWarning, convergence_warnings
from .conversion import ACCEPTED_MODELS, to_inference_data
from .persistence import load_models

__all__ = ["diagnose_run"]

_MAX_ROWS = 500  # stored rows of a linear model in its data groups (as the probit GP's max_points)


def _png_base64(fig) -> str:
    from ..plots import plt

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
        key = "batch" if dim.startswith("batch") else dim
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


def _warnings_html(lines: list[str]) -> str:
    """The mixing warnings of one model (``convergence_warnings``), or the line that says it passed."""
    if not lines:
        return ("<p>Mixing: no value of a chain has r-hat &gt; 1.01 or bulk or tail ESS &lt; 100 (independent "
                "draws, conjugate, SVI and probit GP, have no chain to check).</p>")
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return f'<div class="warn"><p><strong>The chains have not mixed:</strong></p><ul>{items}</ul></div>'


def _model_section(name: str, keys: list[str], views: list, idata, show_batch: int, seed: int,
                   mixing: list[str] | None = None) -> str:
    import arviz as az

    from ..plots import plt

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
    if "rows" in idata.attrs:
        info.append(f"data groups of {html.escape(str(idata.attrs['rows']))}")
    if "constant_data" in idata.groups() and "num_observations" in idata.constant_data:
        n_obs = idata.constant_data["num_observations"]
        info.append(f"observations per arm: min {int(n_obs.min())}, median {float(n_obs.median()):.0f}, "
                    f"max {int(n_obs.max())}")
    if "sample_stats" in idata.groups() and "diverging" in idata.sample_stats:
        info.append(f"divergent transitions: {int(idata.sample_stats['diverging'].sum())}")
    if "sample_stats" in idata.groups() and "acceptance_rate" in idata.sample_stats:
        info.append(f"mean acceptance rate: {float(idata.sample_stats['acceptance_rate'].mean()):.2f}")
    info.append(_loo_text(idata))
    out = [f'<h2 id="{html.escape(name)}">{html.escape(name)}</h2>', "<p>" + "; ".join(info) + ".</p>",
           f"<p>NetCDF: <code>{html.escape(name)}.nc</code></p>", _warnings_html(mixing or []),
           _summary_html(idata, show_batch)]
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
        first = {d: 0 for d in idata.observed_data.dims if d.startswith("batch")}
        pp = idata.isel(**first) if first else idata
        axes = az.plot_ppc(pp, num_pp_samples=50, random_seed=int(seed))
        out.append("<p>Posterior predictive check: the observed outcomes against 50 replicated data sets.</p>")
        out.append(_img(np.ravel(axes)[0].figure, f"posterior predictive check of {name}"))
        if idata.attrs.get("likelihood") in ("probit", "logistic") and "log_likelihood" in idata.groups():
            out.append(_binary_linear_section(name, idata))
    plt.close("all")
    return "\n".join(out)


def _probit_section(name: str, idata) -> str:
    """The success probability at the points and, with outcomes, a reliability diagram, Brier score and ECE."""
    from ..plots import plt

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
        out.append(_calibration_html(name, mean, y, "the stored outcomes"))
    return "\n".join(out)


def _calibration_html(name: str, mean: np.ndarray, y: np.ndarray, what: str) -> str:
    """A reliability diagram, Brier score and ECE of the predicted success probabilities ``mean`` against 0/1 ``y``."""
    from ..plots import plt

    brier = brier_score(mean, y)
    ece = expected_calibration_error(mean, y)
    base = brier_score(np.full_like(mean, y.mean()), y)
    fig = reliability_diagram(mean, y, title=f"Reliability diagram: {name}")
    text = (f"<p>Calibration of the posterior mean success probability against {what} (in sample: the model was "
            f"fitted on them): Brier score {brier:.4f} (a constant at the base rate {float(y.mean()):.3f}: "
            f"{base:.4f}), expected calibration error {ece:.4f} over 10 bins.</p>")
    img = _img(fig, f"reliability diagram of {name}")
    plt.close(fig)
    return text + img


def _binary_linear_section(name: str, idata) -> str:
    """Calibration of a 0/1 ``BayesianLinear`` (probit or logistic): its posterior mean success
    probability at each observation (from the pointwise likelihood: ``p`` where ``y = 1``, ``1 - p``
    where ``y = 0``) against the observed outcomes, every batch element in the file pooled."""
    y = idata.observed_data["y"]
    like = np.exp(idata.log_likelihood["y"])
    p = like.where(y == 1, 1.0 - like).mean(("chain", "draw"))
    link = "Phi(x^T w)" if idata.attrs.get("likelihood") == "probit" else "sigmoid(x^T w)"
    what = f"the {y.size} stored 0/1 outcomes in the file (predicted probability {link})"
    return _calibration_html(name, np.clip(p.values.reshape(-1), 0.0, 1.0), y.values.reshape(-1), what)


def _loo_text(idata) -> str:
    """PSIS-LOO (``az.loo``) of the pointwise log-likelihood, or why there is none."""
    import warnings

    import arviz as az

    if "log_likelihood" not in idata.groups():
        why = str(idata.attrs.get("log_likelihood", "no observed data"))
        return f"no log-likelihood ({html.escape(why)}), so no PSIS-LOO"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loo = az.loo(idata, pointwise=True)
    bad = int((np.asarray(loo.pareto_k) > 0.7).sum())
    return (f"PSIS-LOO elpd {float(loo.elpd_loo):.1f} (se {float(loo.se):.1f}), p_loo {float(loo.p_loo):.1f}, "
            f"{bad} observation(s) with Pareto k &gt; 0.7")


def diagnose_run(run_dir, *, num_draws: int = 500, max_batch: int | None = 10, show_batch: int = 4,
                 seed: int = 0, allow_imports: bool = False, on_warning=None) -> Path:
    """Write ``run_dir/diagnostics/``: ``report.html`` (figures embedded) and one NetCDF per model.

    ``run_dir`` is any directory with a ``models/`` subdirectory written by ``save_models`` (the
    portable state format: nothing in it is executed):
    a ``bayes-safe simulate`` output or a study's output directory. Every saved posterior is
    converted by ``to_inference_data`` (views of one posterior once, named
    ``<prefix>__<role1>+<role2>``; features named as saved with the model,
    ``BayesianLinear(feature_names=...)``, else ``x0, x1, ...``) and written as ``<name>.nc``; the report has, per model, the
    ArviZ summary (with ESS and r-hat over the chains), PSIS-LOO when the observed data are
    known, the posterior of the weights, the trace, a posterior predictive check when data were
    stored, for a 0/1 ``BayesianLinear`` (probit or logistic likelihood) a reliability diagram,
    Brier score and ECE of its predicted success probability against its stored outcomes, and
    for the probit GP the success probability at the stored points with the same calibration.
    The data groups (and PSIS-LOO) of a linear model that stored its rows use at most 500 of
    them, evenly spaced (the report says so), as the probit GP's use at most 500 points. Saved models that are not
    posteriors (e.g. a trained policy network) are listed as skipped.

    Every model's draws are checked for mixing (``convergence_warnings``: r-hat <= 1.01, bulk and
    tail ESS >= 100 for every variable, weights and scales): each variable that fails gives a line
    ``warning: <model>: tau r-hat 1.28 > 1.01, bulk ESS 12 < 100: the chains have not mixed; ...``
    (for a variable of many values, how many fail and the worst named), shown at the top of the
    report and in the model's section, and passed to ``on_warning`` (default: issued as a
    ``ConvergenceWarning``).

    Args:
        run_dir: the run's output directory.
        num_draws: draws per chain (``to_inference_data``'s default of 4 chains) for exact
            posteriors, Gibbs and Langevin chains (NUTS and SVI keep their stored draws).
        max_batch: keep the first ``max_batch`` batch elements (replications) of batched models
            in the NetCDF files; ``None`` keeps all.
        show_batch: batch elements shown in the report's tables (figures show the first).
        seed: seed of the draws.
        allow_imports: import the modules of custom priors saved as ``module:function`` (runs
            their code; by default nothing from ``run_dir`` is imported or executed).
        on_warning: called with each mixing warning line (``bayes-safe diagnose`` prints them);
            ``None`` issues each as a ``ConvergenceWarning``.

    Returns:
        the path of ``report.html``.

    Raises:
        FileNotFoundError: ``run_dir`` is not a directory or has no saved models (naming the
            reason a run recorded with ``save_no_models``).
        TypeError: no saved model has an InferenceData converter (naming the types found).
        ValueError: a model file is in the old pickle format or is not a valid saved state
            (``bayes_safe.state.StateError``); the message names the file, and nothing is loaded.
    """
    from ..io import atomic_output_dir, atomic_write_text, check_free_space

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"RUN_DIR: {run_dir} is not a directory")
    num_draws = check_positive_int(num_draws, "num_draws")
    max_batch = check_positive_int(max_batch, "max_batch", allow_none=True)
    show_batch = check_positive_int(show_batch, "show_batch")
    models = load_models(run_dir / "models", allow_imports=allow_imports)
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
    sections, index, mixing_lines = [], [], []
    with atomic_output_dir(run_dir / "diagnostics", replace=True) as tmp:
        for keys in convertible:
            name = _group_name(keys)
            model = models[keys[0]]
            idata = to_inference_data(model, num_draws=num_draws, seed=seed, max_batch=max_batch, max_rows=_MAX_ROWS)
            # h5py crashes the interpreter on a failed write (a full disk): check the space first
            size = sum(int(idata[group].nbytes) for group in idata.groups()) + 65536 * len(idata.groups())
            check_free_space(tmp, size, what=f"{name}.nc")
            idata.to_netcdf(str(tmp / f"{name}.nc"), engine="h5netcdf")
            lines = [line.replace("warning: ", f"warning: {name}: ", 1) for line in convergence_warnings(idata)]
            mixing_lines.extend(lines)
            sections.append(_model_section(name, keys, [models[k] for k in keys], idata, show_batch, seed, lines))
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
            "td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}.warn{background:#fff3cd;padding:4px 10px}</style></head><body>"
            f"<h1>Posterior diagnostics: {html.escape(run_dir.name)}</h1>"
            f"<p>{len(convertible)} posterior(s) from <code>{html.escape(str(run_dir / 'models'))}</code>, "
            f"{num_draws} draws per chain (exact posteriors, Gibbs and Langevin chains), seed {seed}.</p><ul>{''.join(index)}</ul>{skipped_html}"
            + (_warnings_html(mixing_lines) if mixing_lines else "")
            + "".join(sections) + "</body></html>"
        )
        atomic_write_text(tmp / "report.html", page)
    for line in mixing_lines:
        if on_warning is None:
            import warnings

            warnings.warn(line, ConvergenceWarning, stacklevel=2)
        else:
            on_warning(line)
    return run_dir / "diagnostics" / "report.html"
