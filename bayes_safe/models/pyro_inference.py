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

NUTS is the exact reference: its ``sample_stats`` include the Hamiltonian ``energy`` (for
``az.bfmi`` / ``az.plot_energy``), its chains may run in worker processes with the same
draws (``parallel_chains``). SVI averages several ELBO particles per step and the guide
parameters over the end of the run (Polyak averaging) and stops when the averaged ELBO has
converged (``svi_converged``). Both show a progress bar on long fits (``progress``:
``bayes_safe.progress``, a widget in Jupyter, text on a terminal).

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
import multiprocessing
import os
import pickle
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager

import numpy as np
import pyro
import pyro.distributions as dist
import pyro.util
import torch
from pyro import poutine
from pyro.distributions.torch_distribution import TorchDistributionMixin
from pyro.infer import MCMC, NUTS, Trace_ELBO
from pyro.infer.autoguide import AutoMultivariateNormal
from pyro.infer.autoguide.initialization import init_to_median, init_to_uniform

from ._gaussian import check_real_support

__all__ = ["PyroLinearPosterior", "check_prior_model"]

_DTYPE = torch.float64
# Site names the engine itself uses; a callable prior must not sample sites with these names.
_NOISE_SITE, _OBS_SITE, _WEIGHT_SITE = "noise_var", "y", "w"
# First entry of the seed path, so that the streams of different purposes never coincide.
_PRIOR_STREAM, _FIT_STREAM, _CHECK_STREAM = 0, 1, 2
# parallel_chains="auto": expected seconds above which the chains run in worker processes, and
# the per-iteration guess before any NUTS fit.
_PARALLEL_SECONDS, _GUESS_SECONDS_PER_ITERATION = 10.0, 0.002


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




def _flag(name: str, value) -> bool | str:
    """``"auto"``, ``True`` or ``False`` (the form of ``progress`` and ``parallel_chains``)."""
    if isinstance(value, str) and value == "auto":
        return "auto"
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{name} must be 'auto', True or False, got {value!r}")


def _usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS reports it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - macOS / Windows
        return os.cpu_count() or 1


def _pool_context():
    """``forkserver`` where the OS has it (a fresh single-threaded server process forks the
    workers, with this module preloaded: safe after torch has started threads, unlike
    ``fork``, and fast, unlike ``spawn``), else ``spawn``."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["__main__", __name__])  # "__main__" is the default one
        return ctx
    return multiprocessing.get_context("spawn")  # pragma: no cover - Windows


def _run_chain_job(engine, X, y, W, index, chain, threads):
    """Worker entry point of the parallel chains: one NUTS chain, as ``_run_chain`` runs it
    in the calling process (same seed, same thread count, hence the same draws)."""
    torch.set_num_threads(threads)
    return engine._run_chain(X, y, W, index, chain)


class PyroLinearPosterior:
    """Approximate posterior of ``w`` for ``y ~ Normal(X w, sigma)`` under any prior, by NUTS
    (default) or SVI.

    NUTS (Hoffman & Gelman 2014, as implemented by ``pyro.infer.NUTS``) is the exact
    reference: its draws converge to the posterior. SVI fits a full-rank Gaussian in the
    unconstrained space (``pyro.infer.autoguide.AutoMultivariateNormal``), which is exact
    only for Gaussian posteriors; its answer is meant to be stable across seeds (see
    "SVI" below), not to be exact.

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
                return pyro.sample("w", dist.Normal(0.0, tau[..., None] * lam).to_event(1))
            ```

            (``tau[..., None]`` rather than ``tau``: then the model also runs with a leading
            batch of draws, and SVI vectorizes its particles, see ``svi_particles``).

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
            different data). Each is fitted with its own NUTS run (own step-size and
            mass-matrix adaptation) or SVI run. This is deliberate: a joint run would share
            one step size across problems of different scales. It costs
            ``prod(batch_shape)`` single fits.
        method: ``"nuts"`` (default) or ``"svi"``.
        num_samples: NUTS: kept draws per chain; SVI: draws from the fitted guide.
        warmup_steps: NUTS adaptation steps per chain (discarded).
        num_chains: NUTS chains per problem, each its own ``pyro.infer.MCMC`` run with its
            own seed derived from ``seed``, the problem index and the chain index (not
            Pyro's multi-chain runner, whose behaviour depends on the machine), so the draws
            do not depend on the machine nor on ``parallel_chains``.
        svi_steps: SVI: the budget of optimisation steps (the run stops earlier when it has
            converged, see "SVI" below).
        svi_lr: SVI: the initial Adam learning rate (it decays during the averaging phase).
        svi_particles: SVI: Monte-Carlo particles per ELBO gradient (``Trace_ELBO
            (num_particles=...)``). They are vectorized (one batched model run, so 8
            particles cost about 10 % more than one) for a distribution prior and for a
            callable prior that broadcasts over a leading dimension (e.g. ``tau[..., None] *
            lam`` rather than ``tau * lam``; probed once with a plate); otherwise they run
            one after another and cost ``svi_particles`` times one. Default 8: on the
            Laplace problem of tests/test_svi_nuts_reference.py the worst error of 5 seeds
            was 0.11 posterior sd (mean) and 8 % (sd) with 1 particle, 0.08 / 4 % with 4,
            0.04-0.05 / 3 % with 8 and 16.
        svi_tol: SVI: relative tolerance of the convergence check (default ``1e-3``), a
            number in ``(0, 1)``.
        progress: a progress bar of the fit (``bayes_safe.progress``: a widget in Jupyter,
            text on a terminal): ``"auto"`` (default) shows it once a fit has run for 2 s, in a
            notebook or on a terminal (never in a pipe or a log file); ``True`` always;
            ``False`` never (nor does the environment variable ``BAYES_SAFE_PROGRESS=0``).
            NUTS counts ``prod(batch_shape) * num_chains * (warmup_steps + num_samples)``
            iterations (chains in worker processes count when they finish), SVI
            ``prod(batch_shape) * svi_steps`` optimisation steps (a problem that converges
            early jumps to its end of the budget). Pyro's own bar is never shown. The bar
            changes no draw.
        parallel_chains: NUTS: run the ``prod(batch_shape) * num_chains`` chains in worker
            processes (``concurrent.futures.ProcessPoolExecutor``, ``forkserver`` start
            method where available, else ``spawn``; one worker per usable core, at most one
            per chain). Every chain keeps its own seed and the workers use the caller's
            torch thread count, so the draws are identical to the sequential run.
            ``True`` / ``False`` force it (``True`` on a one-core machine, or with a prior
            that cannot be pickled, e.g. a lambda, falls back to sequential chains with a
            ``RuntimeWarning``; so does a failure of the workers, e.g. a prior defined inside
            ``if __name__ == "__main__":``, which the workers cannot import; the chains are
            then rerun in this process); ``"auto"`` (default) runs in parallel only when more than
            one core is usable (``os.sched_getaffinity``), there is more than one chain to
            run, the prior can be pickled, and the sequential fit is expected (as for
            ``progress``) to take more than 10 s, which pays for starting the workers (about
            a second each, more on a loaded machine).
        seed: non-negative int. Per-problem and per-chain seeds are derived from it and the
            batch and chain indices; equal seed and data give identical draws. Global random
            states (torch, numpy, ``random``) and Pyro's parameter store are restored after
            every call.

    Every new option is checked at construction; a bad value raises ``ValueError`` naming
    the argument and the expected form.

    SVI: ``AutoMultivariateNormal`` guide, ``Trace_ELBO`` with ``svi_particles`` particles,
    optimised by Adam in two phases:

    1. *search*: constant learning rate ``svi_lr``. The losses are averaged over windows of
       ``W = clip(svi_steps // 20, 10, 100)`` steps; the search ends when two consecutive
       window means differ by at most ``svi_tol * max(|mean|, 1)`` (the relative change of
       the averaged ELBO) plus twice the standard error of that difference (from the
       spread of the losses in the two windows), so that a noisy ELBO estimate whose window
       means never agree to the relative tolerance is not taken for a moving one.
    2. *averaging*: ``A = max(2 W, svi_steps // 4)`` more steps (never beyond the budget)
       with the learning rate decaying as ``svi_lr * (1 + k / W)^(-1/2)`` at the ``k``-th
       step, while the guide parameters (in the unconstrained space Adam works in) are
       averaged uniformly; the fit uses that average (Polyak & Juditsky 1992, "Acceleration
       of stochastic approximation by averaging", SIAM J. Control Optim. 30(4)). The last
       iterate of a fixed-rate Adam jitters with the last gradients; the average does not.

    If the search has not ended ``A`` steps before the budget, averaging starts then
    anyway, and ``svi_converged`` is False for that problem (no warning: check the
    attribute). Measured on the Laplace-prior problem of tests/test_svi_nuts_reference.py
    (n = 200, d = 4; 5 seeds, 4000 guide draws each, against 5000 NUTS draws; worst of the
    4 weights): the old last-iterate fit (one particle, fixed lr 0.02, 1000 steps) had an
    across-seed spread of the posterior means of 1.12 posterior sd and of the sds of 22 %
    (means up to 0.78 sd and sds up to 14 % from NUTS); this one 0.08 sd and 2.8 % (means
    within 0.05 sd and sds within 2.7 % of NUTS), in 800 steps (300 search + 500 averaging).

    Shapes (``S = num_chains * num_samples`` for NUTS, ``num_samples`` for SVI):
        ``fit(X, y)`` takes ``X: [*batch_shape, n, d]`` and ``y: [*batch_shape, n]``;
        ``draws`` is ``[S, *batch_shape, d]``, ``noise_draws`` ``[S, *batch_shape]``.

    Cost of one ``fit``, per problem: NUTS runs ``num_chains * (warmup_steps +
    num_samples)`` iterations, each ``2^k`` gradient evaluations for a tree depth ``k`` that
    grows with how correlated and badly scaled the posterior is (up to ``2^10``); SVI runs
    at most ``svi_steps`` gradient steps of ``svi_particles`` particles plus ``num_samples``
    guide draws. A gradient evaluation costs ``O(n d)`` for the likelihood plus the prior's
    own cost. Both are dominated by Pyro's per-step Python overhead at small ``n`` and ``d``
    (about a millisecond per gradient evaluation), so expect seconds per problem;
    ``fit_seconds`` records the wall time. The tensors are tiny, so call
    ``torch.set_num_threads(1)`` in the calling program: intra-op threads only add overhead
    here and, on a busy machine, made fits 10-20 times slower. This class does not change
    the thread count itself.

    Attributes:
        fit_seconds: wall time of the last ``fit`` (0.0 before the first).
        fitted: whether ``fit`` has been called.
        svi_losses: ``[*batch_shape, T]`` per-step ELBO losses (negative ELBO estimates,
            each the mean over ``svi_particles`` particles) of the last SVI fit, else None.
            ``T`` is the largest number of steps a problem ran; a problem that stopped
            earlier is padded with NaN.
        svi_converged: ``[*batch_shape]`` bool, whether each problem's last SVI fit passed
            the convergence check before its budget ran out; None for NUTS and before a
            fit.
        nuts_workers: worker processes the last NUTS fit ran its chains in (1: all in this
            process; 0 before a NUTS fit). Not saved with the model's state.
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
        svi_steps: int = 2000,
        svi_lr: float = 0.02,
        svi_particles: int = 8,
        svi_tol: float = 1e-3,
        progress: bool | str = "auto",
        parallel_chains: bool | str = "auto",
        seed: int = 0,
        forgetting: float | None = None,
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
        if not _positive_float(svi_lr):
            raise ValueError(f"svi_lr must be a positive finite number, got {svi_lr!r}")
        self.svi_lr = float(svi_lr)
        self.svi_particles = _positive_int("svi_particles", svi_particles)
        if not (_positive_float(svi_tol) and svi_tol < 1):
            raise ValueError(f"svi_tol must be a number in (0, 1), e.g. 1e-3; got {svi_tol!r}")
        self.svi_tol = float(svi_tol)
        self.progress = _flag("progress", progress)
        self.parallel_chains = _flag("parallel_chains", parallel_chains)
        self.seed = _positive_int("seed", seed, minimum=0)
        if forgetting is not None and (isinstance(forgetting, bool) or not isinstance(forgetting, (int, float))
                                       or not 0 < forgetting < 1):
            raise ValueError(f"forgetting: expected a number in (0, 1) or None, got {forgetting!r}")
        # forgetting (issue 30): row i of n enters the likelihood to the power lam^(n-1-i) (the
        # stabilised rule of the other engines: the data weighed, the prior kept)
        self.forgetting = None if forgetting is None else float(forgetting)
        self._weights_cache: tuple[int, torch.Tensor] | None = None  # (n, the rows' weights [n])

        self.noise_std, self.noise_prior = self._check_noise(noise_std, noise_prior)
        self.prior = prior
        self._prior_dist, self._prior_fn = self._check_prior(prior)

        self.fit_seconds = 0.0
        self.fitted = False
        self.svi_losses: torch.Tensor | None = None
        self.svi_converged: torch.Tensor | None = None
        self._draws: torch.Tensor | None = None
        self._noise_draws: torch.Tensor | None = None
        self._chains: dict[str, torch.Tensor] = {}
        self._sample_stats: dict[str, torch.Tensor] = {}
        self._svi_draws: dict[str, torch.Tensor] = {}
        self._seconds_per_iteration: float | None = None  # of the last NUTS fit, per chain
        self._vectorizable: bool | None = None  # whether the prior broadcasts (SVI), probed once
        self._mappable: bool | None = None  # whether the prior runs under torch.func.vmap (SVI), probed once
        self.nuts_workers = 0

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

    def _model(self, X: torch.Tensor, y: torch.Tensor, W: torch.Tensor | None = None) -> None:
        """One problem: ``X: [n, d]``, ``y: [n]`` (float64); ``W: [n]`` or None, each row's weight
        left by adaptive restarts (issue 43: row ``i``'s log-likelihood times ``W_i``, as forgetting
        weighs it). The weights may carry leading particle dimensions (``w: [..., d]``, SVI's
        vectorized particles): the mean is then ``[..., n]`` and a noise variance ``[...]``
        broadcasts over the rows."""
        w = self._sample_weights()
        if self.noise_prior is not None:
            scale = pyro.sample(_NOISE_SITE, self.noise_prior).to(_DTYPE).sqrt()
            scale = scale[..., None] if scale.dim() > 0 else scale
        else:
            scale = X.new_tensor(self.noise_std)
        mean = X @ w if w.dim() == 1 else (w[..., None, :] @ X.mT)[..., 0, :]
        if W is None and self.forgetting is None:
            pyro.sample(_OBS_SITE, dist.Normal(mean, scale).to_event(1), obs=y)
            return
        # weighted rows: an adaptive restart's weights, or forgetting's lam^(n-1-i) on row i (Kulhavy &
        # Zarrop 1993's weighted likelihood; the prior keeps its weight), the same posterior the
        # conjugate engine's stabilised rule computes in closed form
        W = self._row_weights(X.shape[-2]) if W is None else W
        pyro.factor(_OBS_SITE, (W * dist.Normal(mean, scale).log_prob(y)).sum(-1))

    def _row_weights(self, n: int) -> torch.Tensor:
        """``[n]`` the rows' forgetting weights (``gibbs.forgetting_weights``; rows below ``2^-60`` weigh
        0), made once per ``n``, not at every evaluation of the model in a fit."""
        cached = self._weights_cache
        if cached is None or cached[0] != n:
            from ._forgetting import forgetting_weights

            start, w = forgetting_weights(self.forgetting, n)
            cached = self._weights_cache = (n, torch.cat([torch.zeros(start, dtype=_DTYPE), w]))
        return cached[1]

    def _broadcasts(self) -> bool:
        """Whether the prior runs correctly under a leading plate (SVI's vectorized
        particles and guide draws). A distribution prior does. A callable prior is probed once
        (cached): without plates of its own, run under a plate of a size ``k >= 2`` that is
        none of its site or weight sizes, every site must get shape ``[k, *its own shape]``
        and the returned weights ``[k, d]``. Code such as ``tau * lam`` with ``tau [k]`` and
        ``lam [k, d]`` fails that (write ``tau[..., None] * lam``), and then the particles
        run one after another."""
        if self._prior_fn is None:
            return True
        if self._vectorizable is None:
            self._vectorizable = self._probe_broadcast()
        return self._vectorizable

    def _probe_broadcast(self) -> bool:
        with _seeded(_child_seed(self.seed, _CHECK_STREAM)), torch.no_grad():
            try:
                base = poutine.trace(self._prior_fn).get_trace()
                sites = {n: v for n, v in base.nodes.items() if v["type"] == "sample"}
                if any(v["cond_indep_stack"] for v in sites.values()):
                    return False  # plates of its own: keep it simple, no vectorization
                sizes = {self.dim, *(s for v in sites.values() for s in v["value"].shape)}
                k = next(i for i in range(2, 10**6) if i not in sizes)
                with pyro.plate("_broadcast_probe", k, dim=-1):
                    trace = poutine.trace(self._prior_fn).get_trace()
                w = trace.nodes["_RETURN"]["value"]
                ok = torch.is_tensor(w) and tuple(w.shape) == (k, self.dim)
                for name, node in sites.items():
                    got = trace.nodes.get(name)
                    ok = ok and got is not None and tuple(got["value"].shape) == (
                        k, *node["value"].shape
                    )
                return bool(ok)
            except Exception:  # noqa: BLE001 - any failure means "run particles one by one"
                return False

    def _maps(self) -> bool:
        """Whether a callable prior that does not broadcast (``_broadcasts`` False) runs per
        element under ``torch.func.vmap``: then SVI's particles and guide draws are still one
        batched call each (``_mapped_loss``), the prior written for one draw (``Normal(0.0,
        scale).expand([d])``, ``tau * lam``) being mapped over them. Probed once (cached): the
        mapped log density of the prior at three prior draws must equal the one computed draw
        by draw; a prior with plates of its own, or code vmap cannot map (``.item()``, data-
        dependent branches, in-place writes), keeps the sequential particles."""
        if self._prior_fn is None:
            return False
        if self._mappable is None:
            self._mappable = self._probe_map()
        return self._mappable

    def _probe_map(self) -> bool:
        with _seeded(_child_seed(self.seed, _CHECK_STREAM)), torch.no_grad():
            try:
                traces = [poutine.trace(self._prior_fn).get_trace() for _ in range(3)]
                sites = [n for n, v in traces[0].nodes.items() if v["type"] == "sample"]
                if any(v["cond_indep_stack"] for n, v in traces[0].nodes.items() if n in sites):
                    return False
                values = {n: torch.stack([t.nodes[n]["value"].to(_DTYPE) for t in traces]) for n in sites}

                def log_density(v):
                    return poutine.trace(poutine.condition(self._prior_fn, data=v)).get_trace().log_prob_sum()

                with pyro.validation_enabled(False):
                    mapped = torch.func.vmap(log_density)(values)
                    single = torch.stack([log_density({n: x[i] for n, x in values.items()}) for i in range(3)])
                return bool(mapped.shape == (3,) and torch.isfinite(single).all()
                            and torch.allclose(mapped.to(_DTYPE), single.to(_DTYPE), rtol=1e-6, atol=1e-9))
            except Exception:  # noqa: BLE001 - any failure means "run particles one by one"
                return False

    def _mapped_loss(self, guide, X, y, W=None) -> torch.Tensor:
        """The negative ELBO of ``svi_particles`` particles, as ``Trace_ELBO(vectorize_particles=
        True).differentiable_loss`` computes it (the guide traced once under a plate of the
        particles: the same draws), with the model's log joint density at each particle mapped
        by ``torch.func.vmap`` over the particles (``_maps``): one batched pass instead of one
        Pyro trace per particle. Every site of the model is conditioned on the guide's draw
        (the observations on ``y``), so the mapped pass samples nothing."""
        K = self.svi_particles
        with pyro.plate("_particles", K, dim=-1):
            guide_trace = poutine.trace(guide).get_trace(X, y, W)
        values = {name: node["value"] for name, node in guide_trace.nodes.items()
                  if node["type"] == "sample" and not node["infer"].get("is_auxiliary")}

        def log_joint(v):
            return poutine.trace(poutine.condition(self._model, data=v)).get_trace(X, y, W).log_prob_sum()

        with pyro.validation_enabled(False):  # the argument checks branch on data, which vmap cannot map
            model_lp = torch.func.vmap(log_joint)(values)  # [K]
        return (guide_trace.log_prob_sum() - model_lp.sum()) / K

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
    def _sample_prior(self, num_samples: int, shared: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        total = num_samples * (1 if shared else self.batch_shape.numel())
        with _seeded(_child_seed(self.seed, _PRIOR_STREAM, num_samples)), torch.no_grad():
            if self._prior_dist is not None:
                w = self._prior_dist.sample((total,)).to(_DTYPE)
            else:
                w = torch.stack([self._prior_fn().to(_DTYPE) for _ in range(total)])
            noise = None
            if self.noise_prior is not None:
                noise = self.noise_prior.sample((total,)).to(_DTYPE)
        if shared:
            w = w.reshape(num_samples, *([1] * len(self.batch_shape)), self.dim).expand(
                num_samples, *self.batch_shape, self.dim).clone()
            if noise is not None:
                noise = noise.reshape(num_samples, *([1] * len(self.batch_shape))).expand(
                    num_samples, *self.batch_shape).clone()
            return w, noise
        w = w.reshape(num_samples, *self.batch_shape, self.dim)
        if noise is not None:
            noise = noise.reshape(num_samples, *self.batch_shape)
        return w, noise

    def prior_draws(self, num_samples: int, shared: bool = False) -> torch.Tensor:
        """``[num_samples, *batch_shape, d]`` float64 draws of ``w`` from the prior.

        Reproducible: the same ``seed`` and ``num_samples`` give the same draws. A callable
        prior is called ``num_samples * prod(batch_shape)`` times (``num_samples`` times with
        ``shared=True``, which gives every batch element the same draws, so that element ``r``
        of a batch has the draws of a one-element engine).
        """
        return self._sample_prior(_positive_int("num_samples", num_samples), shared)[0]

    @property
    def num_draws(self) -> int:
        """``S``, the number of draws in ``draws``."""
        return self.num_samples * (self.num_chains if self.method == "nuts" else 1)

    # ------------------------------------------------------------------ fitting
    def fit(self, X: torch.Tensor, y: torch.Tensor, seeds=None, weights: torch.Tensor | None = None) -> None:
        """Fit the posterior on all the data, from scratch, and store its draws.

        Args:
            X: ``[*batch_shape, n, d]`` design matrices (cast to float64).
            y: ``[*batch_shape, n]`` responses (cast to float64).
            seeds: optional ``prod(batch_shape)`` non-negative ints, one per batch element (flat,
                row-major): element ``r``'s chains and SVI run are seeded from ``seeds[r]`` alone
                instead of ``(seed, r)``, so an element fitted in a batch equals the same element
                fitted alone with the same seed (``BayesianLinear`` derives them from a
                ``ReplicationRNG``'s streams).
            weights: optional ``[*batch_shape, n]`` row weights in ``[0, 1]`` (adaptive restarts,
                issue 43): row ``i``'s log-likelihood in element ``r`` is multiplied by ``weights[r, i]``.

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

        if seeds is not None:
            seeds = [int(v) for v in seeds]
            if len(seeds) != self.batch_shape.numel() or any(v < 0 for v in seeds):
                raise ValueError(f"seeds: expected {self.batch_shape.numel()} non-negative ints (one per batch "
                                 f"element), got {seeds!r}")
        self._element_seeds = seeds
        start = time.perf_counter()
        Xf = X.reshape(self.batch_shape.numel(), *X.shape[-2:])  # [R, n, d]
        yf = y.reshape(self.batch_shape.numel(), y.shape[-1])  # [R, n]
        Wf = [None] * Xf.shape[0]
        if weights is not None:
            weights = torch.as_tensor(weights).detach().to(_DTYPE)
            if tuple(weights.shape) != tuple(y.shape) or bool(((weights < 0) | (weights > 1)).any()):
                raise ValueError(f"weights: expected row weights in [0, 1] of shape {list(y.shape)}, got "
                                 f"{list(weights.shape)}")
            Wf = list(weights.reshape(Xf.shape[0], y.shape[-1]))
        if self.method == "nuts":
            runs = self._fit_nuts_all(Xf, yf, Wf)
        else:
            runs = self._fit_svi_all(Xf, yf, Wf)
        self._store(runs)
        self.fit_seconds = time.perf_counter() - start
        self.fitted = True

    def _fit_seed(self, index: int, chain: int) -> int:
        """The seed of chain ``chain`` (SVI: 0) of batch element ``index``."""
        seeds = getattr(self, "_element_seeds", None)
        if seeds is not None:
            return _child_seed(seeds[index], _FIT_STREAM, 0, chain)
        return _child_seed(self.seed, _FIT_STREAM, index, chain)

    # ------------------------------------------------------------------ NUTS
    def _expected_seconds(self, iterations: int) -> float:
        """Expected sequential wall time of ``iterations`` NUTS iterations: the last NUTS
        fit's time per iteration, or 2 ms per iteration before any."""
        per = self._seconds_per_iteration
        return iterations * (_GUESS_SECONDS_PER_ITERATION if per is None else per)

    def _picklable(self) -> bool:
        try:
            pickle.dumps(self._job())
        except Exception:  # noqa: BLE001 - any failure means "run in this process"
            return False
        return True

    def _job(self) -> PyroLinearPosterior:
        """A copy of this engine without its results, to send to a worker process."""
        job = copy.copy(self)
        job._draws = job._noise_draws = job.svi_losses = job.svi_converged = None
        job._chains, job._sample_stats, job._svi_draws = {}, {}, {}
        return job

    def _bar(self, total: int, what: str, unit: str):
        """The fit's progress bar (``bayes_safe.progress``) of ``total`` ``unit``s."""
        from ..progress import progress_bar

        R = self.batch_shape.numel()
        return progress_bar(total, f"{what} fit" + (f" ({R} problems)" if R > 1 else ""), unit=unit,
                            progress=self.progress)

    def _plan(self, tasks: int) -> int:
        """Worker processes for ``tasks`` chains of this fit (1 = sequential in this process)."""
        iterations = tasks * (self.warmup_steps + self.num_samples)
        seconds = self._expected_seconds(iterations)
        cores = _usable_cores()
        workers = 1
        if self.parallel_chains is True or (
            self.parallel_chains == "auto" and seconds > _PARALLEL_SECONDS
        ):
            workers = min(tasks, cores)
            if workers > 1 and not self._picklable():
                if self.parallel_chains is True:
                    warnings.warn(
                        "parallel_chains=True: the prior (or noise prior) cannot be pickled "
                        "for a worker process; running the chains sequentially",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                workers = 1
            elif workers <= 1 and self.parallel_chains is True and tasks > 1:
                warnings.warn(
                    "parallel_chains=True: only one usable core; running the chains "
                    "sequentially",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return workers

    def _fit_nuts_all(self, Xf, yf, Wf):
        """All problems' chains, sequentially or in worker processes. Returns one
        ``(latents name -> [C, D, ...], stats name -> [C, D], w [C, D, d])`` per problem."""
        R, C = Xf.shape[0], self.num_chains
        pairs = [(r, c) for r in range(R) for c in range(C)]
        workers = self._plan(len(pairs))
        self.nuts_workers = workers
        results = None
        per_chain_iterations = self.warmup_steps + self.num_samples
        iterations = len(pairs) * per_chain_iterations
        with self._bar(iterations, "NUTS", "it") as bar:
            if workers > 1:
                job, threads = self._job(), torch.get_num_threads()
                done = 0
                try:
                    with ProcessPoolExecutor(max_workers=workers, mp_context=_pool_context()) as pool:
                        futures = [pool.submit(_run_chain_job, job, Xf[r], yf[r], Wf[r], r, c, threads) for r, c in pairs]
                        for f in as_completed(futures):
                            f.result()
                            bar.update(per_chain_iterations)
                            done += per_chain_iterations
                        results = [f.result() for f in futures]
                except Exception as err:  # noqa: BLE001 - e.g. a prior the workers cannot import
                    warnings.warn(
                        f"parallel_chains: the worker processes failed ({err!r}); running the "
                        "chains sequentially in this process",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                    self.nuts_workers = 1
                    bar.update(-done)  # the chains run again here, counted again
            if results is None:
                results = [self._run_chain(Xf[r], yf[r], Wf[r], r, c, bar.update) for r, c in pairs]
        self._seconds_per_iteration = sum(res[3] for res in results) / max(iterations, 1)
        runs = []
        for r in range(R):
            per_chain = results[r * C : (r + 1) * C]
            latents = {k: torch.stack([c[0][k] for c in per_chain]) for k in per_chain[0][0]}
            stats = {k: torch.stack([c[1][k] for c in per_chain]) for k in per_chain[0][1]}
            runs.append((latents, stats, latents[_WEIGHT_SITE]))
        return runs

    def _run_chain(self, X, y, W, index, chain, tick=None):
        """One NUTS chain of problem ``index``; ``tick()`` (if given) after every iteration,
        warm-up included. Returns ``(latents name -> [D, ...], stats name -> [D], w [D, d],
        seconds)``; ``latents`` includes ``"w"``."""
        start = time.perf_counter()
        with _seeded(self._fit_seed(index, chain)):
            kernel = _EnergyNUTS(self._model, init_strategy=_float64_init(init_to_uniform))
            recorder = _NutsRecorder(tick)
            mcmc = MCMC(
                kernel,
                num_samples=self.num_samples,
                warmup_steps=self.warmup_steps,
                num_chains=1,
                disable_progbar=True,  # bayes_safe.progress's bar instead (notebook-aware)
                hook_fn=recorder,
            )
            mcmc.run(X, y, W)
            samples = mcmc.get_samples(group_by_chain=True)  # name -> [1, D, ...]
            latents = {k: v[0].to(_DTYPE) for k, v in samples.items()}
            w = self._weights_from_latents(latents)
        latents[_WEIGHT_SITE] = w
        return latents, recorder.stats(), w, time.perf_counter() - start

    # ------------------------------------------------------------------ SVI
    def _fit_svi_all(self, Xf, yf, Wf):
        """Every problem's SVI run (``Xf [R, n, d]``, ``yf [R, n]``) under one progress bar of
        ``R * svi_steps`` steps."""
        runs = []
        with self._bar(Xf.shape[0] * self.svi_steps, "SVI", "step") as bar:
            for r in range(Xf.shape[0]):
                runs.append(self._fit_svi(Xf[r], yf[r], Wf[r], r, bar.update))
                bar.update(self.svi_steps - runs[-1][1].numel())  # an early stop: the rest of its budget
        return runs

    def _fit_svi(self, X, y, W, index, tick=None):
        """One problem's SVI run; ``tick()`` (if given) after every optimisation step.
        Returns ``(latents name -> [S, ...], ELBO losses [T], w [S, d], converged)``."""
        vectorize = self._broadcasts()
        mapped = not vectorize and self._maps()  # a prior written for one draw, mapped over the particles
        with _seeded(self._fit_seed(index, 0)), pyro.get_param_store().scope():
            pyro.clear_param_store()
            guide = AutoMultivariateNormal(self._model, init_loc_fn=_float64_init(init_to_median))
            guide(X, y, W)  # creates the guide's parameters
            if mapped:
                def loss_fn():
                    return self._mapped_loss(guide, X, y, W)
            else:
                elbo = Trace_ELBO(
                    num_particles=self.svi_particles,
                    vectorize_particles=vectorize and self.svi_particles > 1,
                    **({"max_plate_nesting": 0} if vectorize else {}),
                )

                def loss_fn():
                    return elbo.differentiable_loss(self._model, guide, X, y, W)
            losses, converged = _averaged_adam(
                loss_fn,
                list(guide.parameters()),
                lr=self.svi_lr,
                steps=self.svi_steps,
                tol=self.svi_tol,
                tick=tick,
            )
            with torch.no_grad():
                if vectorize or mapped:  # no plates in the model: all the guide's draws in one call
                    with pyro.plate("_svi_draws", self.num_samples, dim=-1):
                        latents = {k: v.to(_DTYPE) for k, v in guide(X, y, W).items()}
                else:
                    draws = [guide(X, y, W) for _ in range(self.num_samples)]
                    latents = {k: torch.stack([d[k] for d in draws]).to(_DTYPE) for k in draws[0]}
            w = self._weights_from_latents(latents)
        latents[_WEIGHT_SITE] = w
        return latents, losses, w, converged

    def _store(self, runs) -> None:
        batch = tuple(self.batch_shape)

        def unflatten(t, dim):
            """Stack the R problems at ``dim`` and reshape them to ``batch_shape``."""
            t = torch.stack(t, dim=dim)
            return t.reshape(*t.shape[:dim], *batch, *t.shape[dim + 1 :])

        if self.method == "nuts":
            # [C, D, R, ...] -> [C, D, *batch_shape, ...]
            self._chains = {k: unflatten([r[0][k] for r in runs], 2) for k in sorted(runs[0][0])}
            self._sample_stats = {k: unflatten([r[1][k] for r in runs], 2) for k in runs[0][1]}
            self._draws = self._chains[_WEIGHT_SITE].reshape(-1, *batch, self.dim)
            noise = self._chains.get(_NOISE_SITE)
            self._noise_draws = None if noise is None else noise.reshape(-1, *batch)
            self.svi_losses = self.svi_converged = None
            self._svi_draws = {}
        else:
            # [S, R, ...] -> [S, *batch_shape, ...]
            self._svi_draws = {k: unflatten([r[0][k] for r in runs], 1) for k in sorted(runs[0][0])}
            self._draws = self._svi_draws[_WEIGHT_SITE]
            self._noise_draws = self._svi_draws.get(_NOISE_SITE)
            T = max(r[1].numel() for r in runs)
            losses = torch.full((len(runs), T), float("nan"), dtype=_DTYPE)
            for i, r in enumerate(runs):
                losses[i, : r[1].numel()] = r[1]
            self.svi_losses = losses.reshape(*batch, T)
            self.svi_converged = torch.tensor([r[3] for r in runs]).reshape(batch)
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
    def svi_draws(self) -> dict[str, torch.Tensor]:
        """Joint draws of every latent site from the fitted SVI guide, ``name -> [num_samples,
        *batch_shape, *site_shape]``: the prior's sites (hyperparameters of a callable prior
        too), ``"w"`` (the weights, also for a callable prior) and ``"noise_var"`` when the
        noise has a prior. ``svi_draws["w"]`` is ``draws``. Empty for NUTS and before
        ``fit``."""
        return dict(self._svi_draws)

    @property
    def sample_stats(self) -> dict[str, torch.Tensor]:
        """NUTS per-draw statistics, ``name -> [chains, num_samples, *batch_shape]``:

        * ``"diverging"`` (bool): the trajectory diverged;
        * ``"acceptance_rate"``: mean acceptance probability of the trajectory;
        * ``"step_size"``: the adapted step size;
        * ``"lp"``: log joint density in the unconstrained space at the draw (minus Pyro's
          potential energy, so up to a constant and with the log-Jacobian of the transforms);
        * ``"energy"``: the Hamiltonian ``H = U(q) + K(p)`` at the draw, as Stan's
          ``energy__`` and ArviZ's ``sample_stats.energy`` define it (Betancourt 2016,
          "Diagnosing suboptimal cotangent disintegrations in Hamiltonian Monte Carlo",
          arXiv:1604.00695; used by ``az.bfmi`` and ``az.plot_energy``). ``U`` is the
          potential energy of the returned point ``q`` and ``K(p) = p^T M^-1 p / 2`` the
          kinetic energy (Pyro's ``HMC._kinetic_energy`` of the unscaled momentum) of the
          momentum ``p`` that the trajectory had at ``q``. Pyro does not keep that momentum,
          so the kernel used here (a subclass of ``pyro.infer.NUTS``) records ``U + K`` at
          every leaf of the tree it builds and picks the leaf that was returned; when the
          chain stays at its starting point, ``p`` is the momentum drawn at the start of
          the iteration.

        Read from the Pyro kernel's state after each kept draw; a statistic the kernel does
        not expose is left out. Empty for SVI and before ``fit``."""
        return dict(self._sample_stats)


def _positive_float(value) -> bool:
    return (
        isinstance(value, (int, float, np.floating, np.integer))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _averaged_adam(loss_fn, params, *, lr, steps, tol, tick=None):
    """Minimise ``loss_fn()`` (a differentiable ELBO loss) over ``params`` with Adam in two
    phases, and leave the Polyak average of the averaging phase in ``params``.

    Search at learning rate ``lr`` until the change of the window-averaged loss is within
    its tolerance (relative ``tol`` plus two standard errors); then average the parameters over ``A`` steps at a learning rate that
    decays as ``lr * (1 + k / W)^(-1/2)`` (Polyak & Juditsky 1992). See the class docstring
    for ``W`` and ``A``. Adam (Kingma & Ba 2015, "Adam: a method for stochastic
    optimization", ICLR; betas 0.9 and 0.999, eps 1e-8, as ``torch.optim.Adam``'s
    defaults) is written out here: the tensors are tiny, and ``torch.optim`` imports
    ``torch._dynamo`` (seconds) on first use. Returns ``(losses [T] float64, converged)``,
    ``T <= steps``. ``tick()`` (if given) runs after every step (a progress bar's update).
    """
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    window = min(max(steps // 20, 10), 100)
    average_steps = max(2 * window, steps // 4)
    first = [torch.zeros_like(p) for p in params]
    second = [torch.zeros_like(p) for p in params]
    losses: list[float] = []
    average: list[torch.Tensor] | None = None
    averaged = 0
    found = False
    for t in range(steps):
        if average is None and t >= steps - average_steps:
            average = [p.detach().clone() for p in params]  # the budget runs out: average now
            averaged = 0
        rate = lr if average is None else lr / math.sqrt(1.0 + averaged / window)
        loss = loss_fn()
        grads = torch.autograd.grad(loss, params)
        losses.append(loss.detach().item())
        with torch.no_grad():
            correction1, correction2 = 1.0 - beta1 ** (t + 1), 1.0 - beta2 ** (t + 1)
            for p, g, m, v in zip(params, grads, first, second):
                m.mul_(beta1).add_(g, alpha=1.0 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
                denom = (v / correction2).sqrt_().add_(eps)
                p.addcdiv_(m, denom, value=-rate / correction1)
        if tick is not None:
            tick()
        if average is not None:
            averaged += 1
            with torch.no_grad():
                for a, p in zip(average, params):
                    a.add_(p.detach() - a, alpha=1.0 / averaged)
            if found and averaged >= average_steps:
                break
        elif (t + 1) % window == 0 and len(losses) >= 2 * window:
            a = torch.tensor(losses[-2 * window : -window])
            b = torch.tensor(losses[-window:])
            se = math.sqrt((a.var() + b.var()).item() / window)  # of the difference of means
            last = b.mean().item()
            if abs(last - a.mean().item()) <= tol * max(abs(last), 1.0) + 2.0 * se:
                found = True
                average = [p.detach().clone() for p in params]
                averaged = 0
    if average is not None and averaged > 0:
        with torch.no_grad():
            for a, p in zip(average, params):
                p.copy_(a)
    return torch.tensor(losses, dtype=_DTYPE), found


class _EnergyNUTS(NUTS):
    """``pyro.infer.NUTS`` that also keeps the Hamiltonian ``U(q) + K(p)`` of the state it
    returns, as ``last_energy`` (a float; see ``PyroLinearPosterior.sample_stats``).

    Pyro's ``NUTS.sample`` returns the position of the leaf chosen by its multinomial
    sampling but keeps neither that leaf's momentum nor its energy. Each leaf of the tree is
    made by ``_build_basetree``, so this class records ``(leaf position, U + K)`` there and,
    after ``sample``, looks up the position the kernel cached as its new state (the leaf's
    own dict object). The starting point of the iteration is also a candidate; its energy is
    the ``energy_current`` of ``NUTS.sample``, recorded at the first kinetic-energy
    evaluation of the iteration (the freshly drawn momentum)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.last_energy: float | None = None
        self._leaves: dict[int, tuple[dict, float]] = {}
        self._start_pending = False
        self._start_energy: float | None = None

    def _kinetic_energy(self, r_unscaled):
        kinetic = super()._kinetic_energy(r_unscaled)
        if self._start_pending:  # NUTS.sample's energy_current = K(r_0) + U(q_0)
            self._start_pending = False
            self._start_energy = float(kinetic + self._potential_energy_last)
        return kinetic

    def _build_basetree(self, z, r, z_grads, log_slice, direction, energy_current):
        tree = super()._build_basetree(z, r, z_grads, log_slice, direction, energy_current)
        energy = tree.z_proposal_pe + NUTS._kinetic_energy(self, tree.r_left_unscaled)
        self._leaves[id(tree.z_proposal)] = (tree.z_proposal, float(energy))
        return tree

    def sample(self, params):
        self._leaves, self._start_pending, self._start_energy = {}, True, None
        z = super().sample(params)
        leaf = self._leaves.get(id(self._z_last))
        if leaf is not None and leaf[0] is self._z_last:
            self.last_energy = leaf[1]
        else:
            self.last_energy = self._start_energy
        self._leaves, self._start_pending = {}, False
        return z


class _NutsRecorder:
    """MCMC ``hook_fn`` that reads per-draw statistics off the NUTS kernel after each kept
    draw. Pyro keeps only running summaries, so the per-draw values are recovered from them:
    a new entry in the kernel's divergence list marks a divergent draw, and the acceptance
    probability is recovered from the running mean. The energy is ``_EnergyNUTS``'s."""

    def __init__(self, tick=None):
        self.tick = tick  # called after every iteration, warm-up included (a progress bar)
        self.rows: dict[str, list] = {
            "diverging": [], "acceptance_rate": [], "step_size": [], "lp": [], "energy": []
        }
        self._divergences = 0
        self._mean = 0.0

    def __call__(self, kernel, params, stage, i) -> None:
        if self.tick is not None:
            self.tick()
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
        hamiltonian = getattr(kernel, "last_energy", None)
        if hamiltonian is not None:
            self.rows["energy"].append(float(hamiltonian))

    def stats(self) -> dict[str, torch.Tensor]:
        out = {}
        n = max(len(v) for v in self.rows.values())
        for name, values in self.rows.items():
            if len(values) == n and n > 0:  # drop a statistic that was not always available
                dtype = torch.bool if name == "diverging" else _DTYPE
                out[name] = torch.tensor(values, dtype=dtype)
        return out
