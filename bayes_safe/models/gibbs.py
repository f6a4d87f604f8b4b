"""Warm-started Gibbs samplers for linear models: scale-mixture priors and 0/1 outcomes.

``GibbsLinearPosterior`` is the engine ``BayesianLinear`` picks for priors that are Gaussian
*scale mixtures*: given per-weight prior variances ``v`` the prior is ``w ~ N(m0, diag(v))``,
so the weights given everything else are Gaussian (the precision / Cholesky machinery of the
conjugate path), and the variances given the weights have closed-form conditionals
(equation numbers are not quoted where we could not check them; the formulas are written out):

* ``Laplace(m, b)`` (Park & Casella 2008, Sec. 2, the Bayesian lasso hierarchy with their
  ``sigma^2`` fixed at 1): ``w_j | v_j ~ N(m_j, v_j)``, ``v_j ~ Exp(rate 1 / (2 b^2))``;
  conditional ``1 / v_j | w ~ InvGauss(mean 1 / (b |w_j - m_j|), shape 1 / b^2)``.
* ``StudentT(nu, m, s)`` and ``Cauchy(m, s)`` (``nu = 1``) (Andrews & Mallows 1974; Geweke
  1993): ``w_j | g_j ~ N(m_j, s_j^2 / g_j)``, ``g_j ~ Gamma(nu/2, rate nu/2)``; conditional
  ``g_j | w ~ Gamma((nu + 1)/2, rate (nu + ((w_j - m_j)/s_j)^2) / 2)``.
* horseshoe (Makalic & Schmidt 2016, Sec. 2): ``w_j ~ N(0, lam_j^2 tau^2)``,
  ``lam_j ~ C+(0, c_j)``, ``tau ~ C+(0, s)``, each half-Cauchy written as an inverse-gamma
  mixture ``lam_j^2 | nu_j ~ IG(1/2, 1/nu_j)``, ``nu_j ~ IG(1/2, 1/c_j^2)`` (the same for
  ``tau^2`` with ``xi``).
* Gaussian (any ``MultivariateNormal``): ``v`` fixed, the weight step is the exact conjugate
  posterior.

Horseshoe conditionals (Makalic & Schmidt 2016, with their ``sigma^2`` fixed to 1 because the
prior here does not scale with the noise)::

    lam_j^2 | . ~ IG(1, 1/nu_j + w_j^2 / (2 tau^2))        nu_j | . ~ IG(1, 1/c_j^2 + 1/lam_j^2)
    tau^2   | . ~ IG((d+1)/2, 1/xi + sum_j w_j^2 / (2 lam_j^2))   xi | . ~ IG(1, 1/s^2 + 1/tau^2)

The global scale ``tau`` is not drawn from that conditional by default: ``tau`` and the weights
are strongly coupled (with most weights shrunk to zero, ``tau^2 | w`` is narrow while ``w | tau``
moves little), so the chain of the per-coordinate step mixes slowly (``tau`` r-hat 1.07, bulk ESS
under 100 from 4 chains x 1,000 sweeps in ``benchmarks/horseshoe_mixing.py``). Instead
(``tau_scheme="marginal"``), ``(tau, w)`` is updated as a block, as in Johndrow, Orenstein &
Bhattacharya (2020), "Scalable approximate MCMC algorithms for the horseshoe prior", JMLR 21(73),
Sec. 2.1 / Algorithm 1 (the exact version, no thresholding): given the latents the likelihood is
Gaussian in ``w`` (Polya-Gamma: pseudo-data ``kappa / omega`` with precision ``omega``; probit: the
truncated normals; Gaussian: the data, given the noise variance), so ``w`` (and ``xi``) can be
integrated out::

    log p(tau | lam, latents) = -d log tau - log|L| + |L^-1 eta|^2 / 2 - log(1 + tau^2/s^2) + const,
    L L^T = Q = Lambda_data + diag(1 / (tau^2 lam^2))

and ``log tau`` takes a Metropolis-Hastings random-walk step on it (``_tau_step``, the factor of
the accepted ``tau`` reused by the weight step); then ``w | tau`` as above, then a move of ``tau``
against all ``lam_j`` with their products fixed (``_rescale_step``), then ``nu``, ``lam``, ``nu``,
``xi``. For the 0/1 likelihoods on data large enough that the latents' ``O(n d^2)`` work dominates a
sweep (``n d >= 20,000``), the rounds of ``tau, w, lam, nu`` are repeated 4 times given the sweep's
latents (``tau_inner``, ``_rounds``). Laplace and
Student-t priors have no shared scale (their mixing variances are independent across weights
given ``w``), so their steps are unchanged.

Likelihoods (all with the same weight step ``w | . ~ N(Lambda^-1 eta, Lambda^-1)``):

* ``"gaussian"``: ``Lambda = Lambda_prior + X^T X / s2``, ``eta = Lambda_prior m0 + X^T y / s2``
  from running sufficient statistics (cost per sweep independent of ``n``). With an
  ``InverseGamma(a0, b0)`` noise prior, ``s2 | w ~ IG(a0 + n/2, b0 + |y - X w|^2 / 2)``.
* ``"probit"``: Albert & Chib (1993, Sec. 3): latent ``z_i | w ~ N(x_i^T w, 1)`` truncated
  to ``z_i > 0`` if ``y_i = 1`` and ``z_i <= 0`` if ``y_i = 0``; then ``Lambda = Lambda_prior +
  X^T X``, ``eta = Lambda_prior m0 + X^T z``. Truncated normals by inverse CDF from uniforms.
* ``"logistic"``: Polson, Scott & Windle (2013), Theorem 1: ``omega_i | w ~ PG(1, x_i^T w)``,
  ``Lambda = Lambda_prior + X^T Omega X``, ``eta = Lambda_prior m0 + X^T (y - 1/2)``. PG draws by
  the series of their Definition 1 (see ``polya_gamma``). With forgetting, row ``i`` weighs
  ``w_i = lambda^(rows since)``: ``omega_i | w ~ PG(w_i, x_i^T w)``, ``kappa_i = w_i (y_i - 1/2)``.

Thompson sampling with this engine is *warm-started*: the chain state (weights, scales,
latents) is kept across ``update`` calls, and each draw (``sample`` / ``sample_at``) advances it
by ``sweeps`` full sweeps from the last state instead of refitting. Measured (see
``benchmarks/custom_priors.py`` and the user guide): a sweep costs about as much as the rest
of a decision at R = 1 (d = 4), so every extra sweep per decision roughly halves the decision
rate, while the chain of one-sweep draws already has the right stationary law (the accuracy
tests check it against quadrature and NUTS); ``sweeps=1`` is the default. When the data at least doubled since the
last draw (the first draws, or one large ``update``), ``burn_in`` extra sweeps are run first.

Every random number comes from ``bayes_safe.random`` with a ``key`` derived from the caller's,
so replication ``r`` of a batch equals a one-replication run with a ``ReplicationRNG``.
Latent draws whose count grows with the data (``[R, n]`` truncated normals, ``[R, n, K]``
Polya-Gamma terms) use a counter-based stream: one uniform per replication from the
``ReplicationRNG`` seeds a SplitMix64 sequence (Steele, Lea & Flood 2014) evaluated in numpy.
Transcendental functions are evaluated lane-aligned (see ``lanewise``) so that SIMD and scalar
code paths cannot make a batch differ from a one-replication run in the last bit.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributions as tdist

from ..random import (
    DrawBatch,
    Generator,
    ReplicationRNG,
    standard_gamma,
    standard_normal,
    standard_uniform,
)
from ._forgetting import discount_statistics, forgetting_weights, restart_statistics

__all__ = [
    "GibbsLinearPosterior",
    "ScaleMixturePrior",
    "forgetting_weights",
    "inverse_gaussian",
    "polya_gamma",
    "recognise_prior",
    "truncated_normal_latent",
]

_DTYPE = torch.float64
#: the Gibbs engine's device: its samplers (Polya-Gamma series, generalised-inverse-Gaussian and gamma
#: inverse CDFs, SplitMix64 uniforms) run in numpy and scipy, so its state is made on the CPU, float64
#: (``BayesianLinear`` refuses ``inference="gibbs"`` for a prior on another device and picks the
#: Langevin engine there under ``inference="auto"``)
_CPU = torch.device("cpu")
_SQRT_HALF = math.sqrt(0.5)
LIKELIHOODS = ("gaussian", "probit", "logistic")
GIBBS_OPTIONS = ("sweeps", "burn_in", "predict_sweeps", "pg_terms", "seed")


# ---------------------------------------------------------------------------- prior recognition
@dataclass
class ScaleMixturePrior:
    """A prior the Gibbs engine can sample, broadcast to the model's batch.

    Attributes (``[*b]`` = the model's batch shape):
        kind: ``"gaussian"``, ``"laplace"``, ``"student"`` or ``"horseshoe"``.
        loc: ``[*b, d]`` prior location ``m0`` (zero for the horseshoe).
        precision: ``[*b, d, d]`` prior precision (Gaussian only).
        scale: ``[*b, d]`` Laplace ``b`` / Student-t ``s``.
        df: ``[*b, d]`` Student-t degrees of freedom.
        global_scale: ``[*b]`` horseshoe ``s`` (``tau ~ C+(0, s)``).
        local_scale: ``[*b, d]`` horseshoe ``c_j`` (``lam_j ~ C+(0, c_j)``).
    """

    kind: str
    loc: torch.Tensor
    precision: torch.Tensor | None = None
    scale: torch.Tensor | None = None
    df: torch.Tensor | None = None
    global_scale: torch.Tensor | None = None
    local_scale: torch.Tensor | None = None


def _unwrap(fn):
    """The base distribution under ``Independent`` / ``ExpandedDistribution`` wrappers."""
    while isinstance(fn, tdist.Independent) or type(fn).__name__ == "ExpandedDistribution":
        fn = fn.base_dist
    return fn


def _expand(t, shape) -> torch.Tensor:
    return torch.as_tensor(t).to(_DTYPE).expand(shape).clone()


def recognise_prior(prior, dim: int, batch_shape) -> ScaleMixturePrior | None:
    """The ``ScaleMixturePrior`` of ``prior``, or ``None`` if the Gibbs engine cannot sample it.

    Recognised: ``MultivariateNormal`` / ``Normal(...).to_event(1)``; ``Laplace``, ``StudentT``
    and ``Cauchy`` ``.expand([d]).to_event(1)`` (any loc and scale); a callable Pyro horseshoe in
    either form this project uses (see ``_horseshoe``).
    """
    from ._gaussian import gaussian_prior_parameters

    b = tuple(batch_shape)
    d = int(dim)
    if isinstance(prior, tdist.Distribution):
        gaussian = gaussian_prior_parameters(prior)
        if gaussian is not None:
            from ._gaussian import cholesky as _cholesky

            loc, cov = gaussian
            return ScaleMixturePrior("gaussian", _expand(loc, (*b, d)),
                                     precision=torch.cholesky_inverse(_cholesky(_expand(cov, (*b, d, d)))))
        if not (isinstance(prior, tdist.Independent) and prior.reinterpreted_batch_ndims == 1):
            return None
        base = _unwrap(prior.base_dist)
        if isinstance(base, tdist.Laplace):
            return ScaleMixturePrior("laplace", _expand(base.loc, (*b, d)), scale=_expand(base.scale, (*b, d)))
        if isinstance(base, tdist.StudentT):
            return ScaleMixturePrior("student", _expand(base.loc, (*b, d)), scale=_expand(base.scale, (*b, d)),
                                     df=_expand(base.df, (*b, d)))
        if isinstance(base, tdist.Cauchy):
            return ScaleMixturePrior("student", _expand(base.loc, (*b, d)), scale=_expand(base.scale, (*b, d)),
                                     df=torch.ones((*b, d), dtype=_DTYPE, device=_CPU))
        return None
    if callable(prior):
        found = _horseshoe(prior, d)
        if found is None:
            return None
        s, c = found
        return ScaleMixturePrior("horseshoe", torch.zeros((*b, d), dtype=_DTYPE, device=_CPU),
                                 global_scale=_expand(s, b), local_scale=_expand(c, (*b, d)))
    return None


def _horseshoe(prior, d: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(s, c [d])`` if the callable ``prior`` is a horseshoe, else ``None``.

    Recognised by tracing it (twice, seeded, global RNG state restored): exactly three sample
    sites, a scalar ``HalfCauchy(s)`` (``tau``), a ``HalfCauchy(c)`` of shape ``[d]`` (``lam``)
    and a ``Normal`` of shape ``[d]``, and either the centred form (the returned value is the
    ``Normal(0, tau * lam)`` site) or the non-centred one (``Normal(0, 1)`` site ``z`` and the
    return value ``tau * lam * z``), as written in the user guide and the custom-prior tutorial.
    """
    from pyro import poutine

    from .pyro_inference import _seeded

    found = None
    for seed in (11, 12):
        try:
            with _seeded(seed), torch.no_grad():
                trace = poutine.trace(prior).get_trace()
        except Exception:  # noqa: BLE001 - not ours to judge: the NUTS path reports it
            return None
        sites = [s for s in trace.nodes.values() if s["type"] == "sample" and not s["is_observed"]]
        ret = trace.nodes["_RETURN"]["value"]
        if len(sites) != 3 or not torch.is_tensor(ret) or tuple(ret.shape) != (d,):
            return None
        half = [s for s in sites if isinstance(_unwrap(s["fn"]), tdist.HalfCauchy)]
        normal = [s for s in sites if isinstance(_unwrap(s["fn"]), tdist.Normal) and tuple(s["value"].shape) == (d,)]
        if len(half) != 2 or len(normal) != 1:
            return None
        glob = [s for s in half if s["value"].numel() == 1]
        if not glob:
            return None
        glob = glob[0]
        local = half[1] if half[0] is glob else half[0]
        if tuple(local["value"].shape) not in ((d,), ()) or (d > 1 and local["value"].numel() != d):
            return None
        tau, lam = glob["value"].to(_DTYPE).reshape(()), local["value"].to(_DTYPE).reshape(-1).expand(d)
        z = normal[0]
        fz = _unwrap(z["fn"])
        zloc = fz.loc.to(_DTYPE).expand(d)
        zscale = fz.scale.to(_DTYPE).expand(d)
        value = z["value"].to(_DTYPE)
        r = ret.to(_DTYPE)

        def close(a, b):
            return bool(torch.allclose(a, b, rtol=1e-5, atol=1e-12))

        if close(zloc, torch.zeros(d, dtype=_DTYPE, device=_CPU)) and close(zscale, tau * lam) and close(r, value):
            form = "centred"
        elif (close(zloc, torch.zeros(d, dtype=_DTYPE, device=_CPU)) and close(zscale, torch.ones(d, dtype=_DTYPE, device=_CPU))
              and close(r, tau * lam * value)):
            form = "non-centred"
        else:
            return None
        s = _unwrap(glob["fn"]).scale.to(_DTYPE).reshape(())
        c = _unwrap(local["fn"]).scale.to(_DTYPE).reshape(-1).expand(d)
        if found is not None and (found[2] != form or not close(found[0], s) or not close(found[1], c)):
            return None
        found = (s, c, form)
    return found[0], found[1]


# ---------------------------------------------------------------------------- random variates
_LANES = 16  # doubles per vectorised chunk of torch's CPU kernels (2 AVX-512 registers)


def lanewise(fn, *xs: torch.Tensor) -> torch.Tensor:
    """``fn(*xs)`` (elementwise, same-shape inputs) evaluated so that each leading-dimension row
    (replication) gets exactly the bits it would get alone.

    torch's CPU kernels evaluate transcendental functions (``log``, ``tanh``, ``sigmoid``, ...)
    with SIMD code for whole chunks of 16 elements and with scalar code for the remainder; the
    two can differ in the last bit, and where the remainder falls depends on the batch size.
    Each row is therefore padded to a multiple of ``_LANES`` (padding value 1), so every element
    takes the vectorised path at the same lane, batched or alone (single intra-op thread, as in
    ``simulate``).
    """
    x = xs[0]
    if x.dim() == 0:
        return fn(*xs)
    R = x.shape[0]
    m = x.numel() // max(R, 1)
    pad = (-m) % _LANES
    flat = [t.reshape(R, m) for t in xs]
    if pad:
        flat = [torch.nn.functional.pad(t, (0, pad), value=1.0) for t in flat]
    out = fn(*flat)
    return (out[:, :m] if pad else out).reshape(x.shape)


def _gamma(a: torch.Tensor, generator: Generator, key: str) -> torch.Tensor:
    """``standard_gamma`` on a lane-padded layout (see ``lanewise``): replication-separable for any batch."""
    if a.dim() == 0:
        return standard_gamma(a, generator, key=key)
    R = a.shape[0]
    m = a.numel() // max(R, 1)
    flat = torch.nn.functional.pad(a.reshape(R, m), (0, (-m) % _LANES), value=1.0)
    return standard_gamma(flat, generator, key=key)[:, :m].reshape(a.shape)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64 constants
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_STEPS = np.zeros(0, dtype=np.uint64)
_S30, _S27, _S31, _S11 = (np.uint64(k) for k in (30, 27, 31, 11))


def _splitmix_uniform(seeds: np.ndarray, count: int) -> torch.Tensor:
    """``[R, count]`` uniforms in ``(0, 1)``: the SplitMix64 outputs (Steele, Lea & Flood 2014)
    of the uint64 ``seeds [R]`` at positions ``1..count``.

    In numpy (native uint64, wrapping arithmetic and logical shifts): a dozen operations on
    ``[R, count]``, which numpy runs at a fraction of torch's per-call overhead.
    """
    global _STEPS
    if _STEPS.size < count:
        _STEPS = np.arange(1, max(2 * count, 1024) + 1, dtype=np.uint64) * _GOLDEN
    z = seeds[:, None] + _STEPS[None, :count]
    t = np.empty_like(z)  # the shifts' scratch: the same numbers, no temporaries
    z ^= np.right_shift(z, _S30, out=t)
    z *= _M1
    z ^= np.right_shift(z, _S27, out=t)
    z *= _M2
    z ^= np.right_shift(z, _S31, out=t)
    out = np.right_shift(z, _S11, out=t).astype(np.float64)
    out += 0.5
    out *= 2.0**-53
    return torch.from_numpy(out)


def uniform_rows(shape, generator: Generator = None, key: str = "rows") -> torch.Tensor:
    """``U(0, 1)`` draws of any ``shape`` (open interval), replication-separable for a ``ReplicationRNG``.

    With a ``ReplicationRNG`` (``shape[0]`` = replications) one uniform per replication from the
    stream ``key`` seeds a SplitMix64 sequence for that replication's ``prod(shape[1:])`` numbers,
    so shapes that grow with the data do not create one stream per shape. Otherwise
    ``torch.rand`` (nudged off 0).
    """
    shape = tuple(int(s) for s in shape)
    if isinstance(generator, ReplicationRNG):
        u = standard_uniform(shape[:1], generator, key=key)
        seeds = (u.numpy() * 2.0**53).astype(np.uint64) * np.uint64(2048) + np.uint64(1)  # 53 random bits
        count = math.prod(shape[1:])
        return _splitmix_uniform(seeds, count).reshape(shape)
    return torch.rand(shape, generator=generator, dtype=_DTYPE, device=_CPU).clamp_min(2.0**-60)


def inverse_gaussian(mean: torch.Tensor, shape: torch.Tensor, generator: Generator = None,
                     key: str = "invgauss") -> torch.Tensor:
    """Inverse-Gaussian ``IG(mean, shape)`` draws, ``[*batch]`` (one normal and one uniform each).

    Michael, Schucany & Haas (1976): with ``y = nu^2``, ``nu ~ N(0, 1)``, the smaller root
    ``x = mean + mean^2 y / (2 shape) - mean/(2 shape) sqrt(4 mean shape y + mean^2 y^2)``, written
    here without cancellation as ``mean - 2 mean (mean y) / (mean y + sqrt(mean y (4 shape + mean y)))``;
    return ``x`` with probability ``mean / (mean + x)``, else ``mean^2 / x``.
    """
    nu = standard_normal(tuple(mean.shape), generator, key=key + "/n")
    u = standard_uniform(tuple(mean.shape), generator, key=key + "/u")
    my = mean * nu * nu
    x = mean - 2.0 * mean * my / (my + torch.sqrt(my * (4.0 * shape + my))).clamp_min(1e-300)
    x = x.clamp_min(1e-300)
    return torch.where(u * (mean + x) <= mean, x, mean * mean / x)


def _laplace_variance(r: np.ndarray, b: np.ndarray, shape4: np.ndarray, nu: np.ndarray, u: np.ndarray):
    """``(v, 1/v)`` with ``1/v ~ IG(1/(b |r|), 1/b^2)``, ``[*batch, d]`` numpy arrays: the Bayesian
    lasso's variance step, ``inverse_gaussian`` solved for the reciprocal directly.

    With ``t = b |r| = 1 / mean``, ``a = mean y`` (``y = nu^2``) and ``S = sqrt(a (a + 4 shape))``
    (``shape4 = 4 / b^2``), the smaller root is ``x = k / t`` with ``k = 4 shape a / (S + a)^2``
    (cancellation-free form of ``(S - a) / (S + a)``); ``x`` is kept with probability
    ``mean / (mean + x) = 1 / (1 + k)``, else ``mean^2 / x = 1 / (t k)``. So ``v = t / k`` or
    ``t k``. As ``r -> 0``, ``v -> nu^2 b^2`` (the Levy limit), with no overflow.

    In numpy: a dozen elementwise operations on a few numbers cost several times less than in
    torch, and only ``+ * /`` and ``sqrt`` are used (IEEE-exact, so SIMD lanes cannot change a
    bit). ``nu, u [*batch, d]``: standard normals and uniforms.
    """
    t = np.maximum(np.abs(r), 1e-100) * b
    a = nu * nu / t
    S = np.sqrt(a * (a + shape4))
    k = np.maximum(shape4 * a / np.square(S + a), 1e-300)
    v = np.where(u * (1.0 + k) <= 1.0, t / k, t * k)
    return v, 1.0 / v


def truncated_normal_latent(mu: torch.Tensor, y: torch.Tensor, generator: Generator = None,
                            key: str = "probit", sign: torch.Tensor | None = None) -> torch.Tensor:
    """Albert & Chib (1993) latents: ``z ~ N(mu, 1)`` truncated to ``z > 0`` where ``y = 1`` and
    ``z <= 0`` where ``y = 0``, by inverse CDF. ``mu, y: [*batch, n] -> [*batch, n]``.

    With ``s = 2 y - 1``: ``z = mu - s Phi^-1(U Phi(s mu))``. Beyond 30 sd on the wrong side
    (``Phi(s mu)`` below 1e-197) the tail is drawn as ``0 + s Exp(|mu|)`` (the exponential limit
    of the normal tail, relative error of its mean about ``1 / mu^2``).
    """
    s = 2.0 * y - 1.0 if sign is None else sign
    u = uniform_rows(mu.shape, generator, key=key)
    smu = s * mu
    # Phi(s mu) as erfc(-s mu / sqrt 2) / 2: torch's ndtr underflows to 0 below -8.3, erfc only
    # below -37 (lane-padded: erfc has a SIMD kernel); ndtri runs as a scalar kernel on CPU
    p = lanewise(lambda a: 0.5 * torch.special.erfc(a * -_SQRT_HALF), smu)
    e = -s * torch.special.ndtri(u * p)
    far = smu < -30.0
    if bool(far.any()):
        tail = s * lanewise(lambda uu: -torch.log(uu), u) / smu.abs().clamp_min(1.0) - mu
        e = torch.where(far, tail, e)
    return mu + e


def _gamma_inverse_cdf(b: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``Gamma(b, 1)`` by inverse CDF of the uniforms ``u`` (``scipy.special.gammaincinv``, a
    dependency of arviz): one uniform per draw, so the randomness is fixed and
    replication-separable. ``b`` near 0 gives 0 (the limit)."""
    from scipy.special import gammaincinv

    b_np, u_np = np.broadcast_arrays(b.numpy(), u.numpy())
    out = np.zeros(u_np.shape)
    ok = b_np > 1e-300
    out[ok] = gammaincinv(b_np[ok], u_np[ok])
    return torch.from_numpy(out)


def polya_gamma(c: torch.Tensor, generator: Generator = None, key: str = "pg", terms: int = 20,
                b: torch.Tensor | None = None) -> torch.Tensor:
    """``PG(1, c)`` draws, ``[*batch] -> [*batch]``, by the truncated series of Polson, Scott &
    Windle (2013), Definition 1, ``omega = 1/(2 pi^2) sum_k g_k / ((k - 1/2)^2 + c^2/(4 pi^2))``
    with ``g_k ~ Exp(1)``: the first ``terms`` terms are drawn and the rest replaced by their
    mean, from ``E[PG(1, c)] = tanh(c/2) / (2c)`` (their Sec. 2.2). The draw has the exact mean;
    its variance is short by the tail's, ``< 1/(12 pi^4 (terms - 1/2)^3)`` (with 20 terms,
    ``1e-7`` against ``Var PG(1, 0) = 1/24``). Fixed randomness per element (``terms`` uniforms),
    so it is reproducible by seed and replication-separable.

    ``b`` (broadcastable to ``c``; forgetting's row weights, issue 30): ``PG(b, c)`` draws, the same
    series with ``g_k ~ Gamma(b, 1)`` (Polson, Scott & Windle 2013, Definition 1) drawn by inverse
    CDF from the same uniforms, and the tail's mean ``b`` times that of ``PG(1, c)``
    (``E[PG(b, c)] = b tanh(c/2) / (2c)``). Where ``b == 1`` the draw is bit for bit the ``PG(1, c)``
    draw.

    ``PG(1, c)`` of CPU tensors under a ``torch.Generator`` or ``ReplicationRNG`` (or none) is drawn
    by ``_polya_gamma_plain``: the same numbers, bit for bit, in fewer and cheaper operations.
    """
    if (b is None and c.dim() >= 1 and c.device.type == "cpu" and not c.requires_grad
            and (generator is None or type(generator) in (torch.Generator, ReplicationRNG))):
        return _polya_gamma_plain(c, _series_constants(terms), generator, key)
    c = c.abs()
    k = torch.arange(1, terms + 1, dtype=_DTYPE, device=_CPU) - 0.5
    denom = k * k + (c * c / (4.0 * math.pi**2))[..., None]  # [*b, K]
    u = uniform_rows((*c.shape, terms), generator, key=key)
    g = lanewise(lambda uu: -torch.log(uu), u)
    if b is not None:
        bk = b.to(_DTYPE).expand(c.shape)[..., None].expand(g.shape)
        g = torch.where(bk == 1.0, g, _gamma_inverse_cdf(bk, u))
    head = (g / denom).sum(-1) / (2.0 * math.pi**2)
    head_mean = (1.0 / denom).sum(-1) / (2.0 * math.pi**2)
    small = c < 1e-4
    full_mean = torch.where(small, 0.25 - c * c / 48.0, lanewise(torch.tanh, c / 2.0) / (2.0 * c.clamp_min(1e-4)))
    tail = (full_mean - head_mean).clamp_min(0.0)
    return head + (tail if b is None else b * tail)


@functools.lru_cache(maxsize=8)
def _series_constants(terms: int) -> np.ndarray:
    """``(k - 1/2)^2`` for ``k = 1 .. terms`` (float64, as ``polya_gamma`` computes them; read only)."""
    k = torch.arange(1, terms + 1, dtype=_DTYPE, device=_CPU) - 0.5
    out = (k * k).numpy()
    out.setflags(write=False)
    return out


def _polya_gamma_plain(psi: torch.Tensor, kk: np.ndarray, generator: Generator, key: str) -> torch.Tensor:
    """``polya_gamma(psi, generator, key, terms=len(kk))`` (``b`` None, ``psi [R, ...]``), bit for bit, in
    fewer and cheaper operations: ``kk = (k - 1/2)^2`` precomputed; the arithmetic (``+ - * /``, ``abs``,
    ``max``: IEEE-exact, so numpy's numbers are torch's) in numpy, the ``log``, ``tanh`` and sums in torch on
    the layouts ``polya_gamma`` gives them; the uniforms of a ``ReplicationRNG`` drawn lane-padded
    (SplitMix64 at positions ``1 .. m + pad``: the first ``m`` are ``uniform_rows``'s, the padding's ``log``
    is dropped, so every kept element takes the SIMD lane it takes under ``lanewise``); the head and its
    mean as one division and one sum over ``[2, *psi, terms]`` (``head = -s[0]``: negation is exact, so
    ``head + tail`` is ``tail - s[0]``)."""
    c = np.abs(psi.numpy())
    cc = c * c
    terms = kk.shape[0]
    denom = kk + (cc / (4.0 * math.pi**2))[..., None]
    shape = (*c.shape, terms)
    R = shape[0]
    m = c.size // R * terms if R else 0
    pad = (-m) % _LANES
    if type(generator) is ReplicationRNG:
        u0 = standard_uniform((R,), generator, key=key)
        seeds = (u0.numpy() * 2.0**53).astype(np.uint64) * np.uint64(2048) + np.uint64(1)  # as uniform_rows
        u = _splitmix_uniform(seeds, m + pad)
    else:
        u = uniform_rows(shape, generator, key=key).reshape(R, m)
        if pad:
            u = torch.nn.functional.pad(u, (0, pad), value=1.0)
    lg = torch.log(u).numpy()
    q = np.empty((2, *shape))
    np.divide(lg[:, :m].reshape(shape), denom, out=q[0])
    np.divide(1.0, denom, out=q[1])
    s = torch.from_numpy(q).sum(-1).numpy() / (2.0 * math.pi**2)
    rows = c.reshape(R, c.size // R if R else 0)  # lanewise(torch.tanh, c / 2.0), padded with 1.0 in numpy
    k = rows.shape[1]
    half = np.ones((R, k + (-k) % _LANES))
    np.divide(rows, 2.0, out=half[:, :k])
    th = torch.tanh(torch.from_numpy(half)).numpy()[:, :k].reshape(c.shape)
    full_mean = th / (2.0 * np.maximum(c, 1e-4))
    small = c < 1e-4
    if small.any():
        full_mean = np.where(small, 0.25 - cc / 48.0, full_mean)
    return torch.from_numpy(np.maximum(full_mean - s[1], 0.0) - s[0])


def _exp_draw(shape, generator, key) -> torch.Tensor:
    return lanewise(lambda u: -torch.log1p(-u), standard_uniform(shape, generator, key=key))


# ---------------------------------------------------------------------------- the data
def empty_data(batch_shape, dim: int, device: torch.device | None = None) -> tuple[torch.Tensor, ...]:
    """``(X^T X [*b, d, d], X^T y [*b, d], y^T y [*b], X [*b, 0, d], y [*b, 0])``, all zero: the data
    a warm-started engine (Gibbs, Langevin) keeps, before any observation (on ``device``; default the CPU)."""
    b, d = tuple(batch_shape), int(dim)
    device = _CPU if device is None else device
    return (torch.zeros((*b, d, d), dtype=_DTYPE, device=device), torch.zeros((*b, d), dtype=_DTYPE, device=device),
            torch.zeros(b, dtype=_DTYPE, device=device),
            torch.zeros((*b, 0, d), dtype=_DTYPE, device=device), torch.zeros((*b, 0), dtype=_DTYPE, device=device))


def append_rows(X_rows: torch.Tensor, y_rows: torch.Tensor, n: int, X: torch.Tensor, y: torch.Tensor):
    """Write ``X [*b, m, d]``, ``y [*b, m]`` at rows ``n .. n + m`` of the buffers ``X_rows [*b, cap, d]``,
    ``y_rows [*b, cap]`` (the 0/1 likelihoods' data), doubling them when full, so that ``m`` rows at a
    time cost ``O(m)`` amortised. Buffers made under ``torch.inference_mode`` are copied first when it
    is off (they cannot be written in place there).

    Returns ``(X_rows, y_rows, renewed)``: ``renewed`` when the buffers are new tensors.
    """
    m = X.shape[-2]
    renewed = False
    if n + m > X_rows.shape[-2]:
        cap = max(2 * X_rows.shape[-2], n + m, 16)
        X_new = torch.zeros((*X_rows.shape[:-2], cap, X_rows.shape[-1]), dtype=_DTYPE, device=X_rows.device)
        y_new = torch.zeros((*y_rows.shape[:-1], cap), dtype=_DTYPE, device=X_rows.device)
        X_new[..., :n, :] = X_rows[..., :n, :]
        y_new[..., :n] = y_rows[..., :n]
        X_rows, y_rows, renewed = X_new, y_new, True
    elif X_rows.is_inference() and not torch.is_inference_mode_enabled():
        X_rows, y_rows, renewed = X_rows.clone(), y_rows.clone(), True
    X_rows[..., n: n + m, :] = X
    y_rows[..., n: n + m] = y
    return X_rows, y_rows, renewed


# ---------------------------------------------------------------------------- the engine
@dataclass
class _State:
    w: torch.Tensor  # [*b, d]
    v: torch.Tensor | None  # [*b, d] prior variances (scale mixtures)
    aux: dict  # horseshoe: lam2, nu [*b, d], tau2, xi [*b]; student: g
    s2: torch.Tensor | None  # [*b] noise variance (noise prior only)
    inv: torch.Tensor | None = None  # [*b, d] 1 / v when the scale step computed it (Laplace)

    def clone(self) -> _State:
        return _State(self.w.clone(), None if self.v is None else self.v.clone(),
                      {k: v.clone() for k, v in self.aux.items()}, None if self.s2 is None else self.s2.clone(),
                      None if self.inv is None else self.inv.clone())


class GibbsLinearPosterior:
    """Warm-started Gibbs sampler for ``w`` in a linear model, batched over ``batch_shape``.

    Args:
        prior: a ``ScaleMixturePrior`` (from ``recognise_prior``).
        dim: ``d``.
        batch_shape: ``[*b]``; each batch element runs its own chain (vectorised).
        likelihood: ``"gaussian"``, ``"probit"`` or ``"logistic"``.
        noise_std: known noise sd (Gaussian likelihood), or None with ``noise_prior``.
        noise_prior: ``InverseGamma(a0, b0)`` on the noise variance (Gaussian likelihood;
            the weight prior does not scale with it, as in ``PyroLinearPosterior``).
        sweeps: full sweeps per Thompson draw (default 1, see the module docstring).
        burn_in: extra sweeps before a draw when the data at least doubled since the last one,
            and before the summaries of ``predict`` / ``posterior_mean`` (default 20).
        predict_sweeps: sweeps averaged by ``predict`` / ``posterior_mean`` (default 200).
        pg_terms: series terms of the Polya-Gamma sampler (logistic; default 20).
        seed: seed of the generator ``predict`` and ``fit`` use when given none.
        tau_scheme, tau_steps, tau_proposal_sd, tau_inner: how the horseshoe's global scale ``tau`` is
            drawn (see ``_tau_step``). ``tau_scheme``: ``"marginal"`` (default):
            blocked with the weights, ``tau`` with ``w`` integrated out by ``tau_steps``
            Metropolis-Hastings steps on ``log tau`` (proposal sd ``tau_proposal_sd``), then
            ``w | tau`` (Johndrow, Orenstein & Bhattacharya 2020, Sec. 2.1; ``_tau_step``).
            ``"conditional"``: the older per-coordinate step ``tau^2 | w, lam, xi ~ IG``, which
            mixes badly because ``tau`` and ``w`` are strongly coupled; kept so that
            ``benchmarks/horseshoe_mixing.py`` can compare the two. Not an ``inference_options``
            key: set it on a model's engine (``model.engine.tau_scheme``) or build the engine.
            ``tau_steps``: MH steps per round (1); ``tau_proposal_sd``: their random-walk sd on
            ``log tau`` (0.5); ``tau_inner``: rounds of (``tau``, ``w``, ``lam``, ``nu``) per sweep
            given the sweep's latents (``None``, the default: 4 for the 0/1 likelihoods once
            ``n d >= 20,000``, where the Polya-Gamma or truncated-normal latents and ``X^T Omega X`` cost
            more than the rounds, else 1; see ``_rounds``).

    Shapes: ``add(X [*b, n, d], y [*b, n])``; ``draw() -> [*b, d]``; ``summary(X [*b, k, d])
    -> ([*b, k], [*b, k])``.
    """

    method = "gibbs"

    def __init__(self, prior: ScaleMixturePrior, dim: int, batch_shape, *, likelihood: str = "gaussian",
                 noise_std: float | None = None, noise_prior=None, sweeps: int = 1, burn_in: int = 20,
                 predict_sweeps: int = 200, pg_terms: int = 20, seed: int = 0, forgetting: float | None = None,
                 tau_scheme: str = "marginal", tau_steps: int = 1, tau_proposal_sd: float = 0.5, tau_inner: int | None = None):
        self.prior = prior
        if tau_scheme not in ("marginal", "conditional"):
            raise ValueError(f"tau_scheme: expected 'marginal' or 'conditional', got {tau_scheme!r}")
        if int(tau_steps) < 1 or not float(tau_proposal_sd) > 0.0:
            raise ValueError(f"tau_steps / tau_proposal_sd: expected a positive count and sd, got {tau_steps!r}, "
                             f"{tau_proposal_sd!r}")
        if tau_inner is not None and int(tau_inner) < 1:
            raise ValueError(f"tau_inner: expected a positive count or None, got {tau_inner!r}")
        self.tau_scheme, self.tau_steps, self.tau_proposal_sd = tau_scheme, int(tau_steps), float(tau_proposal_sd)
        self.tau_inner = None if tau_inner is None else int(tau_inner)
        self.last_tau_accept: torch.Tensor | None = None
        # forgetting (issue 30): each new row weighs what came before by ``forgetting`` (the data, never
        # the prior: ``BayesianLinear``'s stabilised rule), so row i of n enters the likelihood to the power
        # lam^(n-1-i). Gaussian: the sufficient statistics discount exactly; ``_n_eff`` is the weighted count
        # the noise step uses. Logistic: omega_i ~ PG(w_i, psi_i), kappa_i = w_i (y_i - 1/2) (Polson, Scott
        # & Windle 2013, Theorem 1 with b_i = w_i), weights from ``forgetting_weights(lam, n)``. Probit: the
        # Albert-Chib augmentation has no exact form for Phi(psi)^w; refused
        if forgetting is not None and likelihood == "probit":
            raise ValueError("forgetting: the gibbs engine cannot forget with likelihood='probit' (the Albert-Chib "
                             "truncated-normal augmentation is not conjugate with a weighted likelihood Phi(x^T w)^lambda"
                             "^age); use likelihood='logistic' (Polya-Gamma augmentation, forgets exactly), or "
                             "inference='langevin' for a probit model that forgets")
        self.forgetting = forgetting
        self._n_eff = None if forgetting is None else torch.zeros(tuple(batch_shape), dtype=_DTYPE, device=_CPU)
        self.dim = int(dim)
        self.batch_shape = torch.Size(batch_shape)
        self.likelihood = likelihood
        self.sweeps, self.burn_in, self.predict_sweeps = int(sweeps), int(burn_in), int(predict_sweeps)
        self.pg_terms, self.seed = int(pg_terms), int(seed)
        b, d = tuple(self.batch_shape), self.dim
        self._noise_var = None if noise_std is None else float(noise_std) ** 2
        self._noise_prior = None
        if noise_prior is not None:
            self._noise_prior = (noise_prior.concentration.to(_DTYPE).expand(b).clone(),
                                 noise_prior.rate.to(_DTYPE).expand(b).clone())
        if likelihood != "gaussian":
            self._noise_var = 1.0
        self.n = 0
        self._n_at_draw = 0
        # sufficient statistics (all likelihoods keep X^T X; probit's w-step precision is fixed), and for
        # the binary likelihoods the rows themselves, grown by doubling (append_rows)
        self._xtx, self._xty, self._yty, self._X, self._y = empty_data(b, d)
        self._sign = self._y  # 2 y - 1 (probit)
        self._fixed: tuple[torch.Tensor, torch.Tensor] | None = None  # cached (L, prior eta) of a fixed precision
        self._scaled: tuple[torch.Tensor, torch.Tensor] | None = None  # cached (X^T X / s2, X^T y / s2), known s2
        self._zero_loc = not bool(prior.loc.any())
        if prior.kind == "laplace":  # constants of the lasso step, as numpy arrays
            self._b_np = prior.scale.numpy()
            self._shape4_np = 4.0 / (self._b_np * self._b_np)
        self.state = self._initial_state()
        self.last_conditional: tuple[torch.Tensor, torch.Tensor] | None = None  # (L, u) of the last w-step

    # ------------------------------------------------------------------ state
    def _initial_state(self) -> _State:
        p, b, d = self.prior, tuple(self.batch_shape), self.dim
        ones = torch.ones((*b, d), dtype=_DTYPE, device=_CPU)
        aux: dict = {}
        v = None
        if p.kind == "laplace":
            v = 2.0 * p.scale**2  # prior mean of the exponential mixing variable
        elif p.kind == "student":
            aux["g"] = ones.clone()
            v = p.scale**2
        elif p.kind == "horseshoe":
            aux.update(lam2=p.local_scale**2, nu=ones.clone(), tau2=p.global_scale**2, xi=torch.ones(b, dtype=_DTYPE, device=_CPU))
            v = aux["lam2"] * aux["tau2"][..., None]
        s2 = None
        if self._noise_prior is not None:
            a0, b0 = self._noise_prior
            s2 = b0 / (a0 + 1.0)  # the prior mode
        return _State(p.loc.clone(), v, aux, s2)

    # ------------------------------------------------------------------ data
    def add(self, X: torch.Tensor, y: torch.Tensor) -> None:
        """Add rows ``X [*b, n, d]``, ``y [*b, n]`` (already validated, broadcastable to the batch)."""
        b = tuple(self.batch_shape)
        X = X.expand(*b, *X.shape[-2:])
        y = y.expand(*b, y.shape[-1])
        n = X.shape[-2]
        if self.forgetting is not None and self.likelihood == "gaussian":  # row i of the m new ones weighs
            # lam^(m-1-i); what came before lam^m (logistic: the rows are kept, weighed in the sweep)
            self._xtx, self._xty, self._yty, w = discount_statistics(self._xtx, self._xty, self._yty, X, y,
                                                                     self.forgetting)
            self._n_eff = self.forgetting**n * self._n_eff + w.sum()
            self._scaled, self._fixed = None, None
            self.n += n
            return
        if n == 1:  # the decision loop: one fused op each instead of a batched matmul
            self._xtx = torch.addcmul(self._xtx, X[..., 0, :, None], X[..., 0, None, :])
            self._xty = torch.addcmul(self._xty, y, X[..., 0, :])
        else:
            self._xtx = self._xtx + X.mT @ X
            self._xty = self._xty + (X.mT @ y[..., None])[..., 0]
        if self._noise_prior is not None:
            self._yty = self._yty + (y * y).sum(-1)
        if self._n_eff is not None:  # a Gaussian chain an adaptive restart weighed (issue 43)
            self._n_eff = self._n_eff + n
        self._scaled = None
        if self.likelihood != "gaussian":
            self._X, self._y, renewed = append_rows(self._X, self._y, self.n, X, y)
            if renewed:
                self._sign = 2.0 * self._y - 1.0
            else:
                self._sign[..., self.n: self.n + n] = 2.0 * y - 1.0
        self.n += n
        self._fixed = None

    # ------------------------------------------------------------------ one sweep
    def _prior_precision(self, st: _State) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(diag [*b, d] or None, Lambda_prior m0 [*b, d] or None)``; diag ``None``: the
        Gaussian's full precision; ``None`` prior term: a zero prior location."""
        p = self.prior
        if p.kind == "gaussian":
            return None, None if self._zero_loc else (p.precision @ p.loc[..., None])[..., 0]
        inv = st.inv if st.inv is not None else 1.0 / st.v
        return inv, None if self._zero_loc else inv * p.loc


    def _likelihood_precision(self, scale, scale_m, data_precision):
        """The data's precision ``[*b, d, d]`` of one sweep: the sweep's latent-weighted ``X^T Omega X``
        (``data_precision``) or the kept ``X^T X``, times the noise ``scale`` (a number, or ``[*b]``
        broadcast as ``scale_m``)."""
        if data_precision is not None:
            return data_precision * scale_m if isinstance(scale, torch.Tensor) or scale != 1.0 else data_precision
        if isinstance(scale, torch.Tensor):
            return self._xtx * scale_m
        return self._scaled_stats(scale)[0]

    def _weight_step(self, st: _State, generator: Generator, key: str, rhs: torch.Tensor | None,
                     data_precision: torch.Tensor | None, scale: torch.Tensor | float,
                     z: torch.Tensor | None = None) -> None:
        """``w | . ~ N(Lambda^-1 eta, Lambda^-1)`` with ``Lambda = Lambda_prior + data_precision * scale``
        and ``eta = Lambda_prior m0 + rhs * scale`` (``scale = 1 / s2``)."""
        from ._gaussian import cholesky as _cholesky

        diag, prior_eta = self._prior_precision(st)
        if isinstance(scale, torch.Tensor):
            scale_m, scale_v = scale[..., None, None], scale[..., None]
        else:
            scale_m = scale_v = scale
        # Gaussian prior, no per-sweep data precision or noise: Lambda is fixed until the next add
        fixed = diag is None and data_precision is None and not isinstance(scale, torch.Tensor)
        if self.prior.kind == "horseshoe" and self.tau_scheme == "marginal":
            # Johndrow, Orenstein & Bhattacharya (2020), Sec. 2.1: tau with w integrated out, then w | tau
            P = self._likelihood_precision(scale, scale_m, data_precision)
            if rhs is None:
                rhs = self._scaled_stats(scale)[1]
            elif isinstance(scale, torch.Tensor) or scale != 1.0:
                rhs = rhs * scale_v
            for i in range(self._rounds() - 1):  # cheap inner rounds given the latents (no O(n) work)
                sub = f"{key}/inner{i}"
                L, u = self._tau_step(st, P, rhs, generator, sub)
                zi = standard_normal((*self.batch_shape, self.dim, 1), generator, key=sub + "/w")
                st.w = torch.linalg.solve_triangular(L.mT, u + zi, upper=True)[..., 0]
                self._scale_step(st, generator, sub, inner=True)
            L, u = self._tau_step(st, P, rhs, generator, key)
            if z is None:
                z = standard_normal((*self.batch_shape, self.dim, 1), generator, key=key + "/w")
            st.w = torch.linalg.solve_triangular(L.mT, u + z, upper=True)[..., 0]
            self.last_conditional = (L, u)
            return
        if fixed and self._fixed is not None:
            L, eta0 = self._fixed
        else:
            P = self._likelihood_precision(scale, scale_m, data_precision)
            P = P + (self.prior.precision if diag is None else torch.diag_embed(diag))
            L = _cholesky(P)
            eta0 = prior_eta
            if fixed:
                self._fixed = (L, eta0)
        if rhs is None:  # Gaussian likelihood, known noise: X^T y / s2 (cached)
            rhs = self._scaled_stats(scale)[1]
        elif isinstance(scale, torch.Tensor) or scale != 1.0:
            rhs = rhs * scale_v
        eta = rhs if eta0 is None else eta0 + rhs
        u = torch.linalg.solve_triangular(L, eta[..., None], upper=False)
        if z is None:
            z = standard_normal((*self.batch_shape, self.dim, 1), generator, key=key + "/w")
        st.w = torch.linalg.solve_triangular(L.mT, u + z, upper=True)[..., 0]
        self.last_conditional = (L, u)

    def _rounds(self) -> int:
        """Rounds of ``(tau, w, lam, nu)`` per sweep of the marginal horseshoe scheme: ``tau_inner`` if
        set; by default 4 for the 0/1 likelihoods once ``n d >= 20,000`` (then the sweep's ``O(n d^2)``
        data work, ``X^T Omega X``, outweighs the rounds' ``O(d^3)`` and fixed per-call costs), else 1
        (always 1 for the Gaussian likelihood, where a round costs as much as a sweep)."""
        if self.tau_inner is not None:
            return self.tau_inner
        return 4 if self.likelihood != "gaussian" and self.n * self.dim >= 20_000 else 1

    def _tau_target(self, P: torch.Tensor, rhs: torch.Tensor, lam2: torch.Tensor, tau2: torch.Tensor):
        """Log density of ``log tau`` given ``lam`` and the Gaussian (augmented) likelihood, ``w`` and
        ``xi`` integrated out, up to a constant and *without* its ``(1 - d) log tau`` term (the caller
        adds the difference of that term, ``(1 - d)`` times the step in ``log tau``, exactly); with
        the Cholesky factor it needs.

        Shapes: ``P [*b, d, d]`` (data precision ``X^T Omega X``, ``X^T X / s2``, ...), ``rhs [*b, d]``
        (``X^T kappa``, ``X^T y / s2``, ...), ``lam2 [*b, d]``, ``tau2 [*b]``. Returns
        ``(target [*b], L [*b, d, d], u [*b, d, 1])`` with ``L L^T = Q = P + diag(1 / (tau^2 lam^2))``
        and ``u = L^-1 rhs``. Given the latents the likelihood is ``exp(rhs^T w - w^T P w / 2)``, so
        with ``w ~ N(0, tau^2 Lambda)`` (Johndrow, Orenstein & Bhattacharya 2020, Sec. 2.1)::

            log p(log tau | lam, latents) = (1 - d) log tau - log|L| + |u|^2 / 2 - log(1 + tau^2 / s^2) + const

        (``-d log tau`` from ``|tau^2 Lambda|^(-1/2)``, ``+ log tau`` the Jacobian of ``log tau``,
        ``-log(1 + tau^2/s^2)`` the half-Cauchy ``C+(0, s)`` prior with ``xi`` integrated out).
        The logarithms of ``diag(L)`` and ``1 + tau^2/s^2`` are taken in one lane-aligned call.
        """
        from ._gaussian import cholesky as _cholesky

        v = (lam2 * tau2[..., None]).clamp(1e-300, 1e300)
        L = _cholesky(P + torch.diag_embed(1.0 / v))
        u = torch.linalg.solve_triangular(L, rhs[..., None], upper=False)
        logs = lanewise(torch.log, torch.cat([L.diagonal(dim1=-2, dim2=-1),
                                              (1.0 + tau2 / self.prior.global_scale**2)[..., None]], -1))
        target = 0.5 * (u * u).sum((-2, -1)) - logs.sum(-1)
        return target, L, u

    def _tau_step(self, st: _State, P: torch.Tensor, rhs: torch.Tensor, generator: Generator, key: str):
        """The horseshoe's global scale, blocked with the weights: ``tau | lam, latents`` with ``w`` (and
        ``xi``) integrated out, by ``tau_steps`` Metropolis-Hastings random-walk steps on ``log tau``
        (Johndrow, Orenstein & Bhattacharya 2020, "Scalable approximate MCMC algorithms for the
        horseshoe prior", JMLR 21(73), Sec. 2.1 and Algorithm 1, the exact version: no thresholding
        of ``X D X^T``; here in the ``d x d`` precision form the weight step factorises anyway).

        Each step proposes ``log tau' = log tau + e``, ``e = tau_proposal_sd * N(0, 1)`` (so ``tau'^2 =
        tau^2 exp(2 e)``) and accepts with probability ``min(1, exp((1 - d) e + target(tau') -
        target(tau)))`` (``_tau_target``), each replication on its own; ``xi | tau`` is drawn
        afterwards in ``_scale_step``. Sets ``st.aux["tau2"]``, ``st.v`` and ``self.last_tau_accept
        [*b]`` (1.0 where the last proposal was accepted, for diagnostics and the benchmark); returns
        ``(L, u)`` of the accepted ``tau`` for the weight step ``w | tau, lam, latents ~ N(L^-T u, Q^-1)``.
        """
        aux = st.aux
        lam2 = aux["lam2"]
        tau2 = aux["tau2"]
        cur, L, u = self._tau_target(P, rhs, lam2, tau2)
        acc = torch.zeros_like(tau2)
        shape = tuple(tau2.shape)
        for i in range(self.tau_steps):
            e = self.tau_proposal_sd * standard_normal(shape, generator, key=f"{key}/tau-mh{i}")
            prop = (tau2 * lanewise(torch.exp, 2.0 * e)).clamp(1e-300, 1e300)
            new, L_new, u_new = self._tau_target(P, rhs, lam2, prop)
            logu = -_exp_draw(shape, generator, f"{key}/tau-mh{i}-u")  # log U
            ok = torch.isfinite(new) & (logu < (1.0 - self.dim) * e + new - cur)
            acc = ok.to(_DTYPE)
            tau2 = torch.where(ok, prop, tau2)
            cur = torch.where(ok, new, cur)
            L = torch.where(ok[..., None, None], L_new, L)
            u = torch.where(ok[..., None, None], u_new, u)
        aux["tau2"] = tau2
        self.last_tau_accept = acc
        st.v = (lam2 * tau2[..., None]).clamp_min(1e-300)
        return L, u

    def _rescale_step(self, st: _State, generator: Generator, key: str) -> None:
        """Move ``tau`` and every ``lam_j`` in opposite directions, their products (the prior sd of
        each weight) unchanged: ``log tau' = log tau + e``, ``log lam_j' = log lam_j - e``, ``e ~
        N(0, rescale_sd^2)``, ``tau_steps`` Metropolis-Hastings steps, ``[*b]`` each.

        Given ``w`` the likelihood and ``w``'s prior do not change along this direction, so the
        log acceptance ratio is that of the half-Cauchy densities of ``tau ~ C+(0, s)`` and ``lam_j
        ~ C+(0, c_j)`` on the log scale (the auxiliary ``nu`` and ``xi`` integrated out, redrawn
        after): ``(1 - d) e - sum log(1 + x'^2 / scale^2) + sum log(1 + x^2 / scale^2)`` over ``x in
        (tau, lam_1 .. lam_d)``. This is the direction the Gibbs steps ``lam | tau`` and ``tau | lam``
        explore slowly when most weights are shrunk to zero (a small ``tau`` and large ``lam_j`` trade
        off); a parameter-expansion move in the sense of Liu & Wu (1999) / Yu & Meng (2011), here as a
        random walk. The proposal sd, ``2.4 / sqrt((d + 1) / 2)``, depends only on ``d`` (a symmetric
        proposal).
        """
        p, aux = self.prior, st.aux
        tau2, lam2 = aux["tau2"], aux["lam2"]
        s2, c2 = p.global_scale**2, p.local_scale**2
        sd = 2.4 / math.sqrt(0.5 * (self.dim + 1))

        def penalty(t2, l2):  # sum of log(1 + x^2 / scale^2), one lane-aligned call
            return lanewise(torch.log1p, torch.cat([(t2 / s2)[..., None], l2 / c2], -1)).sum(-1)

        cur = penalty(tau2, lam2)
        shape = tuple(tau2.shape)
        for i in range(self.tau_steps):
            e = sd * standard_normal(shape, generator, key=f"{key}/rescale{i}")
            f = lanewise(torch.exp, 2.0 * e)
            t2, l2 = (tau2 * f).clamp(1e-300, 1e300), (lam2 / f[..., None]).clamp(1e-300, 1e300)
            new = penalty(t2, l2)
            ok = torch.isfinite(new) & (-_exp_draw(shape, generator, f"{key}/rescale{i}-u")
                                        < (1.0 - self.dim) * e - new + cur)
            tau2, cur = torch.where(ok, t2, tau2), torch.where(ok, new, cur)
            lam2 = torch.where(ok[..., None], l2, lam2)
        aux["tau2"], aux["lam2"] = tau2, lam2

    def _scaled_stats(self, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        if self._scaled is None:
            self._scaled = ((self._xtx * scale, self._xty * scale) if scale != 1.0 else (self._xtx, self._xty))
        return self._scaled

    def _scale_step(self, st: _State, generator: Generator, key: str, normals: torch.Tensor | None = None,
                    inner: bool = False) -> None:
        """Scales given the weights (Laplace, Student-t: per weight; horseshoe: ``lam``, ``nu``, ``xi`` and,
        ``tau_scheme="conditional"``, ``tau``), in place on ``st``. ``inner``: a horseshoe inner round
        of the marginal scheme (``xi``, which that scheme does not use, is drawn once per sweep)."""
        p = self.prior
        if p.kind == "gaussian":
            return
        r = st.w if self._zero_loc else st.w - p.loc
        shape = tuple(r.shape)
        if p.kind == "laplace":
            # Park & Casella (2008): 1/v_j | w ~ InvGauss(mean 1/(b |w_j - m_j|), shape 1/b^2)
            if normals is None:
                normals = standard_normal((*self.batch_shape, self.dim, 2), generator, key=key + "/lasso")
            u = standard_uniform(shape, generator, key=key + "/lasso-u").numpy()
            v, inv = _laplace_variance(r.numpy(), self._b_np, self._shape4_np, normals[..., 1].numpy(), u)
            st.v, st.inv = torch.from_numpy(v), torch.from_numpy(inv)
            return
        elif p.kind == "student":
            # g_j | w ~ Gamma((nu + 1)/2, rate (nu + (r_j / s_j)^2) / 2)
            a = 0.5 * (p.df + 1.0)
            rate = 0.5 * (p.df + (r / p.scale) ** 2)
            g = _gamma(a, generator, key + "/t") / rate
            st.aux["g"] = g
            st.v = p.scale**2 / g.clamp_min(1e-300)
        else:
            # Makalic & Schmidt (2016), Sec. 2, with sigma^2 = 1 (conditionals in the module docstring)
            aux = st.aux
            w2 = r * r
            d = self.dim
            if self.tau_scheme == "marginal":
                self._rescale_step(st, generator, key)
                aux["nu"] = (1.0 / p.local_scale**2 + 1.0 / aux["lam2"]) / _exp_draw(shape, generator, key + "/nu0")
            rate = 1.0 / aux["nu"] + w2 / (2.0 * aux["tau2"][..., None])
            aux["lam2"] = (rate / _exp_draw(shape, generator, key + "/lam")).clamp(1e-300, 1e300)
            rate = 1.0 / p.local_scale**2 + 1.0 / aux["lam2"]
            aux["nu"] = rate / _exp_draw(shape, generator, key + "/nu")
            if self.tau_scheme == "conditional":  # the per-coordinate IG step (kept for comparison)
                rate = 1.0 / aux["xi"] + (w2 / aux["lam2"]).sum(-1) / 2.0
                conc = torch.full(shape[:-1], 0.5 * (d + 1), dtype=_DTYPE, device=_CPU)
                aux["tau2"] = (rate / _gamma(conc, generator, key + "/tau")).clamp(1e-300, 1e300)
            # else tau was drawn with w integrated out before the weight step (_tau_step)
            if not inner:
                rate = 1.0 / p.global_scale**2 + 1.0 / aux["tau2"]
                aux["xi"] = rate / _exp_draw(shape[:-1], generator, key + "/xi")
            st.v = (aux["lam2"] * aux["tau2"][..., None]).clamp_min(1e-300)

    def _noise_step(self, st: _State, generator: Generator, key: str) -> None:
        a0, b0 = self._noise_prior
        w = st.w
        rss = self._yty - 2.0 * (w * self._xty).sum(-1) + (w[..., None, :] @ self._xtx @ w[..., None])[..., 0, 0]
        a = a0 + 0.5 * (self.n if self._n_eff is None else self._n_eff)
        st.s2 = (b0 + 0.5 * rss.clamp_min(0.0)) / _gamma(a, generator, key + "/noise")

    def sweep(self, st: _State, generator: Generator = None, key: str = "gibbs",
              batch: DrawBatch | None = None) -> torch.Tensor | None:
        """One full sweep ``latents | w``, ``w | scales, latents``, ``scales | w``, ``s2 | w`` in place on ``st``.

        With ``batch`` (a ``DrawBatch`` of ``S``): the weight step draws ``S`` weights from its
        conditional ``N(Lambda^-1 eta, Lambda^-1)`` (normals from ``batch``, everything else from
        ``generator``), the sweep goes on from the first and the ``[S, *b, d]`` weights are returned."""
        key = key + "/gibbs"
        n = self.n
        if (batch is None and self.likelihood == "logistic" and self.prior.kind == "gaussian"
                and self.forgetting is None and getattr(self, "row_mask", None) is None
                and self._X.device.type == "cpu"
                and (generator is None or type(generator) in (torch.Generator, ReplicationRNG))):
            self._logistic_sweep(st, generator, key)  # the same numbers in fewer operations
            return None
        z = extra = None
        if self.prior.kind == "laplace":  # one stream call per sweep: w's normals and the lasso step's
            normals = standard_normal((*self.batch_shape, self.dim, 2), generator, key=key + "/wl")
            z, extra = normals[..., :1], normals  # [..., 0]: the weights' normals, [..., 1]: the lasso's
        if batch is not None:
            z = standard_normal((*self.batch_shape, self.dim, 1), batch, key=key + "/w")  # [S, *b, d, 1]
        if self.likelihood == "gaussian":
            if st.s2 is not None:
                self._weight_step(st, generator, key, self._xty, None, 1.0 / st.s2, z)
            else:
                self._weight_step(st, generator, key, None, None, 1.0 / self._noise_var, z)
        elif self.likelihood == "probit":
            X, y = self._X[..., :n, :], self._y[..., :n]
            mu = (X @ st.w[..., None])[..., 0]
            extra_z = z
            z = truncated_normal_latent(mu, y, generator, key=key + "/z", sign=self._sign[..., :n])
            self._weight_step(st, generator, key, (X.mT @ z[..., None])[..., 0], None, 1.0, extra_z)
        else:
            start, wts = (0, None) if self.forgetting is None else self._row_weights()
            X, y = self._X[..., start:n, :], self._y[..., start:n]
            mask = self._restart_weights(start, n)
            if mask is not None:  # an adaptive restart's row weights per element ([*b, rows]; issue 43)
                wts = mask if wts is None else wts * mask
            psi = (X @ st.w[..., None])[..., 0]
            omega = polya_gamma(psi, generator, key=key + "/pg", terms=self.pg_terms, b=wts)
            if mask is not None:
                omega = torch.where(wts > 0, omega, torch.zeros((), dtype=_DTYPE, device=_CPU))  # a forgotten row: no latent
            prec = (X * omega[..., None]).mT @ X
            kappa = y - 0.5 if wts is None else wts * (y - 0.5)
            self._weight_step(st, generator, key, (X.mT @ kappa[..., None])[..., 0], prec, 1.0, z)
        draws = None
        if batch is not None:  # S weights of the same conditional; the chain goes on from the first
            draws, st.w = st.w, st.w[0].clone()
        if self.likelihood == "gaussian" and st.s2 is not None:
            self._noise_step(st, generator, key)
        self._scale_step(st, generator, key, extra)
        return draws

    def _logistic_context(self) -> tuple:
        """``(n, X buffer, y buffer, prior, X [*b, n, d], eta [*b, d, 1])``: what a logistic sweep under a
        Gaussian prior (no forgetting, no restart) keeps between ``add`` s: the rows and ``eta = Lambda_prior
        m0 + X^T kappa`` (``kappa = y - 1/2``), made as ``sweep`` makes them (the same numbers), anew when the
        rows, their buffers or the prior change."""
        ctx = getattr(self, "_logit_ctx", None)
        if ctx is None or ctx[0] != self.n or ctx[1] is not self._X or ctx[2] is not self._y or ctx[3] is not self.prior:
            n, p = self.n, self.prior
            X, y = self._X[..., :n, :], self._y[..., :n]
            rhs = (X.mT @ (y - 0.5)[..., None])[..., 0]
            eta = rhs if self._zero_loc else (p.precision @ p.loc[..., None])[..., 0] + rhs
            ctx = self._logit_ctx = (n, self._X, self._y, p, X, eta[..., None])
        return ctx

    def _logistic_sweep(self, st: _State, generator: Generator, key: str) -> None:
        """``sweep`` of a logistic chain under a Gaussian prior (no forgetting or restart, no
        ``batch``), bit for bit: ``omega | w`` (Polya-Gamma, ``polya_gamma``), then ``w | omega`` with
        the per-``add`` terms from ``_logistic_context`` (the bank of chance draws, ``TSASC(chance_refresh=)``,
        runs ``S`` such sweeps on fixed rows)."""
        from ._gaussian import cholesky as _cholesky

        _, _, _, p, X, eta = self._logistic_context()
        psi = (X @ st.w[..., None])[..., 0]
        omega = polya_gamma(psi, generator, key + "/pg", terms=self.pg_terms)
        L = _cholesky((X * omega[..., None]).mT @ X + p.precision)
        u = torch.linalg.solve_triangular(L, eta, upper=False)
        z = standard_normal((*self.batch_shape, self.dim, 1), generator, key=key + "/w")
        st.w = torch.linalg.solve_triangular(L.mT, u + z, upper=True)[..., 0]
        self.last_conditional = (L, u)

    def _restart_weights(self, start: int, n: int) -> torch.Tensor | None:
        """The weights of rows ``start .. n`` per batch element left by adaptive restarts
        (``restart``), ``[*b, n - start]``, or None when no element has restarted."""
        mask = getattr(self, "row_mask", None)
        if mask is None:
            return None
        if mask.shape[-1] < n:  # rows learned since the last restart weigh 1
            mask = self.row_mask = torch.cat(
                [mask, torch.ones((*self.batch_shape, n - mask.shape[-1]), dtype=_DTYPE, device=_CPU)], -1)
        return mask[..., start:n]

    def restart(self, alarm: torch.Tensor, keep: float) -> None:
        """Adaptive forgetting's restart (issue 43): what the batch elements ``alarm [*b]`` learned so
        far weighs ``keep`` (0: forgotten; the prior kept) from now on, as a fixed factor weighs old rows.

        Gaussian likelihood: the sufficient statistics ``X^T X, X^T y, y^T y`` and the count the
        noise step sees (``_n_eff``) are multiplied by ``keep`` (the likelihood raised to ``keep``,
        exactly). Logistic: each old row's weight (``row_mask``) is multiplied by ``keep`` in every
        later sweep (the row's likelihood raised to its weight, Polya-Gamma ``PG(w, .)`` latents).
        Probit: refused (the Albert-Chib augmentation has no weighted form)."""
        if self.likelihood == "probit":
            raise ValueError("restart: the Gibbs engine's probit likelihood does not forget; use "
                             "likelihood='logistic'")
        if self.likelihood == "gaussian":
            n_eff = torch.full(tuple(self.batch_shape), float(self.n), dtype=_DTYPE, device=_CPU) \
                if self._n_eff is None else self._n_eff
            self._xtx, self._xty, self._yty, self._n_eff = restart_statistics(
                self._xtx, self._xty, self._yty, n_eff, alarm, keep)
            self._scaled, self._fixed = None, None
            return
        n = self.n
        mask = self._restart_weights(0, n)
        if mask is None:
            mask = torch.ones((*self.batch_shape, n), dtype=_DTYPE, device=_CPU)
        self.row_mask = torch.where(alarm[..., None], mask * keep, mask).clone()
        self._fixed = None

    def _row_weights(self) -> tuple[int, torch.Tensor]:
        """``forgetting_weights(forgetting, n)``, cached per ``n``."""
        cached = getattr(self, "_weights_cache", None)
        if cached is None or cached[0] != self.n:
            cached = self._weights_cache = (self.n, forgetting_weights(self.forgetting, self.n))
        return cached[1]

    # ------------------------------------------------------------------ queries
    def _pending_burn_in(self) -> bool:
        return self.n > 0 and self.n - self._n_at_draw >= max(self._n_at_draw, 1)

    def draw(self, generator: Generator = None, key: str = "weights") -> torch.Tensor:
        """Advance the chain by ``sweeps`` sweeps (plus ``burn_in`` if the data at least doubled
        since the last draw) and return the weights, ``[*b, d]``.

        Under a ``DrawBatch`` of ``S`` (propensities, ``action_probabilities``): ``[S, *b, d]``
        weights, made on a copy of the chain (``_draw_batch``)."""
        if isinstance(generator, DrawBatch):
            return self._draw_batch(generator, key)
        count = self.sweeps + (self.burn_in if self._pending_burn_in() else 0)
        for _ in range(count):
            self.sweep(self.state, generator, key)
        self._n_at_draw = self.n
        return self.state.w

    def _draw_batch(self, batch: DrawBatch, key: str) -> torch.Tensor:
        """``S = batch.num_draws`` draws ``[S, *b, d]`` without moving the chain beyond one ordinary draw.

        How: on a copy of the chain state, the draw's sweeps run as an ordinary draw would (the
        latent variables, Polya-Gamma or truncated normals, and the scales, from
        ``batch.generator``) up to the last weight step, which draws ``S`` weights from its
        Gaussian conditional at once (``S`` triangular solves with the Cholesky factor it
        computes anyway). The ``S`` draws are independent given the sweep's latent variables,
        which the played draw shares, so ``(1 + n_a) / S`` estimates the probability of the
        played action given everything drawn before its weights: a valid propensity (that
        randomness does not depend on the outcome).

        With ``batch.played`` (the ``Decider``) the chain then continues from the first draw, as
        after one ordinary draw. Otherwise (``action_probabilities``, a query) the chain is left
        exactly as it was, and the draws come in up to 20 groups, each from its own copy of the
        chain with its own latent variables, so that the estimate averages over them too.

        Cost: the sweeps of one ordinary draw plus ``S`` solves of a ``d x d`` triangular system
        (about the cost of one more sweep at ``S = 200``, ``d = 6`` and a few hundred rows; a
        sweep of a 0/1 likelihood grows with the rows ``n``); a query pays that per group.
        """
        count = self.sweeps + (self.burn_in if self._pending_burn_in() else 0)
        S, shared = batch.num_draws, batch.generator
        groups = 1 if batch.played else min(S, 20)
        saved = self.last_conditional
        out = []
        for g, size in enumerate(int(c.numel()) for c in torch.arange(S, device=_CPU).tensor_split(groups)):
            st = self.state.clone()
            for _ in range(count - 1):
                self.sweep(st, shared, key)
            out.append(self.sweep(st, shared, key, batch=DrawBatch(size, batch.replications, shared)))
            if g == 0 and batch.played:
                self.state, saved = st, self.last_conditional
                self._n_at_draw = self.n
        self.last_conditional = saved
        return out[0] if groups == 1 else torch.cat(out)

    def fit(self, generator: Generator = None) -> None:
        """Run ``burn_in`` sweeps now (e.g. after one large ``update``)."""
        gen = generator if generator is not None else torch.Generator(device=_CPU).manual_seed(self.seed)
        for _ in range(self.burn_in):
            self.sweep(self.state, gen, "fit")
        self._n_at_draw = self.n

    def run(self, sweeps: int, generator: Generator = None, key: str = "run") -> torch.Tensor:
        """``[sweeps, *b, d]`` weights of ``sweeps`` further sweeps of the chain (state advanced)."""
        out = []
        for _ in range(int(sweeps)):
            self.sweep(self.state, generator, key)
            out.append(self.state.w.clone())
        self._n_at_draw = self.n
        return torch.stack(out)

    def latent_values(self, state: _State | None = None) -> dict[str, torch.Tensor]:
        """Copies of the latent variables of ``state`` (default: the chain's) besides ``w``, by
        name (read only; for diagnostics): horseshoe ``"tau" [*b]`` (global scale) and ``"lam"
        [*b, d]`` (local scales); Laplace and Student-t ``"prior_var" [*b, d]``, the mixing
        variance ``v_j`` of ``w_j ~ N(m_j, v_j)``; ``"noise_var" [*b]`` when the noise variance
        is sampled. Empty for a Gaussian prior with a known noise."""
        st = self.state if state is None else state
        out: dict[str, torch.Tensor] = {}
        if self.prior.kind == "horseshoe":
            out["tau"], out["lam"] = st.aux["tau2"].sqrt(), st.aux["lam2"].sqrt()
        elif self.prior.kind in ("laplace", "student"):
            out["prior_var"] = st.v.clone()
        if st.s2 is not None:
            out["noise_var"] = st.s2.clone()
        return out

    def summary(self, X: torch.Tensor | None, generator: Generator = None, link=None):
        """Posterior summaries from ``predict_sweeps`` sweeps of a copy of the chain (after
        ``burn_in`` sweeps); the model's own chain is not advanced.

        Returns ``(mean_w [*b, d], mean [*b, k], var [*b, k])`` of ``f = x^T w`` (``link(x^T w)``
        when ``link`` is given) at ``X [*b, k, d]`` (``None``: only the weight mean). The
        Gaussian-likelihood summaries are Rao-Blackwellised: averages of the conditional
        means and variances of ``w`` given the scales (law of total variance).
        """
        gen = generator if generator is not None else torch.Generator(device=_CPU).manual_seed(self.seed + 7919 * self.n)
        st = self.state.clone()
        saved = self.last_conditional
        for _ in range(self.burn_in):
            self.sweep(st, gen, "predict")
        means, f_mean, f_sq, f_var = [], 0.0, 0.0, 0.0
        S = self.predict_sweeps
        for _ in range(S):
            self.sweep(st, gen, "predict")
            L, u = self.last_conditional
            m = torch.linalg.solve_triangular(L.mT, u, upper=True)[..., 0]
            means.append(m)
            if X is None:
                continue
            if link is None:
                f = (X @ m[..., None])[..., 0]
                v = torch.linalg.solve_triangular(L, X.mT, upper=False)
                f_var = f_var + (v * v).sum(-2)
            else:
                f = link((X @ st.w[..., None])[..., 0])
            f_mean = f_mean + f
            f_sq = f_sq + f * f
        self.last_conditional = saved
        mean_w = torch.stack(means).mean(0)
        if X is None:
            return mean_w, None, None
        fm = f_mean / S
        var = (f_sq / S - fm * fm).clamp_min(0.0) + f_var / S
        return mean_w, fm, var
