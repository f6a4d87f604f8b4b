"""Have the chains mixed? ``convergence_warnings``: one line a user reads per variable that fails.

A posterior summary from chains that have not mixed is not the posterior: the usual thresholds
(Vehtari, Gelman, Simpson, Carpenter & Buerkner 2021, "Rank-normalization, folding, and
localization: an improved R-hat for assessing convergence of MCMC", Bayesian Analysis 16(2),
Sec. 4 and 6) are a rank-normalised split r-hat of at most 1.01 and a bulk and tail effective
sample size of at least 100 (for 4 chains) for every quantity reported. ``convergence_warnings``
checks every variable of an ``InferenceData``'s posterior (weights, scales, noise, every batch
element and feature) and says, per variable, how many of its values fail and which are worst:

    warning: tau r-hat 1.28 > 1.01, bulk ESS 12 < 100: the chains have not mixed; ...
    warning: w: 64 of 90 values fail (r-hat > 1.01 or ESS < 100); worst: w[x3] r-hat 1.21, ...

``summary`` (in ``conversion``) and ``diagnose_run`` / ``bayes-safe diagnose`` (in ``report``)
show these lines. ArviZ is imported inside the function.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["ESS_MIN", "RHAT_MAX", "ConvergenceWarning", "convergence_warnings", "independent_draws"]

#: largest acceptable rank-normalised split r-hat (Vehtari et al. 2021, Sec. 4)
RHAT_MAX = 1.01
#: smallest acceptable bulk and tail effective sample size (Vehtari et al. 2021, Sec. 4)
ESS_MIN = 100.0

ADVICE = ("the chains have not mixed; run longer (more draws: `diagnose --draws`, `to_inference_data(num_draws=)`, "
          "or more burn-in) before trusting these values")


class ConvergenceWarning(UserWarning):
    """Some posterior values have an r-hat above ``RHAT_MAX`` or a bulk / tail ESS below ``ESS_MIN``."""


def _label(name: str, dims: Sequence[str], coords: dict, index: tuple) -> str:
    if not dims:
        return name
    parts = []
    for dim, i in zip(dims, index):
        values = coords.get(dim)
        value = values[i] if values is not None else i
        parts.append(f"{value}" if dim in ("feature", "arm", "point") else f"{dim}={value}")
    return f"{name}[{', '.join(parts)}]"


def _failures(rhat: float, bulk: float, tail: float, rhat_max: float, ess_min: float) -> list[str]:
    out = []
    if math.isfinite(rhat) and rhat > rhat_max:
        out.append(f"r-hat {rhat:.3g} > {rhat_max:g}")
    if math.isfinite(bulk) and bulk < ess_min:
        out.append(f"bulk ESS {bulk:.0f} < {ess_min:.0f}")
    if math.isfinite(tail) and tail < ess_min:
        out.append(f"tail ESS {tail:.0f} < {ess_min:.0f}")
    return out


#: ``attrs["inference"]`` / ``attrs["model"]`` of the ``to_inference_data`` conversions whose draws are
#: independent (exact conjugate draws, an SVI guide's, a GP's posterior): no chain, nothing to mix
_INDEPENDENT = {"conjugate", "svi"}


def independent_draws(idata) -> bool:
    """Whether ``idata``'s draws are independent draws of the posterior (conjugate, SVI, probit GP),
    as ``to_inference_data`` marks them in ``attrs``, rather than a Markov chain's (Gibbs, Langevin,
    NUTS). Their r-hat and ESS only measure Monte-Carlo noise: with hundreds of values a few
    r-hats above 1.01 are expected by chance, so ``convergence_warnings`` does not check them."""
    for attrs in (getattr(idata, "attrs", None), getattr(getattr(idata, "posterior", None), "attrs", None)):
        if attrs and (attrs.get("inference") in _INDEPENDENT or attrs.get("model") == "ProbitGP"):
            return True
    return False


def convergence_warnings(idata, *, rhat_max: float = RHAT_MAX, ess_min: float = ESS_MIN,
                         var_names: Sequence[str] | None = None, worst: int = 3) -> list[str]:
    """One ``"warning: ..."`` line per posterior variable with a value that fails the mixing checks.

    Checks every value (each batch element, feature, arm) of every variable in ``idata.posterior``
    (or ``var_names``): the rank-normalised split r-hat (``az.rhat``, only with 2 or more chains)
    against ``rhat_max`` and the bulk and tail ESS (``az.ess``) against ``ess_min``. A variable
    of one value gets ``warning: tau r-hat 1.28 > 1.01, bulk ESS 12 < 100: the chains have not
    mixed; ...``; a variable of many says how many of its values fail and names the ``worst``
    (largest r-hat, then smallest ESS) with their figures. Values whose checks are undefined
    (constant draws: NaN) are not flagged, nor are independent draws (``independent_draws``:
    conjugate, SVI and probit GP posteriors have no chain to mix).

    Args:
        idata: an ``arviz.InferenceData`` (or anything with a ``posterior`` dataset of ``(chain,
            draw, ...)`` variables), e.g. from ``to_inference_data``.
        rhat_max: the largest acceptable r-hat (1.01).
        ess_min: the smallest acceptable bulk and tail ESS (100).
        var_names: the variables to check (default: all of the posterior).
        worst: how many failing values of a variable to name.

    Returns:
        the lines, empty when everything passes.

    Raises:
        ValueError: ``idata`` has no posterior group, or ``var_names`` names a variable it lacks.
    """
    import warnings

    import arviz as az

    post = getattr(idata, "posterior", None)
    if post is None:
        raise ValueError("idata: no posterior group to check")
    names = list(post.data_vars) if var_names is None else list(var_names)
    missing = [n for n in names if n not in post]
    if missing:
        raise ValueError(f"var_names: {missing} not in the posterior (it has {list(post.data_vars)})")
    if not names or post.sizes.get("draw", 0) < 4 or independent_draws(idata):
        return []
    view = post[names]
    chains = post.sizes.get("chain", 1)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        rhat = az.rhat(view) if chains > 1 else None
        bulk = az.ess(view, method="bulk")
        tail = az.ess(view, method="tail")
    lines = []
    for name in names:
        dims = [d for d in post[name].dims if d not in ("chain", "draw")]
        b = np.asarray(bulk[name].transpose(*dims).values, dtype=float)
        t = np.asarray(tail[name].transpose(*dims).values, dtype=float)
        r = (np.asarray(rhat[name].transpose(*dims).values, dtype=float) if rhat is not None
             else np.full(b.shape, np.nan))
        bad = ((np.nan_to_num(r, nan=0.0) > rhat_max) | (np.nan_to_num(b, nan=np.inf) < ess_min)
               | (np.nan_to_num(t, nan=np.inf) < ess_min))
        count = int(bad.sum())
        if not count:
            continue
        coords = {d: [str(v) for v in post[d].values] for d in dims if d in post.coords}
        if b.size == 1:
            text = ", ".join(_failures(float(r.flat[0]), float(b.flat[0]), float(t.flat[0]), rhat_max, ess_min))
            lines.append(f"warning: {name} {text}: {ADVICE}")
            continue
        flat = np.flatnonzero(bad.reshape(-1))
        # worst first: largest r-hat, then smallest of the two ESS
        key = np.lexsort((np.minimum(b, t).reshape(-1)[flat], -np.nan_to_num(r, nan=0.0).reshape(-1)[flat]))
        named = []
        for i in flat[key][: max(int(worst), 0)]:
            index = np.unravel_index(i, b.shape)
            figures = _all_figures(float(r[index]), float(b[index]), float(t[index]))
            named.append(f"{_label(name, dims, coords, index)} {figures}")
        what = " x ".join(f"{d} {post.sizes[d]}" for d in dims)
        lines.append(f"warning: {name}: {count} of {b.size} values ({what}) have r-hat > {rhat_max:g} or bulk/tail "
                     f"ESS < {ess_min:.0f}; worst: {'; '.join(named)}: {ADVICE}")
    return lines


def _all_figures(rhat: float, bulk: float, tail: float) -> str:
    parts = [] if not math.isfinite(rhat) else [f"r-hat {rhat:.3g}"]
    return ", ".join(parts + [f"bulk ESS {bulk:.0f}", f"tail ESS {tail:.0f}"])
