"""Confidence intervals by betting for off-policy means of bounded metrics (rare harms included).

Why not the bootstrap: an adverse event at a rate of 1 % under a target policy whose actions the log
played 5 % of the time leaves tens of matched rows and often no event among them. The percentile
bootstrap then resamples zeros and returns ``[0, 0]``; with one or two events it is far too narrow
and its normal cousins (the delta method, the served mean's ``+- 1.96 sd / sqrt(n)``) leave
``[0, 1]``. Measured in ``benchmarks/rare_harm.py``: 2,000 rows, rate 1 %, the bootstrap's 95 %
intervals of IPS and SNIPS cover the true rate in about two logs out of three.

What this module does instead: a confidence interval made of the values ``m`` that a **betting
test** does not reject (Waudby-Smith & Ramdas 2024, "Estimating means of bounded random variables by
betting", JRSS-B 86(1); the hedged-capital interval of their section 4, at a fixed sample size), in
the off-policy form of Karampatziakis, Mineiro & Ramdas 2021 ("Off-policy confidence sequences",
ICML) and Waudby-Smith, Wu, Ramdas, Karampatziakis & Mineiro 2022 ("Anytime-valid off-policy
inference for contextual bandits"): every estimator is the root ``m`` of ``sum_i g_i(m) = 0`` with
``g_i(m) = a_i - m b_i`` (IPS: ``a = w r, b = 1``; SNIPS: ``a = w r, b = w``; DR: ``a`` the DR term,
``b = 1``; a ratio of two policies: ``a = w r, b = w_ref r``), and under the hypothesis "the true
value is ``m``" the terms ``g_i(m)`` have mean 0. A gambler who starts with 1 and stakes a fraction
``lambda_i`` of her wealth on each row, chosen before she sees it, holds ``K(m) = prod_i (1 +
lambda_i g_i(m))``: a non-negative martingale of mean 1 under the hypothesis, so by Markov's
inequality ``P(K(m) >= 1 / alpha) <= alpha``. The interval is ``{m : K(m) < 1 / alpha}``, one
gambler betting up (``lambda >= 0``, the lower bound) and one betting down (the upper bound), each at
``alpha / 2`` (or one of them at ``alpha``: a one-sided bound, e.g. the upper bound of a harm).

Why this one (among the choices for rare events):

* it holds at every sample size and every rate (no normal approximation): coverage is at least
  nominal by construction, and the interval shrinks like an empirical-Bernstein one, by the
  observed variance, not by the range;
* it never leaves the metric's bounds (only values ``m`` inside them are tested) and is never of
  zero width when the metric can be reached: with no event among the matched rows the upper bound
  is about ``log(1 / alpha)`` over the matched rows, what Clopper-Pearson gives for zero successes;
* one construction serves IPS, SNIPS, DR and ratios (Clopper-Pearson on an effective sample size,
  the other candidate, has no guarantee when the weights vary, and none for DR or a ratio).

What it assumes: rows exchangeable (independent draws of the logging policy; the rows are betted on in a
seeded random order), propensities right, and the **range of every term** known. A term ``w r``
lies in ``[0, w_max r_max]``: ``w_max``, the largest importance weight of the target, is given by
the caller (``bayes_safe.offline.estimators.max_weight``: by default the largest weight of a logged
row; the worst case over the logged contexts, or a known floor's ``1 / epsilon``, on request). Only the upper side of IPS needs it: the lower gambler of a non-negative
term can lose at most her stake.

The stakes (section 3 of Waudby-Smith & Ramdas, "predictable plug-in" at a fixed ``n``):
``lambda_i = min(sqrt(2 log(1 / alpha_side) / (n s_i^2)), c / |range side of g_i(m)|)`` with ``s_i^2``
the running mean of ``g_j(m)^2`` over the rows before ``i`` (its mean-0 variance under the
hypothesis), started at the largest variance a mean-0 term in that range can have (one pseudo-row),
and ``c = 1/2``. Any predictable stakes keep the guarantee; these make the interval short.

Shapes: ``a``, ``b`` are ``[..., n]`` (leading dimensions: independent logs, e.g. 200 simulated
logs at once); bounds and ranges are scalars or ``[...]``. Cost: about 30 bisection steps, each a
handful of passes over ``[..., n]`` (200 logs of 2,000 rows: well under a second per estimator).
"""

from __future__ import annotations

import math

import torch

__all__ = ["BettingInterval", "betting_interval", "dr_interval", "interval_se", "ips_interval", "ratio_interval",
           "snips_interval"]

#: the bet's cap: at most this share of the wealth can be lost on one row. Waudby-Smith & Ramdas use 1/2 or
#: 3/4; at rare rates the cap binds (the best bet on "no event" is nearly all-in), and on the 2,000-row logs of
#: benchmarks/rare_harm.py 0.9 gives 95 % intervals a third shorter than 1/2 (0.069 against 0.104 at 1 %)
#: for 6 % longer ones at 20,000 rows
MAX_STAKE = 0.9
#: bisection steps per bound: 2^-32 of the search range
STEPS = 32
SIDES = ("two-sided", "upper", "lower")


def _as(x, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.float64).to(like.device)


class BettingInterval:
    """The betting test of the module docstring on one table of terms ``g_i(m) = a_i - m b_i``.

    Args:
        a, b: ``[..., n]`` per-row terms (``b >= 0``; None: ones, a plain mean of ``a``).
        g_low, g_high: the range of ``g_i(m)`` as affine functions of ``m``: ``(intercept, slope)`` pairs
            (scalars or ``[...]``), ``g_low(m) <= g_i(m) <= g_high(m)`` for every row the log could hold.
        seed: of the order in which rows are betted on (a permutation shared by the leading dimensions).
    """

    def __init__(self, a: torch.Tensor, b: torch.Tensor | None, g_low, g_high, *, seed: int = 0):
        a = torch.as_tensor(a, dtype=torch.float64)
        if a.dim() < 1 or a.shape[-1] < 1:
            raise ValueError(f"a: expected per-row terms [..., n] with n >= 1, got shape {list(a.shape)}")
        b = torch.ones_like(a) if b is None else torch.as_tensor(b, dtype=torch.float64).expand_as(a)
        order = torch.randperm(a.shape[-1], generator=torch.Generator().manual_seed(int(seed)))
        self.a, self.b = a[..., order], b[..., order]
        self.n = a.shape[-1]
        self.lo0, self.lo1 = (_as(v, a) for v in g_low)
        self.hi0, self.hi1 = (_as(v, a) for v in g_high)
        # rows seen before row i, plus the pseudo-row of the starting variance
        self.count = torch.arange(1, self.n + 1, dtype=torch.float64, device=a.device)

    def log_wealth(self, m: torch.Tensor, up: bool, alpha: float) -> torch.Tensor:
        """``[...]`` the log wealth at the end of the log of the gambler betting that the mean is above
        ``m`` (``up``) or below it, at level ``alpha`` (what sizes her stakes)."""
        m = m[..., None]
        g = self.a - m * self.b
        low = -(self.lo0 + self.lo1 * m[..., 0])[..., None]    # how far below 0 a term can go (>= 0)
        high = (self.hi0 + self.hi1 * m[..., 0])[..., None]    # how far above 0
        low, high = low.clamp_min(0.0), high.clamp_min(0.0)
        tiny = 1e-300
        worst = low if up else high
        prior = (low * high).clamp_min(1e-12)                  # the largest variance of a mean-0 term in range
        past = torch.cumsum(g * g, -1) - g * g                 # sum of g_j^2 over the rows before i
        s2 = (prior + past) / self.count
        stake = torch.sqrt(2.0 * math.log(1.0 / alpha) / (self.n * s2))
        stake = torch.minimum(stake, MAX_STAKE / worst.clamp_min(tiny))
        x = g if up else -g
        # a term outside the declared range would make a wealth negative: floored (the caller's ranges hold the data)
        return torch.log1p((stake * x).clamp_min(-1 + 1e-12)).sum(-1)

    def bound(self, estimate: torch.Tensor, search_low, search_high, up: bool, alpha: float) -> torch.Tensor:
        """``[...]`` the lower (``up``) or upper bound at level ``alpha``: the value between the search bound
        and ``estimate`` where the gambler's wealth crosses ``1 / alpha`` (bisection). ``search_high``
        may be ``inf`` (a ratio): the bracket is then doubled until the wealth crosses, else ``inf``."""
        threshold = math.log(1.0 / alpha)
        s_lo = _as(search_low, self.a).expand_as(estimate).clone()
        s_hi = _as(search_high, self.a).expand_as(estimate).clone()
        start = torch.where(torch.isfinite(estimate), torch.maximum(torch.minimum(estimate, s_hi), s_lo), s_lo)
        never = None
        if up:
            far = s_lo
        else:
            far = s_hi.clone()
            open_ = ~torch.isfinite(far)
            if bool(open_.any()):  # a ratio: double a finite bracket until the wealth crosses
                far = torch.where(open_, torch.maximum(2 * start.abs(), torch.ones_like(start)), far)
                for _ in range(80):
                    crossed = self.log_wealth(far, False, alpha) >= threshold
                    grow = open_ & ~crossed
                    if not bool(grow.any()):
                        break
                    far = torch.where(grow, far * 2, far)
                never = open_ & (self.log_wealth(far, False, alpha) < threshold)
        rejected_far = self.log_wealth(far, up, alpha) >= threshold
        inner, outer = start.clone(), far.clone()  # inner: not rejected side; outer: rejected side
        for _ in range(STEPS):
            mid = 0.5 * (inner + outer)
            rej = self.log_wealth(mid, up, alpha) >= threshold
            outer = torch.where(rej, mid, outer)
            inner = torch.where(rej, inner, mid)
        out = torch.where(rejected_far, inner, far)
        if never is not None:
            out = torch.where(never, torch.full_like(out, math.inf), out)
        return out


def betting_interval(a: torch.Tensor, b: torch.Tensor | None, *, g_low, g_high, search, level: float = 0.95,
                     side: str = "two-sided", seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The betting confidence interval of the root ``m`` of ``sum_i (a_i - m b_i) = 0`` (module docstring).

    Args:
        a, b: ``[..., n]`` per-row terms (``b`` None: ones).
        g_low, g_high: ``(intercept, slope)``: the range of ``a_i - m b_i`` as affine functions of ``m``.
        search: ``(low, high)`` the values the estimand can take (a rate: ``(0, 1)``; ``high`` may be inf).
        level: the coverage; side: ``"two-sided"`` (each bound at ``(1 - level) / 2``), ``"upper"`` (a
            one-sided upper bound at ``1 - level``, the lower bound is ``search[0]``) or ``"lower"``.
        seed: of the order the rows are betted in.

    Returns:
        ``(estimate, low, high)``, each ``[...]``; ``estimate = sum a / sum b`` (NaN when ``sum b == 0``:
        no matched row; the interval is then the whole search range).
    """
    if side not in SIDES:
        raise ValueError(f"side: expected one of {list(SIDES)}, got {side!r}")
    if not 0.0 < float(level) < 1.0:
        raise ValueError(f"level: expected a number in (0, 1), got {level!r}")
    from ..threads import single_thread

    test = BettingInterval(a, b, g_low, g_high, seed=seed)
    # many passes over small tensors: one thread (on a shared machine 6x faster than torch's pool)
    with torch.no_grad(), single_thread():
        den = test.b.sum(-1)
        estimate = torch.where(den != 0, test.a.sum(-1) / torch.where(den != 0, den, torch.ones_like(den)),
                               torch.full_like(den, math.nan))
        alpha = 1.0 - float(level)
        a_side = alpha / 2 if side == "two-sided" else alpha
        lo_s = _as(search[0], test.a).expand_as(estimate)
        hi_s = _as(search[1], test.a).expand_as(estimate)
        low = test.bound(estimate, lo_s, hi_s, True, a_side) if side != "upper" else lo_s.clone()
        high = test.bound(estimate, lo_s, hi_s, False, a_side) if side != "lower" else hi_s.clone()
    return estimate, low, high


def interval_se(value, low, high, level: float = 0.95, side: str = "two-sided"):
    """A standard error that matches an asymmetric interval: the larger distance from ``value`` to a finite
    bound over the normal quantile of the level (``value +- z se`` then holds the whole interval), what a
    consumer that wants ``(mean, se)`` (Ax's noise model) is given. Scalars or tensors."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(1 - (1 - float(level)) / (2 if side == "two-sided" else 1))
    if torch.is_tensor(value) or torch.is_tensor(low):
        v, lo, hi = (torch.as_tensor(x, dtype=torch.float64) for x in (value, low, high))
        up = torch.where(torch.isfinite(hi) & (side != "lower"), (hi - v).abs(), torch.zeros_like(v))
        down = torch.where(torch.isfinite(lo) & (side != "upper"), (v - lo).abs(), torch.zeros_like(v))
        return torch.maximum(up, down) / z
    up = abs(high - value) if math.isfinite(high) and side != "lower" else 0.0
    down = abs(value - low) if math.isfinite(low) and side != "upper" else 0.0
    return max(up, down) / z


# ---------------------------------------------------------------------- the estimators' terms and ranges
def _w_r(w, r):
    w = torch.as_tensor(w, dtype=torch.float64)
    r = torch.as_tensor(r, dtype=torch.float64).expand_as(w)
    return w, r


def _check_bounds(bounds) -> tuple[float, float]:
    lo, hi = (float(v) for v in bounds)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"bounds: expected finite (low, high) with low < high, got {tuple(bounds)}")
    return lo, hi


def ips_interval(w, r, *, w_max, bounds=(0.0, 1.0), level: float = 0.95, side: str = "two-sided", seed: int = 0):
    """IPS ``mean(w r)`` with its betting interval. ``w``, ``r``: ``[..., n]`` weights and outcomes;
    ``w_max``: the largest weight the target can reach (scalar or ``[...]``); ``bounds``: the outcome's
    known range (a rate: ``(0, 1)``). Returns ``(estimate, low, high)``, each ``[...]``."""
    w, r = _w_r(w, r)
    lo, hi = _check_bounds(bounds)
    w_max = torch.as_tensor(w_max, dtype=torch.float64)
    a_lo, a_hi = torch.clamp(w_max * lo, max=0.0), torch.clamp(w_max * hi, min=0.0)
    _, low, high = betting_interval(w * r, None, g_low=(a_lo, -1.0), g_high=(a_hi, -1.0), search=(lo, hi),
                                    level=level, side=side, seed=seed)
    return (w * r).mean(-1), low, high


def snips_interval(w, r, *, w_max, bounds=(0.0, 1.0), level: float = 0.95, side: str = "two-sided", seed: int = 0):
    """Self-normalised IPS ``sum(w r) / sum(w)`` with its betting interval (the terms ``w (r - m)``,
    Karampatziakis et al. 2021); arguments as ``ips_interval``. No matched row (``sum w == 0``): NaN
    and the whole of ``bounds``."""
    w, r = _w_r(w, r)
    lo, hi = _check_bounds(bounds)
    w_max = torch.as_tensor(w_max, dtype=torch.float64)
    return betting_interval(w * r, w, g_low=(w_max * lo, -w_max), g_high=(w_max * hi, -w_max), search=(lo, hi),
                            level=level, side=side, seed=seed)


def dr_interval(terms, *, term_range, bounds=(0.0, 1.0), level: float = 0.95, side: str = "two-sided",
                seed: int = 0):
    """Doubly robust ``mean(terms)`` with its betting interval; ``terms [..., n]`` the per-row DR terms
    ``sum_a pi(a|x) q(x, a) + w (r - q(x, a_logged))`` and ``term_range = (low, high)`` (scalars or
    ``[...]``) what they can be for the logged contexts (the caller's bound from ``w_max`` and ``q``)."""
    terms = torch.as_tensor(terms, dtype=torch.float64)
    lo, hi = _check_bounds(bounds)
    t_lo, t_hi = (torch.as_tensor(v, dtype=torch.float64) for v in term_range)
    return betting_interval(terms, None, g_low=(t_lo, -1.0), g_high=(t_hi, -1.0), search=(lo, hi), level=level,
                            side=side, seed=seed)


def ratio_interval(w, w_ref, r, *, w_max, w_ref_max, r_max: float = 1.0, level: float = 0.95,
                   side: str = "two-sided", seed: int = 0):
    """The ratio ``sum(w r) / sum(w_ref r)`` of a non-negative outcome's mean under two policies (the
    target's weights ``w``, the reference's ``w_ref``, both ``[..., n]``) with its betting interval
    (terms ``w r - rho w_ref r``); ``r`` in ``[0, r_max]``. The upper bound may be inf (the reference's
    mean cannot be told from 0)."""
    w, r = _w_r(w, r)
    w_ref = torch.as_tensor(w_ref, dtype=torch.float64).expand_as(w)
    w_max = torch.as_tensor(w_max, dtype=torch.float64)
    w_ref_max = torch.as_tensor(w_ref_max, dtype=torch.float64)
    return betting_interval(w * r, w_ref * r, g_low=(torch.zeros_like(w_max), -w_ref_max * float(r_max)),
                            g_high=(w_max * float(r_max), torch.zeros_like(w_max)), search=(0.0, math.inf),
                            level=level, side=side, seed=seed)
