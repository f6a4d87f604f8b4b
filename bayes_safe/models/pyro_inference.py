"""Posterior of linear-regression weights under any Pyro prior, by NUTS or SVI.

``PyroLinearPosterior`` approximates the posterior of ``w`` in

    w ~ prior,    y | X, w ~ Normal(X w, sigma)    (independent over the n rows),

where ``prior`` is any Pyro distribution over ``R^d`` or any Pyro model that samples its own
hyperparameters and returns ``w``, and ``sigma`` is either known or has a prior on
``sigma^2``. It is the fallback engine of ``BayesianLinear``
when the prior is neither conjugate nor a Gaussian scale mixture that the Gibbs engine
(``gibbs.py``: Laplace, Student-t, Cauchy, horseshoe) samples, and the engine of
``inference="nuts"`` / ``"svi"``: every ``PyroLinearPosterior.fit`` refits from scratch on
all the data, so it is far slower than a conjugate update or a Gibbs sweep and is meant for
problems of modest size (and for validating the Gibbs engine, as its accuracy tests do).

Example:
    ```python
    import pyro.distributions as dist
    post = PyroLinearPosterior(dist.Laplace(0.0, 1.0).expand([3]).to_event(1), 3,
                               noise_std=0.1, num_samples=100, warmup_steps=100)
    post.fit(X, y)    # X: [n, 3], y: [n]
    post.draws        # [num_chains * num_samples, 3] posterior draws of w
    ```
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager

import numpy as np
import pyro
import pyro.distributions as dist
import pyro.util
import torch
from pyro import poutine
from pyro.distributions.torch_distribution import TorchDistributionMixin
from pyro.infer import MCMC, NUTS, SVI, Trace_ELBO
from pyro.infer.autoguide import AutoMultivariateNormal
from pyro.infer.autoguide.initialization import init_to_median, init_to_uniform
from pyro.optim import Adam

from .linear import check_real_support

__all__ = ["PyroLinearPosterior", "check_prior_model"]

_DTYPE = torch.float64
# Site names the engine itself uses; a callable prior must not sample sites with these names.
_NOISE_SITE, _OBS_SITE, _WEIGHT_SITE = "noise_var", "y", "w"
# First entry of the seed path, so that the streams of different purposes never coincide.
_PRIOR_STREAM, _FIT_STREAM, _CHECK_STREAM = 0, 1, 2


def _child_seed(seed: int, *path: int) -> int:
    """A 32-bit seed derived from ``seed`` and an integer path (stable across platforms)."""
    return int(np.random.SeedSequence([seed, *path]).generate_state(1)[0])


@contextmanager
def _seeded(seed: int):
    """Seed torch, ``random`` and numpy for a block, then restore their previous states."""
    saved = pyro.util.get_rng_state()
    try:
        pyro.set_rng_seed(seed)
        yield
    finally:
        pyro.util.set_rng_state(saved)


def _float64_init(strategy: Callable) -> Callable:
    """Wrap a Pyro init strategy so that initial values (hence the unconstrained parameters
    that NUTS and the autoguide build from them) are float64 even if a prior is float32."""

    def init(site=None):
        if site is None:
            return init
        return strategy(site).to(_DTYPE)

    return init


def _cast_distribution(d: torch.distributions.Distribution) -> torch.distributions.Distribution:
    """A shallow copy of ``d`` whose floating tensors (also those of nested ``base_dist``s)
    are float64. Best effort: the caller checks the result and keeps ``d`` if it fails."""
    new = copy.copy(d)
    for key, value in vars(d).items():
        if torch.is_tensor(value) and value.is_floating_point() and value.dtype != _DTYPE:
            new.__dict__[key] = value.to(_DTYPE)
        elif isinstance(value, torch.distributions.Distribution):
            new.__dict__[key] = _cast_distribution(value)
    return new


def _as_float64_distribution(d: torch.distributions.Distribution):
    """``d`` with float64 parameters if that can be done safely, else ``d`` itself (the model
    then casts its draws to float64 instead)."""
    try:
        cast = _cast_distribution(d)
        value = cast.sample()
        ok = value.dtype == _DTYPE and value.shape == d.sample().shape
        ok = ok and bool(torch.isfinite(cast.log_prob(value)).all())
    except Exception:  # noqa: BLE001 - any failure just means "keep the original"
        ok = False
    return cast if ok else d


def _positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def check_prior_model(prior, dim: int, seed: int = 0):
    """Check a prior on ``w`` (a Pyro distribution with event shape ``[dim]`` or a callable Pyro
    model returning ``w [dim]``) and return ``(distribution or None, callable or None)``.

    Raises ``TypeError`` / ``ValueError`` naming ``prior`` for every rule of
    ``PyroLinearPosterior``'s ``prior`` argument (shape, support, reserved site names).
    """
    expected = [dim]
    if isinstance(prior, torch.distributions.Distribution) and not isinstance(
        prior, TorchDistributionMixin
    ):
        raise TypeError(
            f"prior must be a Pyro distribution (pyro.distributions), not the plain "
            f"torch.distributions.{type(prior).__name__}, which pyro.sample cannot use"
        )
    if isinstance(prior, TorchDistributionMixin):
        if tuple(prior.event_shape) != (dim,):
            raise ValueError(
                f"prior must have event_shape {expected} (one event = the weight vector), "
                f"got event_shape {list(prior.event_shape)}; for independent weights use "
                f"e.g. dist.Laplace(0., 1.).expand({expected}).to_event(1)"
            )
        if prior.batch_shape != ():
            raise ValueError(
                f"prior must have batch_shape [] (problems in a batch share the prior), "
                f"got batch_shape {list(prior.batch_shape)}"
            )
        check_real_support(prior, "prior")
        with _seeded(_child_seed(seed, _CHECK_STREAM)):
            return _as_float64_distribution(prior), None
    if not callable(prior):
        raise TypeError(
            "prior must be a Pyro distribution with event_shape "
            f"{expected} or a callable Pyro model returning w of shape {expected}; "
            f"got {type(prior).__name__}"
        )
    with _seeded(_child_seed(seed, _CHECK_STREAM)), torch.no_grad():
        try:
            trace = poutine.trace(prior).get_trace()
        except Exception as err:
            raise ValueError(
                f"prior: calling the prior model with no arguments failed: {err!r}"
            ) from err
    w = trace.nodes["_RETURN"]["value"]
    if not torch.is_tensor(w) or tuple(w.shape) != (dim,):
        got = list(w.shape) if torch.is_tensor(w) else type(w).__name__
        raise ValueError(
            f"prior: a callable prior must return the weights as a tensor of shape "
            f"{expected}, got {got}"
        )
    for name, node in trace.nodes.items():
        if node["type"] != "sample":
            continue
        if name in (_NOISE_SITE, _OBS_SITE):
            raise ValueError(
                f"prior: the site name {name!r} is reserved for the likelihood; rename "
                "that site in the prior model"
            )
        if name == _WEIGHT_SITE and not torch.equal(node["value"].to(_DTYPE), w.to(_DTYPE)):
            raise ValueError(
                f"prior: the site name {_WEIGHT_SITE!r} is reserved for the returned "
                "weights; rename the site or return its value"
            )
        if node["value"] is w or name == _WEIGHT_SITE:
            # the weights are this site's draw: its distribution must cover R^d
            check_real_support(node["fn"], f"prior (site {name!r}, the returned weights)")
    return None, prior


class PyroLinearPosterior:
    """Approximate posterior of ``w`` for ``y ~ Normal(X w, sigma)`` under any prior, by NUTS
    (default) or SVI.

    Args:
        prior: the prior of ``w``. Either a Pyro distribution with ``event_shape == [dim]``
            and ``batch_shape == []`` (e.g. ``dist.Laplace(0., 1.).expand([d]).to_event(1)``,
            ``dist.MultivariateNormal(...)``), sampled as the site ``"w"``; or a callable
            Pyro model taking no arguments that samples its own (continuous) hyperparameters
            with ``pyro.sample`` and returns ``w`` of shape ``[dim]``, e.g. a horseshoe:

            ```python
            def horseshoe():
                tau = pyro.sample("tau", dist.HalfCauchy(1.0))
                lam = pyro.sample("lam", dist.HalfCauchy(torch.ones(d)).to_event(1))
                return pyro.sample("w", dist.Normal(0.0, tau * lam).to_event(1))
            ```

            A callable is run once at construction to check what it returns. It must not use
            the site names ``"y"`` and ``"noise_var"``, and a site it names ``"w"`` must be
            the returned weights. Float32 priors work: their draws are cast to float64.
            The weights take any real value, so a distribution prior (or the site a callable
            returns) must be supported on all of ``R^d``: ``Gamma``, ``Beta``, ``HalfCauchy``
            ... on the weights raise ``ValueError`` naming ``prior`` (hyperparameters of a
            callable may have any support).
        dim: ``d``, the number of weights.
        noise_std: the known noise standard deviation ``sigma > 0``. Give exactly one of
            ``noise_std`` and ``noise_prior``.
        noise_prior: a prior on the noise variance ``sigma^2``, sampled as the site
            ``"noise_var"``; typically ``dist.InverseGamma(a, b)``. Any scalar distribution
            supported on the positive reals is accepted.
        batch_shape: shape of a batch of independent problems (same prior and settings,
            different data). They are fitted one after another, each with its own NUTS run
            (own step-size and mass-matrix adaptation) or SVI run. This is deliberate: a
            joint run would share one step size across problems of different scales. It
            costs ``prod(batch_shape)`` single fits.
        method: ``"nuts"`` (default) or ``"svi"``.
        num_samples: NUTS: kept draws per chain; SVI: draws from the fitted guide.
        warmup_steps: NUTS adaptation steps per chain (discarded).
        num_chains: NUTS chains per problem. They run one after another in this process,
            each as its own ``pyro.infer.MCMC`` run with its own seed (not through pyro's
            multi-process chains, whose use depends on the machine's CPU count), so results
            do not depend on the machine.
        svi_steps: SVI optimisation steps (``Trace_ELBO``, one particle).
        svi_lr: SVI Adam learning rate.
        seed: non-negative int. Per-problem and per-chain seeds are derived from it and the
            batch and chain indices; equal seed and data give identical draws. Global random
            states (torch, numpy, ``random``) and Pyro's parameter store are restored after
            every call.

    Shapes (``S = num_chains * num_samples`` for NUTS, ``num_samples`` for SVI):
        ``fit(X, y)`` takes ``X: [*batch_shape, n, d]`` and ``y: [*batch_shape, n]``;
        ``draws`` is ``[S, *batch_shape, d]``, ``noise_draws`` ``[S, *batch_shape]``.

    Cost of one ``fit``, per problem: NUTS runs ``num_chains * (warmup_steps +
    num_samples)`` iterations, each ``2^k`` gradient evaluations for a tree depth ``k`` that
    grows with how correlated and badly scaled the posterior is (up to ``2^10``); SVI runs
    ``svi_steps`` gradient steps plus ``num_samples`` guide draws. A gradient evaluation costs
    ``O(n d)`` for the likelihood plus the prior's own cost. Both are dominated by Pyro's
    per-step Python overhead at small ``n`` and ``d`` (about a millisecond per gradient
    evaluation), so expect seconds per problem; ``fit_seconds`` records the wall time.
    The tensors are tiny, so call ``torch.set_num_threads(1)`` in the calling program:
    intra-op threads only add overhead here and, on a busy machine, made fits 10-20 times
    slower. This class does not change the thread count itself.

    Attributes:
        fit_seconds: wall time of the last ``fit`` (0.0 before the first).
        fitted: whether ``fit`` has been called.
        svi_losses: ``[*batch_shape, svi_steps]`` ELBO losses of the last SVI fit, else None.
    """

    def __init__(
        self,
        prior,
        dim: int,
        *,
        noise_std: float | None = None,
        noise_prior=None,
        batch_shape: Sequence[int] = (),
        method: str = "nuts",
        num_samples: int = 200,
        warmup_steps: int = 200,
        num_chains: int = 1,
        svi_steps: int = 1000,
        svi_lr: float = 0.02,
        seed: int = 0,
    ):
        self.dim = _positive_int("dim", dim)
        self.batch_shape = torch.Size(int(b) for b in batch_shape)
        if any(b < 1 for b in self.batch_shape):
            raise ValueError(f"batch_shape must contain positive sizes, got {list(batch_shape)}")
        if method not in ("nuts", "svi"):
            raise ValueError(f"method must be 'nuts' or 'svi', got {method!r}")
        self.method = method
        self.num_samples = _positive_int("num_samples", num_samples)
        self.warmup_steps = _positive_int("warmup_steps", warmup_steps, minimum=0)
        self.num_chains = _positive_int("num_chains", num_chains)
        self.svi_steps = _positive_int("svi_steps", svi_steps)
        if not (isinstance(svi_lr, (int, float)) and math.isfinite(svi_lr) and svi_lr > 0):
            raise ValueError(f"svi_lr must be a positive finite number, got {svi_lr!r}")
        self.svi_lr = float(svi_lr)
        self.seed = _positive_int("seed", seed, minimum=0)

        self.noise_std, self.noise_prior = self._check_noise(noise_std, noise_prior)
        self.prior = prior
        self._prior_dist, self._prior_fn = self._check_prior(prior)

        self.fit_seconds = 0.0
        self.fitted = False
        self.svi_losses: torch.Tensor | None = None
        self._draws: torch.Tensor | None = None
        self._noise_draws: torch.Tensor | None = None
        self._chains: dict[str, torch.Tensor] = {}
        self._sample_stats: dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------ validation
    def _check_noise(self, noise_std, noise_prior):
        if (noise_std is None) == (noise_prior is None):
            raise ValueError(
                "noise_std / noise_prior: give exactly one of them (noise_std for a known "
                "noise standard deviation, noise_prior for a prior on the noise variance); "
                f"got noise_std={noise_std!r}, noise_prior={noise_prior!r}"
            )
        if noise_std is not None:
            if torch.is_tensor(noise_std) and noise_std.numel() == 1:
                noise_std = noise_std.item()
            if isinstance(noise_std, bool) or not isinstance(noise_std, (int, float, np.number)):
                raise ValueError(f"noise_std must be a positive number, got {noise_std!r}")
            if not (math.isfinite(noise_std) and noise_std > 0):
                raise ValueError(f"noise_std must be positive and finite, got {noise_std!r}")
            return float(noise_std), None
        if not isinstance(noise_prior, TorchDistributionMixin):
            raise TypeError(
                "noise_prior must be a Pyro distribution (pyro.distributions) on the noise "
                f"variance, e.g. dist.InverseGamma(2.0, 1.0); got {type(noise_prior).__name__}"
            )
        if noise_prior.batch_shape != () or noise_prior.event_shape != ():
            raise ValueError(
                "noise_prior must be a scalar distribution (batch_shape [] and event_shape []), "
                f"got batch_shape {list(noise_prior.batch_shape)}, "
                f"event_shape {list(noise_prior.event_shape)}"
            )
        support = noise_prior.support
        if bool(support.check(torch.tensor(-1.0))) or not bool(support.check(torch.tensor(1.0))):
            raise ValueError(
                f"noise_prior must be supported on the positive reals (a prior on sigma^2), "
                f"got support {support}"
            )
        with _seeded(_child_seed(self.seed, _CHECK_STREAM)):
            return None, _as_float64_distribution(noise_prior)

    def _check_prior(self, prior):
        return check_prior_model(prior, self.dim, self.seed)

    # ------------------------------------------------------------------ the model
    def _sample_weights(self) -> torch.Tensor:
        if self._prior_dist is not None:
            w = pyro.sample(_WEIGHT_SITE, self._prior_dist)
        else:
            w = self._prior_fn()
        return w.to(_DTYPE)

    def _model(self, X: torch.Tensor, y: torch.Tensor) -> None:
        """One problem: ``X: [n, d]``, ``y: [n]`` (float64)."""
        w = self._sample_weights()
        if self.noise_prior is not None:
            scale = pyro.sample(_NOISE_SITE, self.noise_prior).to(_DTYPE).sqrt()
        else:
            scale = X.new_tensor(self.noise_std)
        pyro.sample(_OBS_SITE, dist.Normal(X @ w, scale).to_event(1), obs=y)

    def _weights_from_latents(self, latents: dict[str, torch.Tensor]) -> torch.Tensor:
        """``[N, d]`` weights for ``N`` joint draws of the latent sites (``name -> [N, ...]``).
        A callable prior is replayed with its sites fixed to each draw (N cheap calls)."""
        if self._prior_fn is None:
            return latents[_WEIGHT_SITE].to(_DTYPE)
        n = next(iter(latents.values())).shape[0]
        out = []
        with torch.no_grad():
            for i in range(n):
                draw = {k: v[i] for k, v in latents.items()}
                out.append(poutine.condition(self._prior_fn, data=draw)().to(_DTYPE))
        return torch.stack(out)

    # ------------------------------------------------------------------ prior draws
    def _sample_prior(self, num_samples: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        total = num_samples * self.batch_shape.numel()
        with _seeded(_child_seed(self.seed, _PRIOR_STREAM, num_samples)), torch.no_grad():
            if self._prior_dist is not None:
                w = self._prior_dist.sample((total,)).to(_DTYPE)
            else:
                w = torch.stack([self._prior_fn().to(_DTYPE) for _ in range(total)])
            noise = None
            if self.noise_prior is not None:
                noise = self.noise_prior.sample((total,)).to(_DTYPE)
        w = w.reshape(num_samples, *self.batch_shape, self.dim)
        if noise is not None:
            noise = noise.reshape(num_samples, *self.batch_shape)
        return w, noise

    def prior_draws(self, num_samples: int) -> torch.Tensor:
        """``[num_samples, *batch_shape, d]`` float64 draws of ``w`` from the prior.

        Reproducible: the same ``seed`` and ``num_samples`` give the same draws. A callable
        prior is called ``num_samples * prod(batch_shape)`` times.
        """
        return self._sample_prior(_positive_int("num_samples", num_samples))[0]

    @property
    def num_draws(self) -> int:
        """``S``, the number of draws in ``draws``."""
        return self.num_samples * (self.num_chains if self.method == "nuts" else 1)

    # ------------------------------------------------------------------ fitting
    def fit(self, X: torch.Tensor, y: torch.Tensor) -> None:
        """Fit the posterior on all the data, from scratch, and store its draws.

        Args:
            X: ``[*batch_shape, n, d]`` design matrices (cast to float64).
            y: ``[*batch_shape, n]`` responses (cast to float64).

        Costs ``prod(batch_shape)`` single fits (see the class docstring).
        """
        X = torch.as_tensor(X).detach().to(_DTYPE)
        y = torch.as_tensor(y).detach().to(_DTYPE)
        b = tuple(self.batch_shape)
        if X.dim() != len(b) + 2 or tuple(X.shape[: len(b)]) != b or X.shape[-1] != self.dim:
            raise ValueError(
                f"X must have shape [*batch_shape, n, d] = {[*b, 'n', self.dim]}, "
                f"got {list(X.shape)}"
            )
        if tuple(y.shape) != tuple(X.shape[:-1]):
            raise ValueError(
                f"y must have shape [*batch_shape, n] = {list(X.shape[:-1])}, got {list(y.shape)}"
            )
        if not (torch.isfinite(X).all() and torch.isfinite(y).all()):
            raise ValueError("X and y must be finite")

        start = time.perf_counter()
        Xf = X.reshape(self.batch_shape.numel(), *X.shape[-2:])  # [R, n, d]
        yf = y.reshape(self.batch_shape.numel(), y.shape[-1])  # [R, n]
        runs = []
        for r in range(Xf.shape[0]):
            if self.method == "nuts":
                runs.append(self._fit_nuts(Xf[r], yf[r], r))
            else:
                runs.append(self._fit_svi(Xf[r], yf[r], r))
        self._store(runs)
        self.fit_seconds = time.perf_counter() - start
        self.fitted = True

    def _fit_nuts(self, X, y, index):
        """Returns ``(latents name -> [C, D, ...], stats name -> [C, D], w [C, D, d])``."""
        per_chain = []
        for chain in range(self.num_chains):
            with _seeded(_child_seed(self.seed, _FIT_STREAM, index, chain)):
                kernel = NUTS(self._model, init_strategy=_float64_init(init_to_uniform))
                recorder = _NutsRecorder()
                mcmc = MCMC(
                    kernel,
                    num_samples=self.num_samples,
                    warmup_steps=self.warmup_steps,
                    num_chains=1,
                    disable_progbar=True,
                    hook_fn=recorder,
                )
                mcmc.run(X, y)
                samples = mcmc.get_samples(group_by_chain=True)  # name -> [1, D, ...]
                latents = {k: v[0].to(_DTYPE) for k, v in samples.items()}
                w = self._weights_from_latents(latents)
            per_chain.append((latents, recorder.stats(), w))
        latents = {k: torch.stack([c[0][k] for c in per_chain]) for k in per_chain[0][0]}
        latents[_WEIGHT_SITE] = torch.stack([c[2] for c in per_chain])
        stats = {k: torch.stack([c[1][k] for c in per_chain]) for k in per_chain[0][1]}
        return latents, stats, latents[_WEIGHT_SITE]

    def _fit_svi(self, X, y, index):
        """Returns ``(latents name -> [S, ...], ELBO losses [svi_steps], w [S, d])``."""
        with _seeded(_child_seed(self.seed, _FIT_STREAM, index, 0)), pyro.get_param_store().scope():
            pyro.clear_param_store()
            guide = AutoMultivariateNormal(self._model, init_loc_fn=_float64_init(init_to_median))
            svi = SVI(self._model, guide, Adam({"lr": self.svi_lr}), Trace_ELBO())
            losses = torch.tensor([svi.step(X, y) for _ in range(self.svi_steps)], dtype=_DTYPE)
            with torch.no_grad():
                draws = [guide(X, y) for _ in range(self.num_samples)]
            latents = {k: torch.stack([d[k] for d in draws]).to(_DTYPE) for k in draws[0]}
            w = self._weights_from_latents(latents)
        latents[_WEIGHT_SITE] = w
        return latents, losses, w

    def _store(self, runs) -> None:
        batch = tuple(self.batch_shape)
        if self.method == "nuts":
            # [C, D, R, ...] -> [C, D, *batch_shape, ...]
            def unflatten(t):
                t = torch.stack(t, dim=2)
                return t.reshape(*t.shape[:2], *batch, *t.shape[3:])

            self._chains = {k: unflatten([run[0][k] for run in runs]) for k in sorted(runs[0][0])}
            self._sample_stats = {k: unflatten([run[1][k] for run in runs]) for k in runs[0][1]}
            self._draws = self._chains[_WEIGHT_SITE].reshape(-1, *batch, self.dim)
            noise = self._chains.get(_NOISE_SITE)
            self._noise_draws = None if noise is None else noise.reshape(-1, *batch)
            self.svi_losses = None
        else:
            w = torch.stack([run[2] for run in runs], dim=1)  # [S, R, d]
            self._draws = w.reshape(w.shape[0], *batch, self.dim)
            self._noise_draws = None
            if self.noise_prior is not None:
                noise = torch.stack([run[0][_NOISE_SITE] for run in runs], dim=1)
                self._noise_draws = noise.reshape(noise.shape[0], *batch)
            losses = torch.stack([run[1] for run in runs])
            self.svi_losses = losses.reshape(*batch, self.svi_steps)
            self._chains, self._sample_stats = {}, {}

    # ------------------------------------------------------------------ results
    def _ensure_draws(self) -> None:
        if self._draws is None:  # before any fit: prior draws, cached
            self._draws, self._noise_draws = self._sample_prior(self.num_draws)

    @property
    def draws(self) -> torch.Tensor:
        """``[S, *batch_shape, d]`` float64 posterior draws of ``w`` (prior draws before
        ``fit``). NUTS chains are concatenated: draw ``c * num_samples + j`` is draw ``j``
        of chain ``c``."""
        self._ensure_draws()
        return self._draws

    @property
    def noise_draws(self) -> torch.Tensor | None:
        """``[S, *batch_shape]`` float64 draws of ``sigma^2`` (paired with ``draws``)
        when ``noise_prior`` is given (prior draws before ``fit``); None if the noise is
        known."""
        if self.noise_prior is None:
            return None
        self._ensure_draws()
        return self._noise_draws

    @property
    def chains(self) -> dict[str, torch.Tensor]:
        """Raw NUTS draws per chain, for ArviZ: ``name -> [chains, num_samples, *batch_shape,
        *site_shape]``. Names are the prior's latent sites, ``"w"`` (the weights, also for a
        callable prior) and ``"noise_var"`` when the noise has a prior. Empty for SVI and
        before ``fit``."""
        return dict(self._chains)

    @property
    def sample_stats(self) -> dict[str, torch.Tensor]:
        """NUTS per-draw statistics, ``name -> [chains, num_samples, *batch_shape]``:
        ``"diverging"`` (bool), ``"acceptance_rate"`` (mean acceptance probability of the
        trajectory), ``"step_size"`` (the adapted step size) and ``"lp"`` (log joint density
        in the unconstrained space, up to a constant). Read from the Pyro kernel's state;
        a statistic the kernel does not expose is left out. Empty for SVI and before
        ``fit``."""
        return dict(self._sample_stats)


class _NutsRecorder:
    """MCMC ``hook_fn`` that reads per-draw statistics off the NUTS kernel after each kept
    draw. Pyro keeps only running summaries, so the per-draw values are recovered from them:
    a new entry in the kernel's divergence list marks a divergent draw, and the acceptance
    probability is recovered from the running mean."""

    def __init__(self):
        self.rows: dict[str, list] = {
            "diverging": [], "acceptance_rate": [], "step_size": [], "lp": []
        }
        self._divergences = 0
        self._mean = 0.0

    def __call__(self, kernel, params, stage, i) -> None:
        if not stage.startswith("Sample"):
            return
        divergences = getattr(kernel, "_divergences", None)
        if divergences is not None:
            self.rows["diverging"].append(len(divergences) > self._divergences)
            self._divergences = len(divergences)
        mean = getattr(kernel, "_mean_accept_prob", None)
        if mean is not None:
            n = i + 1
            self.rows["acceptance_rate"].append(min(max(n * mean - (n - 1) * self._mean, 0.0), 1.0))
            self._mean = mean
        step = getattr(kernel, "step_size", None)
        if step is not None:
            self.rows["step_size"].append(float(step))
        energy = getattr(kernel, "_potential_energy_last", None)
        if energy is not None:
            self.rows["lp"].append(-float(energy))

    def stats(self) -> dict[str, torch.Tensor]:
        out = {}
        n = max(len(v) for v in self.rows.values())
        for name, values in self.rows.items():
            if len(values) == n and n > 0:  # drop a statistic that was not always available
                dtype = torch.bool if name == "diverging" else _DTYPE
                out[name] = torch.tensor(values, dtype=dtype)
        return out
