"""Warm-started, batched Langevin sampler (MALA) for linear models under any Pyro prior.

``LangevinLinearPosterior`` is the engine ``BayesianLinear`` picks for a prior that is neither
conjugate nor a Gaussian scale mixture the Gibbs engine samples: any Pyro distribution on
``R^d``, or any callable Pyro model with continuous hyperparameters that returns the weights
(``engine_name == "langevin"``). It targets the joint posterior of every latent site of the prior
(and of the noise variance under a noise prior), mapped to an unconstrained vector ``theta`` of
``P`` numbers per replication by each site's ``biject_to(support)``:

    log p(theta | data) = sum_sites [log p(x_s | earlier sites) + log |det J_s(theta_s)|]
                          + log p(y | X, w(theta))           (up to a constant)

Each step is a Metropolis-adjusted Langevin step (Roberts & Tweedie 1996; Roberts & Rosenthal
1998, eq. 3 for the proposal and its acceptance ratio) with a preconditioner ``Sigma``:

    theta' = theta + (h / 2) Sigma grad log p(theta) + sqrt(h) L xi,     L L^T = Sigma,  xi ~ N(0, I)

accepted with probability ``min(1, p(theta') q(theta | theta') / (p(theta) q(theta' | theta)))``.

* **Warm start, a constant number of steps per decision.** As in Langevin Monte Carlo Thompson
  sampling (Mazumdar et al. ICML 2020, Sec. 4; Xu et al. ICML 2022, Alg. 1), the chain is kept
  across updates and a Thompson draw advances it by ``steps`` MALA steps (default 1), never by a
  refit. When the data at least doubled since the last draw (the first draws, one large
  ``update``), ``burn_in`` extra steps run first.
* **Preconditioner from the current Gaussian approximation.** At each such burn-in the
  preconditioner is refreshed from the Laplace approximation at the chain's state: ``Sigma =
  |H|^-1`` with ``H`` the Hessian of ``-log p(theta | data)`` and ``|H|`` its eigenvalues taken in
  absolute value and floored (the SoftAbs idea of Betancourt 2013, so that a non-convex point of a
  funnel still gives a positive-definite metric).
* **Step size per replication**, adapted towards the acceptance rate 0.574 that is optimal for
  MALA (Roberts & Rosenthal 1998, Sec. 2) by a Robbins-Monro recursion on ``log h`` whose gain
  decays as ``k^-0.6`` after each refresh (diminishing adaptation, Andrieu & Thoms 2008, Sec. 4.2).
* **Batched.** Every replication runs its own chain with its own step size and preconditioner;
  the log density and its gradient are evaluated for all replications at once with
  ``torch.func.vmap`` (the prior is written for one replication and sees one replication's
  values). Random numbers come from ``bayes_safe.random`` under the caller's key, so a
  replication's chain uses the same numbers as its one-replication run (equal up to rounding:
  the vectorised and unvectorised evaluations may differ in the last bit).

Likelihoods: ``"gaussian"`` (known ``noise_std`` or an ``InverseGamma`` prior on ``sigma^2``,
through running sufficient statistics, so a step costs ``O(d^2)`` whatever ``n``), ``"probit"``
(``sum log Phi((2 y - 1) x^T w)``) and ``"logistic"`` (``sum y f - log(1 + e^f)``), both ``O(n d)``
per step.

Example:
    ```python
    import pyro, pyro.distributions as dist, torch
    from bayes_safe.models import BayesianLinear

    def hierarchical():
        s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
        return pyro.sample("w", dist.Normal(0.0, s).expand([3]).to_event(1))

    model = BayesianLinear(hierarchical, dim=3, likelihood="probit")   # engine_name == "langevin"
    model.update(torch.randn(50, 3, dtype=torch.float64), torch.randint(0, 2, (50,)).double())
    w = model.sample(torch.Generator().manual_seed(0))                 # [3], one Thompson draw
    ```
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pyro
import torch
from pyro.poutine.messenger import Messenger
from torch.distributions import biject_to

from ..random import DrawBatch, Generator, standard_normal, standard_uniform
from ._forgetting import discount_statistics, forgetting_weights, restart_statistics
from .gibbs import append_rows, empty_data

__all__ = ["LANGEVIN_OPTIONS", "LangevinLinearPosterior"]

_DTYPE = torch.float64
_NOISE_SITE = "noise_var"
_TARGET_ACCEPT = 0.574
_MIN_CURVATURE = 1e-4  # eigenvalue floor of the preconditioner: proposal sds of at most 100 unconstrained units
_NAN_LIMIT = 10  # NaN proposals in a row of one chain that mean a broken prior, not a far-out proposal
# keyword options of the engine (BayesianLinear's inference_options) and their minimum values
# (``compile`` is a bool: replay the prior as a recorded graph, ``prior_graph.compile_prior``)
LANGEVIN_OPTIONS = {"steps": 1, "burn_in": 0, "predict_steps": 1, "seed": 0, "compile": True}


class _Unconstrained(Messenger):
    """Sets every sample site of the prior to the constrained image of its unconstrained
    coordinates and accumulates ``log p(x_s | earlier sites) + log |det J_s|``."""

    def __init__(self, values: dict[str, torch.Tensor]):
        super().__init__()
        self.values = values
        self.log_density = 0.0
        self.constrained: dict[str, torch.Tensor] = {}

    def _pyro_sample(self, msg):
        if msg["is_observed"]:
            return
        name = msg["name"]
        if name not in self.values:
            raise ValueError(f"prior: the site {name!r} was not sampled when the prior was first traced; the Langevin "
                             "engine needs the same sites at every call")
        u = self.values[name]
        fn = msg["fn"]
        transform = biject_to(fn.support)
        x = transform(u)
        self.log_density = (self.log_density + fn.log_prob(x).sum()
                            + transform.log_abs_det_jacobian(u, x).sum())
        self.constrained[name] = x
        msg["value"] = x
        msg["is_observed"] = True
        msg["done"] = True
        msg["stop"] = True


class _PriorAt:
    """The prior's part of one replication's log density at a state, reusable under new data.

    Eager: ``theta`` (the autograd leaf), ``lp``, ``w``, ``s2`` hold the prior's autograd graph and
    ``grad is None``. Recorded graph: ``lp``, ``grad`` (of the prior part), ``w``, ``s2`` are plain
    tensors and ``jac [d, P]`` is ``dw / dtheta`` (``None`` when ``w`` is a block of ``theta``).
    """

    __slots__ = ("grad", "jac", "lp", "s2", "theta", "w")

    def __init__(self, theta, lp, w, s2, grad=None, jac=None):
        self.theta, self.lp, self.w, self.s2, self.grad, self.jac = theta, lp, w, s2, grad, jac


class _Recorded:
    """A recorded graph (``prior_graph.compile_prior``): immutable, so copies of the engine share it;
    pickled as an empty holder, which the engine records again on use."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *inputs):
        return self.fn(*inputs)

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        return (_Recorded, (None,))


class _Site:
    """One latent site: its name, value shape and slice of ``theta``."""

    def __init__(self, name: str, shape: torch.Size, start: int):
        self.name, self.shape = name, torch.Size(shape)
        self.size = max(self.shape.numel(), 1)
        self.slice = slice(start, start + self.size)


class LangevinLinearPosterior:
    """Warm-started MALA chains for ``w`` in a linear model under any Pyro prior, batched.

    Args:
        prior: a Pyro distribution with event shape ``[d]`` and batch shape ``[]`` supported on
            ``R^d``, or a callable Pyro model (no arguments) sampling continuous sites and returning
            ``w [d]`` (checked by ``pyro_inference.check_prior_model``).
        dim: ``d``.
        batch_shape: ``[*b]``; each batch element runs its own chain.
        likelihood: ``"gaussian"``, ``"probit"`` or ``"logistic"``.
        noise_std / noise_prior: the Gaussian likelihood's known noise sd, or an ``InverseGamma``
            prior on its variance (then ``"noise_var"`` is one more latent site).
        steps: MALA steps per Thompson draw (default 1).
        burn_in: extra steps (after a preconditioner refresh) when the data at least doubled
            since the last draw, and before the summaries of ``summary`` (default 50).
        predict_steps: steps averaged by ``summary`` (default 200).
        seed: seed of the initial state and of the generator ``fit`` / ``summary`` use when
            given none.
        compile: with one replication, record the prior's log density, gradient (and the Jacobian
            of ``w`` when ``w`` is not itself a site on ``R^d``) once as a graph of tensor operations
            and replay it at each step (``prior_graph.compile_prior``: about twice as fast as the
            eager Pyro run and backward pass; equal to 1e-9). A prior the recording cannot replay
            faithfully (its own random numbers, Python branches on sampled values, in-place
            updates, or a disagreement at the check states) stays eager; ``compiled`` says which.
            Default ``True``.
        forgetting: ``lambda`` in (0, 1] or None (issue 30): row ``i`` of ``n`` enters the log
            likelihood times ``lambda^(n - 1 - i)`` (a power likelihood; the prior is not weighed,
            ``BayesianLinear``'s stabilised rule). Gaussian likelihood: the sufficient statistics are
            discounted and the noise variance sees the weighted count; 0/1 likelihoods: each row's log
            likelihood is multiplied by its weight (rows below ``2^-60`` left out, see
            ``gibbs.forgetting_weights``).

    Shapes: ``add(X [*b, n, d], y [*b, n])``; ``draw() -> [*b, d]``; ``summary(X [*b, k, d]) ->
    (mean_w [*b, d], mean [*b, k], var [*b, k])``; ``theta [*b, P]``.
    """

    method = "langevin"

    def __init__(self, prior, dim: int, batch_shape: Sequence[int] = (), *, likelihood: str = "gaussian",
                 noise_std: float | None = None, noise_prior=None, steps: int = 1, burn_in: int = 50,
                 predict_steps: int = 200, seed: int = 0, compile: bool = True, forgetting: float | None = None):
        from .pyro_inference import check_prior_model

        self.dim = int(dim)
        self.batch_shape = torch.Size(batch_shape)
        self.likelihood = likelihood
        self.forgetting = None if forgetting is None else float(forgetting)
        self._weights_cache = None  # (n, (start, weights)) of the 0/1 likelihoods' rows under forgetting
        self.steps, self.burn_in, self.predict_steps, self.seed = int(steps), int(burn_in), int(predict_steps), int(seed)
        self.compile = bool(compile)
        distribution, fn = check_prior_model(prior, self.dim, self.seed)
        self.prior = prior
        self._prior_fn = fn if fn is not None else (lambda: pyro.sample("w", distribution))
        self._noise_var = None if noise_std is None else float(noise_std) ** 2
        self._noise_prior = noise_prior
        self.sites = self._trace_sites()
        self.num_params = sum(s.size for s in self.sites)
        b, d = tuple(self.batch_shape), self.dim
        self.n = 0
        self._n_at_draw = 0
        # the Gaussian likelihood's count per element after an adaptive restart weighed it (issue 43; None: n)
        self._n_eff: torch.Tensor | None = None
        # the chains follow the device of the prior's own draws (its parameters'), float64 (autograd and the
        # MALA acceptance ratio in float64 on every device)
        self.theta = self._initial_theta().expand(*b, self.num_params).clone()
        device = self.theta.device
        # the Gaussian likelihood's sufficient statistics; the binary likelihoods' rows (append_rows)
        self._xtx, self._xty, self._yty, self._X, self._y = empty_data(b, d, device)
        self._w_block = self._find_w_block()
        self._graph = None  # the recorded prior (one replication), built at the first evaluation
        self._graph_tried = False
        self._step_graph = None  # the recorded proposal (one replication, Gaussian), built at the first step
        self._step_graph_tried = False
        self.log_step = torch.full(b, math.log(0.1), dtype=_DTYPE, device=device)  # log h per replication
        self.factor = torch.eye(self.num_params, dtype=_DTYPE, device=device).expand(*b, -1, -1).clone()  # L, Sigma = L L^T
        self._adapt_count = 0
        self._n_at_refresh = 0  # observations at the last preconditioner refresh
        self._refresh_origin = 0  # observations at the last adaptive restart: refreshes follow the rows since
        # (log p [*b], grad [*b, P], w [*b, d], graph) at theta; None after new data, when the prior
        # part kept in ``graph`` (one replication, a _PriorAt) renews value and gradient by the chain rule
        self._cache = None
        self._stale_cache = None
        self.accept_rate = torch.zeros(b, dtype=_DTYPE, device=device)  # mean acceptance probability since the last refresh
        self.rejected_non_finite = torch.zeros(b, dtype=torch.long, device=device)  # proposals rejected for a non-finite density
        self._nan_run = torch.zeros(b, dtype=torch.long, device=device)  # consecutive NaN proposals per chain
        self._nan_pending = False  # some chain's _nan_run is not zero

    def __getstate__(self) -> dict:
        """Copies (``copy.deepcopy``, pickling) drop the cached autograd graph; it is rebuilt on use.
        The recorded graphs are shared by copies and re-recorded after unpickling (``_Recorded``)."""
        state = dict(self.__dict__)
        state["_cache"] = state["_stale_cache"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        for name in ("_graph", "_step_graph"):
            if isinstance(state.get(name), _Recorded) and state[name].fn is None:  # unpickled: record again
                self.__dict__[name], self.__dict__[name + "_tried"] = None, False

    # ------------------------------------------------------------------ the target
    def _trace_sites(self) -> list[_Site]:
        with torch.no_grad(), pyro.validation_enabled(False):
            trace = pyro.poutine.trace(self._prior_fn).get_trace()
        sites, start = [], 0
        for name, node in trace.nodes.items():
            if node["type"] != "sample" or node["is_observed"]:
                continue
            support = node["fn"].support
            if support.is_discrete:
                raise ValueError(f"prior: site {name!r} is discrete ({support}); the Langevin engine samples "
                                 "continuous sites only")
            site = _Site(name, node["value"].shape, start)
            sites.append(site)
            start += site.size
        if self._noise_prior is not None:
            sites.append(_Site(_NOISE_SITE, torch.Size(), start))
        return sites

    def _initial_theta(self) -> torch.Tensor:
        """``[P]``: the coordinate-wise median of 15 prior draws in the unconstrained space (Pyro's
        ``init_to_median`` idea), from ``seed``."""
        draws = []
        with torch.no_grad(), pyro.validation_enabled(False):
            saved = pyro.util.get_rng_state()
            try:
                pyro.set_rng_seed(self.seed)
                for _ in range(15):
                    trace = pyro.poutine.trace(self._prior_fn).get_trace()
                    parts = []
                    for site in self.sites:
                        if site.name == _NOISE_SITE:
                            fn, x = self._noise_prior, self._noise_prior.sample()
                        else:
                            node = trace.nodes[site.name]
                            fn, x = node["fn"], node["value"]
                        parts.append(biject_to(fn.support).inv(x.to(_DTYPE)).reshape(-1))
                    draws.append(torch.cat(parts))
            finally:
                pyro.util.set_rng_state(saved)
        return torch.stack(draws).median(0).values

    def _find_w_block(self) -> slice | None:
        """The slice of ``theta`` that ``w`` is (the prior returns a site on ``R^d`` as drawn), else None."""
        values = self._unpack(self.theta.reshape(-1, self.num_params)[0].clone())
        handler = _Unconstrained(values)
        with torch.no_grad(), pyro.validation_enabled(False), handler:
            w = self._prior_fn()
        for site in self.sites:
            if w is values.get(site.name) and site.size == self.dim:
                return site.slice
        return None

    @property
    def compiled(self) -> bool:
        """Whether one-replication steps replay a recorded graph (the whole step under the Gaussian
        likelihood, the prior part otherwise; see ``compile``)."""
        return self._graph is not None or self._step_graph is not None

    def _record_prior(self, theta: torch.Tensor):
        """The recorded ``theta [P] -> (lp, grad, w[, s2][, jac])`` of the prior part, or None."""
        from .prior_graph import compile_prior

        # the check points drawn on the CPU (the same on every device), then on theta's device
        noise = torch.randn(2, self.num_params, generator=torch.Generator(device="cpu").manual_seed(0), dtype=_DTYPE,
                            device="cpu").to(theta.device)
        checks = theta + noise * torch.tensor([[0.5], [2.0]], dtype=_DTYPE, device=theta.device)
        with pyro.validation_enabled(False):
            graph = compile_prior(self._prior_value_and_grad, (theta,), [(c,) for c in checks])
            if graph is not None and not all(self._block_holds(graph(t)[2], t) for t in (theta, *checks)):
                return None
        return graph

    def _block_holds(self, w: torch.Tensor, t: torch.Tensor) -> bool:
        """``w`` is ``t``'s block ``_w_block`` (always true when there is no block: ``jac`` is used)."""
        return self._w_block is None or torch.equal(w.reshape(-1), t[self._w_block])

    def _prior_value_and_grad(self, t: torch.Tensor) -> tuple:
        """``(lp, grad [P], w [d][, s2][, jac [d, P]])`` of the prior part at ``t [P]`` by ``torch.func``
        (``jac`` when ``w`` is not a block of ``theta``): the function ``_record_prior`` records."""
        def part(u):
            lp, w, s2 = self._prior_part(u)
            return lp, (w,) if s2 is None else (w, s2)  # (functorch's aux holds tensors only)

        grad, (lp, aux) = torch.func.grad_and_value(part, has_aux=True)(t)
        out = [lp, grad, *aux]
        if self._w_block is None:  # dw/dtheta [d, P]: d vector-Jacobian products against the identity
            _, vjp = torch.func.vjp(lambda u: self._prior_part(u)[1], t)
            out.append(torch.func.vmap(vjp)(torch.eye(self.dim, dtype=_DTYPE, device=t.device))[0])
        return tuple(out)

    def _recorded_step(self):
        """The recorded one-replication step for the Gaussian likelihood (``_record_step``), or None."""
        if self._step_graph is None and not self._step_graph_tried:
            self._step_graph_tried = True
            if self._steps_recorded():
                self._step_graph = _recorded(self._record_step())
        return self._step_graph

    def _steps_recorded(self) -> bool:
        """Whether steps use the recorded proposal (one replication, Gaussian likelihood, ``compile``);
        otherwise the prior part alone is recorded (``_prior_at``)."""
        return self.compile and self.likelihood == "gaussian" and self.batch_shape.numel() == 1

    def _record_step(self):
        """Record one whole MALA step of one replication (Gaussian likelihood) as one graph (``_step_fn``);
        None if refused."""
        from .prior_graph import compile_prior

        P, d = self.num_params, self.dim
        _, current = self._current_prior()
        n, xtx, xty, yty, _, _ = self._one_data()
        device = self.theta.device
        scalar = lambda x: torch.tensor(x, dtype=_DTYPE, device=device)
        example = (self.theta.reshape(P), self.factor.reshape(P, P), self.log_step.reshape(()),
                   torch.zeros(P, dtype=_DTYPE, device=device), scalar(0.5), scalar(n), scalar(1.0), scalar(1.0),
                   self.accept_rate.reshape(()), xtx, xty, yty, *self._prior_tuple(current))
        g = torch.Generator(device="cpu").manual_seed(1)  # the CPU's numbers, put on the chains' device
        theta, xi, dxty = (torch.randn(k, generator=g, dtype=_DTYPE, device="cpu").to(device) for k in (P, P, d))
        checks = [(example[0] + theta, example[1], example[2] - 1.0, xi, scalar(0.25), example[5] + 1.0,  # other state,
                   scalar(0.5), scalar(0.25), scalar(0.3), xtx + torch.eye(d, dtype=_DTYPE, device=device), xty + dxty,  # step, noise,
                   yty + 1.0, *example[12:])]                                                            # data
        with pyro.validation_enabled(False):
            graph = compile_prior(self._step_fn, example, checks)
            outputs = [] if graph is None else [graph(*inputs) for inputs in (example, *checks)]
            if graph is not None and not all(self._block_holds(out[10], out[3]) for out in outputs):
                return None
        return graph

    def _step_fn(self, theta, L, log_step, xi, u, n, gain, inv_k, accept_rate, xtx, xty, yty, *current):
        """One whole MALA step of one replication under the Gaussian likelihood, as a pure function
        (``_record_step`` records it): ``theta, xi [P]``, ``L [P, P]``, ``log_step, u, n, gain, inv_k,
        accept_rate []``, the data ``X^T X, X^T y, y^T y`` and the prior part at ``theta``
        (``_prior_tuple``). Returns ``(flags [3] = (NaN at theta, proposal not finite, accepted),
        value, grad at theta, theta', value', grad', log_step', accept_rate', *prior part at theta')``."""
        at = self._prior_from(current)
        value, grad = self._combine(at.lp, at.grad, at.w, at.s2, at.jac, n, xtx, xty, yty, None, None)
        h = log_step.exp()[None]
        proposal, lt_g = _mala_move(theta, grad, L, h, xi)
        prior = self._prior_value_and_grad(proposal)
        at = self._prior_from(prior)
        value_p, grad_p = self._combine(at.lp, at.grad, at.w, at.s2, at.jac, n, xtx, xty, yty, None, None)
        log_alpha = _mala_log_ratio(value, value_p, grad_p, L, h, xi, lt_g)
        bad, accept, log_step, accept_rate = _mala_accept(value_p, grad_p, log_alpha, u, log_step, accept_rate,
                                                          gain, inv_k)
        flags = torch.stack([torch.isnan(value + grad.sum()), bad, accept]).to(_DTYPE)
        return (flags, value, grad, proposal, value_p, grad_p, log_step, accept_rate, *prior)

    def _prior_tuple(self, at: _PriorAt) -> tuple:
        """The prior part as ``_prior_value_and_grad`` returns it: ``(lp, grad, w[, s2][, jac])``."""
        return (at.lp, at.grad, at.w) + (() if at.s2 is None else (at.s2,)) + (() if at.jac is None else (at.jac,))

    def _current_prior(self) -> tuple[torch.Tensor, _PriorAt]:
        """``(w [*b, d], prior part with its gradient)`` at the current state of one replication."""
        for cached in (self._cache, self._stale_cache):
            if cached is not None and cached[3] is not None and cached[3].grad is not None:
                return cached[2], cached[3]
        with pyro.validation_enabled(False):
            at = self._prior_from(self._prior_value_and_grad(self.theta.reshape(self.num_params)))
        return at.w.reshape(*self.batch_shape, self.dim).to(_DTYPE), at

    def _prior_from(self, out: tuple) -> _PriorAt:
        """The ``_PriorAt`` of the outputs of ``_prior_value_and_grad`` (or its recording)."""
        s2 = out[3] if self._noise_prior is not None else None
        jac = out[-1] if self._w_block is None else None
        return _PriorAt(None, out[0], out[2], s2, grad=out[1], jac=jac)

    def _prior_at(self, t: torch.Tensor) -> _PriorAt:
        """The prior part at one replication's state ``t [P]``: from the recorded graph when there
        is one, else an eager run keeping its autograd graph."""
        if self.compile and not self._graph_tried and (not self._steps_recorded() or self._step_graph_tried
                                                       and self._step_graph is None):
            # (with a recorded step the prior part comes out of it: an eager first evaluation is cheaper
            # than a second recording; if the step could not be recorded, the prior alone may be)
            self._graph_tried = True
            self._graph = _recorded(self._record_prior(t.detach()))
        if self._graph is not None:
            return self._prior_from(self._graph(t.detach()))
        leaf = t.detach().clone().requires_grad_(True)
        with torch.enable_grad(), pyro.validation_enabled(False):
            lp, w, s2 = self._prior_part(leaf)
        return _PriorAt(leaf, lp, w, s2)

    def _unpack(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        return {s.name: theta[s.slice].reshape(s.shape) for s in self.sites}

    def _prior_part(self, theta: torch.Tensor):
        """One replication: ``(log prior density + log |J|, w [d], noise variance or None)``."""
        values = self._unpack(theta)
        handler = _Unconstrained(values)
        with handler:
            w = self._prior_fn()
        lp = handler.log_density
        s2 = None
        if self._noise_prior is not None:
            u = values[_NOISE_SITE]
            s2 = u.exp()
            lp = lp + self._noise_prior.log_prob(s2) + u
        return lp, w.to(_DTYPE), s2

    def _n_lik(self) -> float | torch.Tensor:
        """The count of observations the likelihood sees: ``n``, or under forgetting the weighted
        count ``sum_k lambda^k`` (k < n), a function of ``n`` (nothing more to save); after an
        adaptive restart of a Gaussian likelihood, each element's weighted count ``[*b]``."""
        if self._n_eff is not None:
            return self._n_eff
        lam = self.forgetting
        if lam is None or lam >= 1.0:
            return float(self.n)
        return (1.0 - lam**self.n) / (1.0 - lam)

    def _rows(self) -> tuple[int, torch.Tensor | None]:
        """``(first row used, weights of rows first .. n or None)`` of the 0/1 likelihoods."""
        if self.forgetting is None or self.likelihood == "gaussian":
            return 0, None
        if self._weights_cache is None or self._weights_cache[0] != self.n:
            self._weights_cache = (self.n, forgetting_weights(self.forgetting, self.n))
        return self._weights_cache[1]

    def _log_likelihood(self, w, s2, xtx, xty, yty, n, X, y, xtxw=None):
        """One replication's ``log p(y | X, w, s2)`` (a scalar, up to a constant); ``xtxw``: ``X^T X w``
        when the caller has it. Under forgetting each row's term times its weight (``_rows``)."""
        if self.likelihood == "gaussian":
            xtxw = xtx @ w if xtxw is None else xtxw
            quad = yty - (w * (2.0 * xty - xtxw)).sum()
            if s2 is None:
                return -0.5 * quad / self._noise_var
            return -0.5 * n * torch.log(s2) - 0.5 * quad / s2
        f = X @ w
        if self.likelihood == "probit":
            terms = _log_ndtr((2.0 * y - 1.0) * f)
        else:
            terms = y * f - torch.nn.functional.softplus(f)
        wts = self._rows()[1]
        return terms.sum() if wts is None else (wts.to(terms.dtype) * terms).sum()

    def _log_density(self, theta, xtx, xty, yty, n, X, y):
        """One replication's ``log p(theta | data)`` (a scalar)."""
        lp, w, s2 = self._prior_part(theta)
        return lp + self._log_likelihood(w, s2, xtx, xty, yty, n, X, y)

    def _data(self):
        b = tuple(self.batch_shape)
        R = self.batch_shape.numel()
        rows = 0 if self.likelihood == "gaussian" else self.n  # the Gaussian likelihood keeps sums only
        start = self._rows()[0]
        X = self._X[..., start:rows, :].reshape(R, rows - start, self.dim)
        y = self._y[..., start:rows].reshape(R, rows - start)
        return (self._xtx.reshape(R, self.dim, self.dim), self._xty.reshape(R, self.dim), self._yty.reshape(R),
                X, y, b)

    def log_density_and_grad(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log p [*b], grad [*b, P])`` at ``theta [*b, P]`` for every replication."""
        value, grad, _, _ = self._evaluate(theta)
        return value, grad

    def _evaluate(self, theta: torch.Tensor):
        """``(log p [*b], grad [*b, P], w [*b, d], graph)`` at ``theta [*b, P]``.

        With one replication the prior part at the state is returned too (``graph``, a
        ``_PriorAt``), so that after new data the value and gradient at the same state cost the
        likelihood and the chain rule only, not a new run of the prior (``_current``); batches go
        through ``torch.func.vmap`` and return ``graph = None``.
        """
        b = tuple(self.batch_shape)
        if self.batch_shape.numel() == 1:
            graph = self._prior_at(theta.reshape(self.num_params))
            value, grad = self._through(graph)
            return (value.reshape(b), grad.reshape(*b, self.num_params),
                    graph.w.detach().to(_DTYPE).reshape(*b, self.dim), graph)
        xtx, xty, yty, X, y, b = self._data()
        R = xtx.shape[0]
        flat = theta.reshape(R, self.num_params).detach()
        n = self._n_per_element(R)
        with torch.enable_grad(), pyro.validation_enabled(False):

            def one(t, a, c, e, Xr, yr, nr):
                lp, w, s2 = self._prior_part(t)
                return lp + self._log_likelihood(w, s2, a, c, e, nr, Xr, yr), w

            grad, (value, w) = torch.func.vmap(torch.func.grad_and_value(one, has_aux=True))(flat, xtx, xty, yty, X, y, n)
        return (value.reshape(b).to(_DTYPE), grad.reshape(*b, self.num_params).to(_DTYPE),
                w.reshape(*b, self.dim).to(_DTYPE), None)

    def _through(self, graph: _PriorAt) -> tuple[torch.Tensor, torch.Tensor]:
        """Value and gradient of one replication's log density from the prior part at its state:
        the likelihood is differentiated in ``(w, s2)`` in closed form, then carried to ``theta``
        by the chain rule (``_combine`` for a recorded prior, one backward pass through the eager
        graph otherwise)."""
        data = self._one_data()
        if graph.grad is not None:
            value, grad = self._combine(graph.lp, graph.grad, graph.w, graph.s2, graph.jac, *data)
            return value.to(_DTYPE), grad.to(_DTYPE)
        t, lp, w, s2 = graph.theta, graph.lp, graph.w, graph.s2
        sd = None if s2 is None else s2.detach()
        ll, g_w, g_s2 = self._likelihood_and_grad(w.detach().to(_DTYPE), sd, *data)
        outputs, seeds = [lp, w], [torch.ones_like(lp), g_w.to(w.dtype)]
        if sd is not None:
            outputs.append(s2)
            seeds.append(g_s2)
        (grad,) = torch.autograd.grad(outputs, t, grad_outputs=seeds, retain_graph=True)
        return (lp.detach() + ll).to(_DTYPE), grad.to(_DTYPE)

    def _one_data(self):
        """One replication's data ``(n, X^T X [d, d], X^T y [d], y^T y [], X [n, d] | None, y [n] | None)``."""
        d, n = self.dim, self.n
        X = y = None
        if self.likelihood != "gaussian":
            start = self._rows()[0]
            X, y = self._X.reshape(-1, d)[start:n], self._y.reshape(-1)[start:n]
        n_lik = self._n_lik()
        n_lik = float(n_lik.reshape(())) if isinstance(n_lik, torch.Tensor) else n_lik
        return n_lik, self._xtx.reshape(d, d), self._xty.reshape(d), self._yty.reshape(()), X, y

    def _n_per_element(self, R: int) -> torch.Tensor:
        """``_n_lik()`` as ``[R]`` float64 (one count per replication, for ``torch.func.vmap``)."""
        n = self._n_lik()
        if isinstance(n, torch.Tensor):
            return n.reshape(R)
        return torch.full((R,), float(n), dtype=_DTYPE, device=self._xtx.device)

    def _combine(self, lp, grad_prior, w, s2, jac, n, xtx, xty, yty, X, y):
        """``(log p, grad [P])`` of one replication from the prior part (``lp``, its gradient
        ``grad_prior [P]``, ``w [d]``, ``s2``, ``jac = dw / dtheta [d, P]`` or ``None`` when ``w`` is
        the block ``_w_block`` of ``theta``) and the data: the chain rule with the likelihood's
        closed-form gradient, and ``ds2 / du = s2`` for the noise site. Pure (no in-place update), so
        that the recorded step (``_record_step``) can include it."""
        P = self.num_params
        ll, g_w, g_s2 = self._likelihood_and_grad(w, s2, n, xtx, xty, yty, X, y)
        if jac is None:
            block = self._w_block
            grad = grad_prior + torch.nn.functional.pad(g_w.reshape(-1), (block.start, P - block.stop))
        else:
            grad = grad_prior + jac.reshape(self.dim, P).mT.to(g_w.dtype) @ g_w
        if s2 is not None:
            grad = grad + torch.nn.functional.pad((g_s2 * s2).reshape(1), (P - 1, 0))
        return lp + ll, grad

    def _likelihood_and_grad(self, w, s2, n, xtx, xty, yty, X, y):
        """One replication's log likelihood (``_log_likelihood``) and its gradients in ``w [d]`` and
        ``s2``, in closed form: Gaussian ``(X^T y - X^T X w) / s2`` (and ``-n / (2 s2) + quad / (2 s2^2)``
        with a noise prior); probit ``sum_i s_i phi(s_i f_i) / Phi(s_i f_i) x_i`` with ``s_i = 2 y_i - 1``;
        logistic ``sum_i (y_i - sigmoid(f_i)) x_i``."""
        if self.likelihood == "gaussian":
            xtxw = xtx @ w
            ll = self._log_likelihood(w, s2, xtx, xty, yty, n, X, y, xtxw=xtxw)
            if s2 is None:
                return ll, (xty - xtxw) / self._noise_var, None
            quad = yty - (w * (2.0 * xty - xtxw)).sum()
            g_s2 = -0.5 * n / s2 + 0.5 * quad / (s2 * s2)
            return ll, (xty - xtxw) / s2, g_s2
        ll = self._log_likelihood(w, s2, xtx, xty, yty, n, X, y)
        f = X @ w
        if self.likelihood == "probit":
            sign = 2.0 * y - 1.0
            ratio = torch.exp(-0.5 * f * f - 0.5 * math.log(2.0 * math.pi) - _log_ndtr(sign * f))  # phi / Phi
            r = sign * ratio
        else:
            r = y - torch.sigmoid(f)
        wts = self._rows()[1]
        return ll, X.mT @ (r if wts is None else wts.to(r.dtype) * r), None

    def _hessian(self, theta: torch.Tensor) -> torch.Tensor:
        """``[*b, P, P]`` Hessian of ``-log p`` at ``theta``."""
        xtx, xty, yty, X, y, b = self._data()
        R = xtx.shape[0]
        n = self._n_per_element(R)
        flat = theta.reshape(R, self.num_params).detach()

        def neg(t, a, c, e, Xr, yr, nr):
            return -self._log_density(t, a, c, e, nr, Xr, yr)

        with torch.enable_grad(), pyro.validation_enabled(False):
            if R == 1:  # P reverse passes through one graph: far cheaper than vmap's forward-over-reverse
                t = flat[0].clone().requires_grad_(True)
                (g,) = torch.autograd.grad(neg(t, xtx[0], xty[0], yty[0], X[0], y[0], n[0]), t, create_graph=True)
                rows = [torch.autograd.grad(g[i], t, retain_graph=True, allow_unused=True)[0]
                        for i in range(self.num_params)]
                H = torch.stack([torch.zeros_like(t) if r is None else r for r in rows])[None]
            else:
                H = torch.func.vmap(torch.func.hessian(neg))(flat, xtx, xty, yty, X, y, n)
        return H.reshape(*b, self.num_params, self.num_params).to(_DTYPE).detach()

    # ------------------------------------------------------------------ data
    def add(self, X: torch.Tensor, y: torch.Tensor) -> None:
        """Add rows ``X [*b, n, d]``, ``y [*b, n]`` (validated by the caller; broadcast to the batch)."""
        b = tuple(self.batch_shape)
        X = X.expand(*b, *X.shape[-2:]).to(_DTYPE)
        y = y.expand(*b, y.shape[-1]).to(_DTYPE)
        n = X.shape[-2]
        if self.likelihood == "gaussian" and self.forgetting is not None:
            # row i of the n new ones weighs lam^(n-1-i), what came before lam^n (as the Gibbs engine)
            self._xtx, self._xty, self._yty, _ = discount_statistics(self._xtx, self._xty, self._yty, X, y,
                                                                     self.forgetting)
        elif self.likelihood == "gaussian":
            self._xtx = self._xtx + X.mT @ X
            self._xty = self._xty + (X.mT @ y[..., None])[..., 0]
            self._yty = self._yty + (y * y).sum(-1)
        else:
            self._X, self._y, _ = append_rows(self._X, self._y, self.n, X, y)
        if self._n_eff is not None:
            self._n_eff = self._n_eff + n
        self.n += n
        if self._cache is not None:
            self._stale_cache = self._cache
        self._cache = None

    def restart(self, alarm: torch.Tensor, keep: float) -> None:
        """Adaptive forgetting's restart (issue 43): what the batch elements ``alarm [*b]`` learned so
        far weighs ``keep`` from now on (the prior kept). Gaussian likelihood: the sufficient
        statistics and each element's count (``_n_eff``) are multiplied by ``keep`` (the likelihood
        raised to ``keep``, exactly). 0/1 likelihoods: only ``keep = 0`` (``BayesianLinear`` checks
        it at construction): the element's rows are set to ``x = 0``, whose likelihood ``sigmoid(0)``
        or ``Phi(0)`` is a constant, so they no longer move its posterior. The next draw runs
        ``burn_in`` steps after a fresh preconditioner (the posterior widened), the restarted chains
        from the prior's median with the initial step size."""
        a2, a3 = alarm[..., None], alarm[..., None, None]
        if self.likelihood == "gaussian":
            n_eff = self._n_per_element(self.batch_shape.numel()).reshape(self.batch_shape) \
                if self._n_eff is None else self._n_eff
            self._xtx, self._xty, self._yty, self._n_eff = restart_statistics(
                self._xtx, self._xty, self._yty, n_eff, alarm, keep)
        else:
            if keep != 0.0:
                raise ValueError(f"keep: the Langevin engine restarts a 0/1 likelihood with keep=0 only, got {keep!r}")
            n = self.n
            self._X[..., :n, :] = torch.where(a3, torch.zeros((), dtype=_DTYPE, device=self._X.device),
                                              self._X[..., :n, :])
            self._y[..., :n] = torch.where(a2, torch.zeros((), dtype=_DTYPE, device=self._y.device),
                                           self._y[..., :n])
        # the restarted chains start again where a new chain starts (the prior's median), with the
        # initial step size: the old posterior's region and scale are the old world's
        start = self._initial_theta().to(self.theta.device)
        self.theta = torch.where(a2, start, self.theta)
        self.log_step = torch.where(alarm, torch.full_like(self.log_step, math.log(0.1)), self.log_step)
        self.accept_rate = torch.where(alarm, torch.zeros_like(self.accept_rate), self.accept_rate)
        self._cache = self._stale_cache = None  # (the state moved: no prior part to reuse)
        self._n_at_draw = 0
        self._n_at_refresh = self._refresh_origin = self.n

    # ------------------------------------------------------------------ the chain
    def refresh_preconditioner(self) -> None:
        """``Sigma = |H|^-1`` from the Hessian of ``-log p`` at the current state (eigenvalues in
        absolute value, floored at 1e-4, so that a flat direction proposes sds of at most 100
        unconstrained units, and at 1e-8 of the largest), and restart the step-size adaptation."""
        self._require_gradients()
        H = self._hessian(self.theta)
        H = 0.5 * (H + H.mT)
        if not bool(torch.isfinite(H).all()):
            return  # keep the previous preconditioner
        evals, evecs = torch.linalg.eigh(H)
        a = evals.abs()
        floor = torch.maximum(a.amax(-1, keepdim=True) * 1e-8, torch.full_like(a[..., :1], _MIN_CURVATURE))
        a = torch.maximum(a, floor)
        # Sigma = V diag(1/a) V^T, a factor of it: V diag(a^-1/2), then a Cholesky factor
        root = evecs * a.rsqrt()[..., None, :]
        sigma = root @ root.mT
        factor, info = torch.linalg.cholesky_ex(0.5 * (sigma + sigma.mT))
        ok = (info == 0)
        self.factor = torch.where(ok[..., None, None], factor, self.factor)
        self.log_step = torch.full_like(self.log_step, math.log(1.0))
        self._adapt_count = 0
        self._n_at_refresh = self.n
        self.accept_rate = torch.zeros_like(self.accept_rate)

    def _step(self, theta, value, grad, w, graph, log_step, generator: Generator, key: str, step_index: int):
        """One MALA step for every replication; returns the new ``(theta, value, grad, w, graph, log_step)``.
        With a recorded step (``_recorded_step``) ``value`` and ``grad`` may be None: the step computes
        them from ``graph``, the prior part at ``theta``."""
        b = tuple(self.batch_shape)
        xi = standard_normal((*b, self.num_params), generator, key=key + "/xi", device=theta.device)
        u = standard_uniform(b, generator, key=key + "/u", device=theta.device)
        k = self._adapt_count + 1
        step = self._recorded_step()
        if step is not None:  # one replication, Gaussian likelihood: the whole step is one recorded graph
            P = self.num_params
            n, xtx, xty, yty, _, _ = self._one_data()
            n_gain_inv_k = torch.tensor((n, k ** -0.6, 1.0 / k), dtype=_DTYPE, device=theta.device).unbind(0)
            out = step(theta.reshape(P), self.factor.reshape(P, P), log_step.reshape(()), xi.reshape(P), u.reshape(()),
                       *n_gain_inv_k, self.accept_rate.reshape(()), xtx, xty, yty, *self._prior_tuple(graph))
            nan_here, any_bad, accepted = out[0].tolist()
            if nan_here:
                self._cache = None
                raise self._nan_at_state()
            value, grad = out[1].reshape(b), out[2].reshape(*b, P)
            proposal, value_p, grad_p = out[3].reshape(*b, P), out[4].reshape(b), out[5].reshape(*b, P)
            new_log_step, accept_rate = out[6].reshape(b), out[7].reshape(b)
            graph_p = self._prior_from(out[8:])
            w_p = graph_p.w.reshape(*b, self.dim)
            bad, take = None, accepted > 0  # (the one chain's flags, read once above)
        else:
            h = log_step.exp()[..., None]  # [*b, 1]
            proposal, lt_g = _mala_move(theta, grad, self.factor, h, xi)
            value_p, grad_p, w_p, graph_p = self._evaluate(proposal)
            log_alpha = _mala_log_ratio(value, value_p, grad_p, self.factor, h, xi, lt_g)
            bad, accept, new_log_step, accept_rate = _mala_accept(value_p, grad_p, log_alpha, u, log_step,
                                                                  self.accept_rate, k ** -0.6, 1.0 / k)
            any_bad = bool(bad.any())
            take = bool(accept) if accept.numel() == 1 else None
        # a proposal whose density or gradient is not finite (a scale under- or overflowing far out in
        # a tail) is rejected (_mala_accept), as Stan rejects a divergent one; NaN at the chain's own
        # state, or NaN at _NAN_LIMIT proposals in a row of one chain, is a broken prior: an error
        if any_bad:
            if bad is None:  # recorded step: its one chain's proposal
                bad = torch.ones(b, dtype=torch.bool, device=theta.device)
            self.rejected_non_finite = self.rejected_non_finite + bad.long()
            nan = torch.isnan(value_p) | torch.isnan(grad_p).any(-1)
            self._nan_run = torch.where(nan, self._nan_run + 1, torch.zeros_like(self._nan_run))
            self._nan_pending = True
            if bool((self._nan_run >= _NAN_LIMIT).any()):
                where = (self._nan_run >= _NAN_LIMIT).reshape(-1).nonzero()[:, 0].tolist()
                self._nan_run = torch.zeros_like(self._nan_run)
                raise FloatingPointError(
                    f"prior {_describe(self.prior)}: Langevin step {step_index} produced NaN in the log density or its "
                    f"gradient at {_NAN_LIMIT} proposals in a row (replication {where[:5]}, {self.n} observations); "
                    "the model's state is left as it was. Check the prior for operations undefined on part of its "
                    "support, or use inference='nuts'")
        elif self._nan_pending:
            self._nan_run = torch.zeros_like(self._nan_run)
            self._nan_pending = False
        if take is not None:  # one chain: take the proposal or keep the state, no selects
            if take:
                theta, value, grad, w, graph = proposal, value_p, grad_p, w_p, graph_p
        else:
            theta = torch.where(accept[..., None], proposal, theta)
            value = torch.where(accept, value_p, value)
            grad = torch.where(accept[..., None], grad_p, grad)
            w = torch.where(accept[..., None], w_p, w)
        self._adapt_count = k
        self.accept_rate = accept_rate
        return theta, value, grad, w, graph, new_log_step

    def _advance(self, count: int, generator: Generator, key: str, keep: bool = False):
        """Run ``count`` steps from the current state, committing the state only if all succeed.
        Returns the ``[count, *b, P]`` states when ``keep``."""
        if count > 0:
            self._require_gradients()
        saved = (self.log_step.clone(), self._adapt_count, self.accept_rate.clone())
        theta = self.theta
        if count > 0 and self._recorded_step() is not None:  # the recorded step evaluates the state itself
            value = grad = None
            w, graph = self._current_prior()
        else:
            value, grad, w, graph = self._current()
        log_step = self.log_step
        kept = []
        try:
            for i in range(count):
                theta, value, grad, w, graph, log_step = self._step(theta, value, grad, w, graph, log_step,
                                                                    generator, key, i)
                if keep:
                    kept.append(theta)
        except FloatingPointError:
            self.log_step, self._adapt_count, self.accept_rate = saved
            raise
        self.theta, self.log_step, self._cache = theta, log_step, (value, grad, w, graph)
        self._stale_cache = None
        return torch.stack(kept) if keep else None

    def _current(self):
        """``(log p, grad, w, graph)`` at the current state under the current data."""
        if self._cache is not None:
            return self._cache
        stale = self._stale_cache
        if stale is not None and stale[3] is not None:  # one replication: the chain rule through the kept prior part
            value, grad = self._through(stale[3])
            shape = tuple(self.batch_shape)
            self._cache = (value.reshape(shape), grad.reshape(*shape, self.num_params), stale[2], stale[3])
        else:
            self._cache = self._evaluate(self.theta)
        self._stale_cache = None
        value, grad = self._cache[0], self._cache[1]
        if bool(torch.isnan(value + grad.sum(-1)).any()):  # a screen: NaN somewhere, or inf - inf
            bad = torch.isnan(value) | torch.isnan(grad).any(-1)
        else:
            bad = None
        if bad is not None and bool(bad.any()):
            self._cache = None
            raise self._nan_at_state(bad.reshape(-1).nonzero()[:, 0].tolist())
        return self._cache

    def _require_gradients(self) -> None:
        if torch.is_inference_mode_enabled():
            raise RuntimeError(
                f"prior {_describe(self.prior)}: the Langevin engine follows the gradient of the log posterior, which "
                "torch.inference_mode() switches off; draw from this model outside inference mode (torch.no_grad() "
                "is fine)")

    def _nan_at_state(self, where: list[int] | None = None) -> FloatingPointError:
        return FloatingPointError(
            f"prior {_describe(self.prior)}: Langevin step 0 produced NaN in the log density or its gradient at the "
            f"chain's current state (replication {(where or [0])[:5]}, {self.n} observations); the model's state is "
            "left as it was. Check the prior for operations undefined on part of its support, or use inference='nuts'")

    def weights(self, theta: torch.Tensor | None = None) -> torch.Tensor:
        """``[..., d]`` weights ``w(theta)`` of states ``theta [..., P]`` (default: the current state)."""
        theta = self.theta if theta is None else theta
        flat = theta.reshape(-1, self.num_params)
        with torch.no_grad(), pyro.validation_enabled(False):
            if flat.shape[0] == 1:
                w = self._prior_part(flat[0])[1][None]
            else:
                w = torch.func.vmap(lambda t: self._prior_part(t)[1])(flat)
        return w.reshape(*theta.shape[:-1], self.dim).to(_DTYPE)

    def noise_variance(self, theta: torch.Tensor | None = None) -> torch.Tensor | None:
        """``[...]`` noise variances of states ``theta [..., P]`` (None without a noise prior)."""
        if self._noise_prior is None:
            return None
        theta = self.theta if theta is None else theta
        return theta[..., self.sites[-1].slice.start].exp()

    def site_values(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        """Constrained values of every latent site for states ``theta [..., P]``: ``name -> [...,
        *site_shape]`` (the prior is run once per state: meant for diagnostics)."""
        flat = theta.reshape(-1, self.num_params)
        rows = []
        with torch.no_grad(), pyro.validation_enabled(False):
            for t in flat:
                handler = _Unconstrained(self._unpack(t))
                with handler:
                    self._prior_fn()
                row = dict(handler.constrained)
                if self._noise_prior is not None:
                    row[_NOISE_SITE] = t[self.sites[-1].slice.start].exp()
                rows.append(row)
        return {s.name: torch.stack([r[s.name] for r in rows]).to(_DTYPE).reshape(*theta.shape[:-1], *s.shape)
                for s in self.sites}

    # ------------------------------------------------------------------ queries
    def _pending_burn_in(self) -> bool:
        return self.n > 0 and self.n - self._n_at_draw >= max(self._n_at_draw, 1)

    def _refresh_due(self) -> bool:
        """The data doubled since the last preconditioner refresh (about ``log2(n)`` refreshes); after
        an adaptive restart, the rows since it (a restarted posterior narrows as a new one does)."""
        m, last = self.n - self._refresh_origin, self._n_at_refresh - self._refresh_origin
        return m > 0 and m >= 2 * max(last, 1) - (last == 0)

    def draw(self, generator: Generator = None, key: str = "weights") -> torch.Tensor:
        """Advance every chain by ``steps`` MALA steps (plus ``burn_in`` steps if the data at least
        doubled since the last draw; the preconditioner is refreshed first when the data doubled since
        its last refresh) and return the weights ``[*b, d]``.

        Under a ``DrawBatch`` of ``S`` (propensities, ``action_probabilities``): ``[S, *b, d]``
        weights from copies of the chain (``_draw_batch``)."""
        if isinstance(generator, DrawBatch):
            return self._draw_batch(generator, key)
        count = self.steps + (self.burn_in if self._pending_burn_in() else 0)
        if self._refresh_due():
            self.refresh_preconditioner()
        self._advance(count, generator, key + "/mala")
        self._n_at_draw = self.n
        return self._cache[2]

    def _fork(self) -> LangevinLinearPosterior:
        """A copy of the chain that can move without moving this one (the data and prior are shared:
        the steps replace the state's tensors, they never write into them)."""
        chain = object.__new__(type(self))
        chain.__dict__.update(self.__dict__)  # (not copy.copy: __getstate__ drops the cached evaluation)
        chain.factor, chain.theta, chain.log_step = self.factor.clone(), self.theta.clone(), self.log_step.clone()
        chain.accept_rate = self.accept_rate.clone()
        return chain

    def _draw_batch(self, batch: DrawBatch, key: str) -> torch.Tensor:
        """``S = batch.num_draws`` draws ``[S, *b, d]`` without moving the chain beyond one ordinary draw.

        How: the steps of an ordinary draw but the last (the burn-in when the data doubled, and
        the preconditioner refresh when due) run once; then ``S`` copies of that state each take
        the last MALA step with their own proposal and accept/reject uniform (from
        ``batch.generator``). The ``S`` draws are independent given the shared state, so
        ``(1 + n_a) / S`` estimates the probability of the played action given it.

        With ``batch.played`` (the ``Decider``) the shared steps run on the chain itself and it
        continues from the first copy, exactly as after one ordinary draw. Otherwise
        (``action_probabilities``) everything runs on a copy and the chain is left as it was.

        Cost: ``S`` MALA steps, one copy at a time (a log-density gradient each; the prior part
        at the shared state is evaluated once for all): about ``S`` times an ordinary draw
        (measured: 16 draws 7-10 ms, d = 4, a log-scale prior, one replication), plus the shared
        steps. Lower ``num_draws`` for a Langevin model that must decide fast.
        """
        shared = batch.generator
        base = self if batch.played else self._fork()
        count = base.steps + (base.burn_in if base._pending_burn_in() else 0)
        if base._refresh_due():
            base.refresh_preconditioner()
        base._advance(count - 1, shared, key + "/mala")
        if count >= 1:
            base._require_gradients()
            recorded = base._recorded_step()  # recorded once here, not once per copy (it depends on the model alone)
            value, grad, w, graph = base._current()
            if recorded is not None and (graph is None or graph.grad is None):
                # the prior part with its gradient at the shared state, evaluated once for all the copies
                base._cache = (value, grad, w, base._current_prior()[1])
            for name in ("_step_graph", "_step_graph_tried", "_graph", "_graph_tried"):
                self.__dict__[name] = base.__dict__[name]
        out, first = [], None
        for _ in range(batch.num_draws):
            chain = base._fork()
            chain._advance(1, shared, key + "/mala")
            out.append(chain._cache[2])
            first = chain if first is None else first
        if batch.played:
            self.__dict__.update(first.__dict__)
            self._n_at_draw = self.n
        return torch.stack(out)

    def fit(self, generator: Generator = None) -> None:
        """Refresh the preconditioner and run ``burn_in`` steps now (e.g. after one large ``update``)."""
        gen = generator if generator is not None else torch.Generator(device="cpu").manual_seed(self.seed)
        self.refresh_preconditioner()
        self._advance(self.burn_in, gen, "fit")
        self._n_at_draw = self.n

    def run(self, steps: int, generator: Generator = None, key: str = "run") -> torch.Tensor:
        """``[steps, *b, P]`` states of ``steps`` further steps of the chains (state advanced)."""
        out = self._advance(int(steps), generator, key, keep=True)
        self._n_at_draw = self.n
        return out

    def posterior_draws(self, generator: Generator = None) -> torch.Tensor:
        """``[S, *b, d]`` weights of ``S = predict_steps`` steps of a copy of the chains (after
        ``burn_in`` steps; a fresh preconditioner when the data doubled); the model's own chains do
        not move. Seeded by ``generator``, or by ``(seed, n)``."""
        import copy

        gen = generator if generator is not None else torch.Generator(device="cpu").manual_seed(self.seed + 7919 * self.n)
        self._recorded_step()  # recorded here, once, not in each copy (a model that only updates and predicts)
        chain = copy.copy(self)
        chain.factor, chain.theta, chain.log_step = self.factor.clone(), self.theta.clone(), self.log_step.clone()
        chain.accept_rate = self.accept_rate.clone()
        if chain._refresh_due():
            chain.refresh_preconditioner()
        chain._advance(self.burn_in, gen, "predict")
        states = chain._advance(self.predict_steps, gen, "predict", keep=True)
        return self.weights(states)

    def summary(self, X: torch.Tensor | None, generator: Generator = None, link=None):
        """Posterior summaries from ``predict_steps`` steps of a copy of the chains (after ``burn_in``
        steps); the model's own chains do not move.

        Returns ``(mean_w [*b, d], mean [*b, k], var [*b, k])`` of ``f = x^T w`` (``link(x^T w)``
        when ``link`` is given) at ``X [*b, k, d]`` (``None``: only the weight mean).
        """
        w = self.posterior_draws(generator)  # [S, *b, d]
        mean_w = w.mean(0)
        if X is None:
            return mean_w, None, None
        f = (w[..., None, :] @ X.mT)[..., 0, :]  # [S, *b, k]
        if link is not None:
            f = link(f)
        return mean_w, f.mean(0), f.var(0, unbiased=False)


def _recorded(fn) -> _Recorded | None:
    return None if fn is None else _Recorded(fn)


def _mala_move(theta, grad, L, h, xi):
    """The MALA proposal ``theta' = theta + (h/2) Sigma g + sqrt(h) L xi`` with ``Sigma = L L^T``,
    written ``theta + L ((h/2) L^T g + sqrt(h) xi)``. Shapes ``theta, grad, xi [*b, P]``, ``L [*b, P, P]``,
    ``h [*b, 1]``; returns ``(theta' [*b, P], L^T g [*b, P])``."""
    lt_g = (grad[..., None, :] @ L)[..., 0, :]
    return theta + (L @ (0.5 * h * lt_g + h.sqrt() * xi)[..., None])[..., 0], lt_g


def _mala_log_ratio(value, value_p, grad_p, L, h, xi, lt_g):
    """``log [p(theta') q(theta | theta') / (p(theta) q(theta' | theta))]`` (Roberts & Rosenthal 1998,
    eq. 3) ``[*b]``. In whitened coordinates the reverse move is ``L^-1 (theta - theta' - (h/2) Sigma g')
    = -(sqrt(h) xi + (h/2) L^T (g + g'))`` and the forward one ``-sqrt(h) xi``, so no triangular solve
    is needed."""
    lt_gp = (grad_p[..., None, :] @ L)[..., 0, :]
    back = h.sqrt() * xi + 0.5 * h * (lt_g + lt_gp)
    return value_p - value - 0.5 * ((back * back).sum(-1) / h[..., 0] - (xi * xi).sum(-1))


def _mala_accept(value_p, grad_p, log_alpha, u, log_step, accept_rate, gain, inv_k):
    """Accept with probability ``min(1, exp(log_alpha))`` (``u`` uniform; a proposal whose density or
    gradient is not finite never), and adapt: ``log h += gain (alpha - 0.574)`` clamped to ``[-30, 5]``
    (``gain = k^-0.6``), ``accept_rate += (alpha - accept_rate) / k``. Returns ``(bad, accept,
    log_step, accept_rate)``, each ``[*b]``."""
    bad = ~torch.isfinite(value_p + grad_p.sum(-1))  # (a sum overflowing counts as not finite)
    log_alpha = torch.where(bad, torch.full_like(log_alpha, -math.inf), log_alpha)
    accept = torch.log(u) < log_alpha
    alpha = log_alpha.clamp(max=0.0).exp()
    log_step = (log_step + gain * (alpha - _TARGET_ACCEPT)).clamp(-30.0, 5.0)
    return bad, accept, log_step, accept_rate + (alpha - accept_rate) * inv_k


def _log_ndtr(x: torch.Tensor) -> torch.Tensor:
    """``log Phi(x)`` from ops that ``torch.func.vmap`` batches (``torch.special.log_ndtr`` has no
    batching rule): ``log(erfc(-x / sqrt 2) / 2)`` for ``x > -20`` (``erfc`` keeps relative precision
    in the lower tail, where ``1 + erf`` would cancel); below, the asymptotic series ``-x^2/2 - log(-x) - log(2 pi)/2 +
    log(1 - 1/x^2 + 3/x^4 - 15/x^6 + 105/x^8)`` (Abramowitz & Stegun 26.2.12), error below 1e-10."""
    safe = x.clamp(min=-20.0)
    tail = x.clamp(max=-20.0)
    u = 1.0 / (tail * tail)
    series = 1.0 + u * (-1.0 + u * (3.0 + u * (-15.0 + 105.0 * u)))
    asymptotic = -0.5 * tail * tail - torch.log(-tail) - 0.5 * math.log(2.0 * math.pi) + torch.log(series)
    body = torch.log(0.5 * torch.special.erfc(-safe * math.sqrt(0.5)))
    return torch.where(x > -20.0, body, asymptotic)


def _describe(prior) -> str:
    name = getattr(prior, "__name__", None) or type(prior).__name__
    return repr(name)

