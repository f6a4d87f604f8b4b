"""Constrained off-policy training of a stochastic policy (Kachuee & Lee 2022, s.3).

Objective (eq. 3): the IPS loss ``L(x, a, r) = -r Pi_theta(a|x) / Pi_0(a|x)``, under
per-domain replication constraints ``c_min_k <= R_theta(x) <= c_max_k`` (eq. 1-2). Four
methods (s.4.3), each a small dataclass passed as ``method=``:

* ``IPS`` - eq. (3) alone, constraints ignored.
* ``Quadratic`` - ``L + w (max(0, c_min_k - R)^2 + max(0, R - c_max_k)^2)`` with one
  constant weight ``w`` for every domain (s.2.2, s.4.3).
* ``Minimax`` - Algorithm 1: the penalised loss of eq. (4)/(5)
  ``L + e^{u_k} max(0, c_min_k - R) + e^{v_k} max(0, R - c_max_k)``; the max player
  ascends ``u <- u + eta grad_u L`` every ``tau`` iterations, then ``eta <- gamma eta``,
  ``tau <- xi tau``; the policy descends with Adam.
* ``MetaGradient`` - Algorithm 2: one differentiable SGD step (rate ``eta``) of the
  same penalised loss on a clone ``theta'`` of the policy, the meta objective of eq. (6)
  ``(1 - lambda) L + lambda (max(0, c_min_k - R) + max(0, R - c_max_k)) / p(k)`` on
  another batch at ``theta'``, its gradient with respect to ``u, v`` through the inner
  step, Adam on ``u, v``; then Adam on ``theta`` with the penalised loss at the new ``u, v``.

Every expectation is a mean over the mini-batch; ``e^{u_k}`` multiplies each sample of
domain ``k``, so ``dL/du_k = e^{u_k} sum_{i in k} max(0, c_min_k - R_i) / B``.

Choices where the paper is silent (documented again in ``docs/offline.md``):

* **Finite multipliers.** With ``eta = 1, gamma = 1`` Algorithm 1's update
  ``u <- u + eta e^u h`` is the Euler scheme of ``du/dt = e^u h`` which reaches infinity in
  finite time (``u(t) = -log(e^{-u_0} - h t)``). Both ``u`` and ``v`` are clipped at
  ``u_max = 25`` (a penalty weight of ``e^25 ~ 7e10``, the top of the paper's Figure 4);
  the clipped update ``min(u + eta e^u h, u_max)`` cannot overflow since ``e^u`` is
  evaluated at ``u <= u_max``. The meta-gradient's ``u, v`` are clipped at the same bound.
* **tau** is an update period in iterations; it is used rounded, ``max(1, round(tau))``.
* **The meta-gradient** is computed exactly but without second-order autograd: since
  ``theta' = theta - eta grad_theta L_inner(theta, u, v)`` depends on ``u_k`` only through
  ``e^{u_k} grad_theta H_k(theta)`` (``H_k`` the batch's summed hinge of domain ``k`` over
  ``B``), ``dL_meta/du_k = -eta e^{u_k} <grad L_meta(theta'), grad_theta H_k(theta)>``: one
  forward-mode product (dual numbers, ``torch.autograd.forward_ad``) of the policy in the
  direction ``grad L_meta(theta')``, on the violating rows of the inner batch only (see
  ``_meta_core``). ``meta_gradient_reference`` differentiates literally through the
  inner step with nested ``torch.func.grad`` (tests check they agree to 1e-9). A domain with
  no violating sample in the inner batch has ``grad_theta H_k = 0`` and so a meta-gradient
  of exactly zero (``torch.relu``'s derivative is 0 where inactive).
* **Cost.** A meta-gradient step is one forward and backward pass on the inner batch, one
  forward pass on the meta batch (backward on its violating rows only when ``lambda = 1``)
  and a forward-mode pass plus a backward on the inner batch's violating rows, so its cost
  grows with the violating share ``f``: measured 3x to 3.8x an IPS step for ``f`` from 0.1
  to 0.6 (``benchmarks/offline.py``).
* **Mini-batches.** Each epoch gathers one shuffled copy of the training rows
  (``index_select``, 3x faster than advanced indexing) and slices contiguous batches.
* **p(k)** of eq. (6) is the share of domain ``k`` in the training data.
* **The second batch** of Algorithm 2 is drawn from an independent shuffle of the
  training data each epoch (the paper: "another batch of data").
* **Early selection** (s.4.3): after every epoch the policy is scored on the validation
  split; a constrained method keeps the epoch with the lowest macro-averaged violation
  rate (ties: higher validation SNIPS value); IPS, which has no constraint to satisfy, keeps
  the epoch with the highest validation SNIPS value. ``select=`` overrides this.
  ``patience=`` stops when the criterion has not improved for that many epochs ("until
  convergence"); the default runs all epochs.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from typing import NamedTuple

import torch
from torch import nn
from torch.func import functional_call, grad

from ..threads import single_thread

_log = logging.getLogger(__name__)
from .constraints import ReplicationConstraints, replication_rate
from .data import LoggedData
from .estimators import snips, violation_rates
from .jet import check_engine, jet_class
from .policy import check_policy_output, mask_probs, policy_probs

__all__ = [
    "IPS",
    "METHODS",
    "Batch",
    "MetaGradient",
    "Minimax",
    "Quadratic",
    "TrainResult",
    "make_method",
    "meta_gradient",
    "meta_gradient_reference",
    "train_policy",
]

U_MAX = 25.0


# ---------------------------------------------------------------------- methods
@dataclasses.dataclass(frozen=True)
class IPS:
    """Eq. (3) only (the unconstrained baseline)."""

    name = "ips"
    constrained = False

    def to_dict(self) -> dict:
        return {"method": self.name}


@dataclasses.dataclass(frozen=True)
class Quadratic:
    """Quadratic penalty with one constant ``weight`` (the paper's grid: 0.1 .. 1000; Table 2: 10 / 1000 / 1000)."""

    weight: float = 10.0
    name = "quadratic"
    constrained = True

    def __post_init__(self):
        if not (math.isfinite(float(self.weight)) and float(self.weight) >= 0):
            raise ValueError(f"Quadratic.weight: expected a finite number >= 0, got {self.weight!r}")

    def to_dict(self) -> dict:
        return {"method": self.name, "weight": float(self.weight)}


@dataclasses.dataclass(frozen=True)
class Minimax:
    """Algorithm 1 (primal-dual minimax): max-player rate ``eta``, its decay ``gamma``, update
    period ``tau`` and its decay ``xi``; ``u, v`` clipped at ``u_max`` (module docstring).
    The paper's grid: eta in {1, 0.1, 0.01}, gamma in {1, 0.999, 0.995}, tau = xi = 1.
    ``eta = 0`` freezes ``u = v = 0``: eq. (4) with a constant hinge-penalty weight of 1."""

    eta: float = 0.1
    gamma: float = 1.0
    tau: float = 1.0
    xi: float = 1.0
    u_max: float = U_MAX
    name = "minimax"
    constrained = True

    def __post_init__(self):
        if not (math.isfinite(float(self.eta)) and float(self.eta) >= 0):
            raise ValueError(f"Minimax.eta: expected a finite number >= 0, got {self.eta!r}")
        for attr in ("tau", "xi"):
            v = float(getattr(self, attr))
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"Minimax.{attr}: expected a finite number > 0, got {getattr(self, attr)!r}")
        if not (0 < float(self.gamma) <= 1):
            raise ValueError(f"Minimax.gamma: expected a value in (0, 1], got {self.gamma!r}")
        if not (math.isfinite(float(self.u_max)) and 0 <= float(self.u_max) <= 80):
            raise ValueError(f"Minimax.u_max: expected a number in [0, 80] (e^u_max must stay finite), got {self.u_max!r}")

    def to_dict(self) -> dict:
        return {"method": self.name, "eta": self.eta, "gamma": self.gamma, "tau": self.tau, "xi": self.xi,
                "u_max": self.u_max}


@dataclasses.dataclass(frozen=True)
class MetaGradient:
    """Algorithm 2: inner SGD rate ``eta``, meta-objective balance ``lam`` (eq. 6; the paper
    uses 1), Adam rate ``lr`` for ``u, v`` (the paper: Adam's default, 1e-3), clip ``u_max``.
    ``reference=True`` uses ``meta_gradient_reference`` (slower, same numbers); ``engine``
    picks how the fast path differentiates the policy (``"auto"``, ``"jet"``, ``"autograd"``;
    see ``_meta_core``: same numbers up to float rounding)."""

    eta: float = 0.1
    lam: float = 1.0
    lr: float = 1e-3
    u_max: float = U_MAX
    reference: bool = False
    engine: str = "auto"
    name = "meta"
    constrained = True

    def __post_init__(self):
        for attr in ("eta", "lr"):
            v = float(getattr(self, attr))
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"MetaGradient.{attr}: expected a finite number > 0, got {getattr(self, attr)!r}")
        if not (0 <= float(self.lam) <= 1):
            raise ValueError(f"MetaGradient.lam: expected a value in [0, 1], got {self.lam!r}")
        if not (math.isfinite(float(self.u_max)) and 0 <= float(self.u_max) <= 80):
            raise ValueError(f"MetaGradient.u_max: expected a number in [0, 80], got {self.u_max!r}")
        check_engine(self.engine, "MetaGradient.engine")

    def to_dict(self) -> dict:
        return {"method": self.name, "eta": self.eta, "lam": self.lam, "lr": self.lr, "u_max": self.u_max}


METHODS = {"ips": IPS, "quadratic": Quadratic, "minimax": Minimax, "meta": MetaGradient}


def make_method(name: str, **params):
    """A method by name (``"ips"``, ``"quadratic"``, ``"minimax"``, ``"meta"``) with hyperparameters."""
    if name not in METHODS:
        raise ValueError(f"method: unknown name {name!r}; expected one of {sorted(METHODS)}")
    try:
        return METHODS[name](**params)
    except TypeError as exc:
        fields = [f.name for f in dataclasses.fields(METHODS[name])]
        raise ValueError(f"method {name!r}: bad hyperparameters {sorted(params)}; expected some of {fields}") from exc


# ---------------------------------------------------------------------- losses
class Batch(NamedTuple):
    """A mini-batch: ``x [B, d]``, ``a [B]``, ``r [B]``, ``p0a [B]`` (= Pi_0(a|x)), ``k [B]``,
    ``pi0 [B, A]`` or None, ``mask [B, A]`` or None."""

    x: torch.Tensor
    a: torch.Tensor
    r: torch.Tensor
    p0a: torch.Tensor
    k: torch.Tensor
    pi0: torch.Tensor | None
    mask: torch.Tensor | None

    @staticmethod
    def take(data: LoggedData, idx: torch.Tensor, p0a: torch.Tensor) -> Batch:
        """Rows ``idx`` of ``data`` (``index_select``: 3x faster than advanced indexing on CPU)."""

        def sel(t):
            return None if t is None else t.index_select(0, idx)

        return Batch(sel(data.contexts), sel(data.actions), sel(data.rewards), sel(p0a), sel(data.domains),
                     sel(data.logging_probs), sel(data.action_mask))

    def rows(self, start: int, stop: int) -> Batch:
        """Rows ``start:stop`` (views, no copy)."""
        return Batch(*(None if t is None else t[start:stop] for t in self))


def _terms(probs: torch.Tensor, b: Batch, constraints: ReplicationConstraints | None):
    """Per-sample IPS loss (eq. 3) and hinges ``[B]`` (hinges None without constraints)."""
    pa = probs.gather(1, b.a[:, None])[:, 0]
    ips_i = -b.r * pa / b.p0a
    if constraints is None:
        return ips_i, None, None
    rate = replication_rate(probs, b.pi0)
    hmin, hmax = constraints.hinges(rate, b.k)
    return ips_i, hmin, hmax


def _penalised(ips_i, hmin, hmax, k, u, v) -> torch.Tensor:
    """Eq. (4) on a batch: ``mean(L + e^{u_k} hinge_min + e^{v_k} hinge_max)``."""
    wu = torch.exp(u).to(ips_i.dtype)[k]
    wv = torch.exp(v).to(ips_i.dtype)[k]
    return (ips_i + wu * hmin + wv * hmax).mean()


def _meta_objective(ips_i, hmin, hmax, k, lam: float, prior: torch.Tensor) -> torch.Tensor:
    """Eq. (6) on a batch: ``mean((1 - lam) L + lam (hinge_min + hinge_max) / p(k))``."""
    inv = (1.0 / prior).to(ips_i.dtype)[k]
    return ((1.0 - lam) * ips_i + lam * (hmin + hmax) * inv).mean()


@torch.no_grad()
def _output_grads(probs: torch.Tensor, b: Batch, constraints: ReplicationConstraints, ips: bool = True):
    """Gradients of the per-sample terms with respect to the policy's output ``probs [B, A]``.

    Returns ``g_ips``, ``g_min``, ``g_max`` (``[B, A]``: the derivatives of the batch sums of
    ``-r p_a / p0_a``, ``max(0, c_min - R)`` and ``max(0, R - c_max)``), the hinges
    ``hmin``, ``hmax`` and the IPS loss terms ``ips_i`` (``[B]``). Closed forms of what autograd gives for ``_terms``
    (``d|z|/dz = sign(z)``, 0 at 0; ``d relu(z)/dz = 1[z > 0]``), checked in the tests.
    ``ips=False`` skips the IPS terms (returned as None) when the caller does not need them.
    """
    g_ips = ips_i = None
    if ips:
        coef = (-b.r / b.p0a).to(probs.dtype)
        ips_i = coef * probs.gather(1, b.a[:, None])[:, 0]
        g_ips = torch.zeros_like(probs).scatter_(1, b.a[:, None], coef[:, None])
    diff = probs - b.pi0
    rate = 1.0 - 0.5 * diff.abs().sum(-1)
    hmin, hmax = constraints.hinges(rate, b.k)
    half_sign = torch.sign(diff).mul_(0.5)  # = -dR/dprobs
    g_min = half_sign * (hmin > 0).to(probs.dtype)[:, None]
    g_max = half_sign.mul_((hmax > 0).to(probs.dtype)[:, None]).neg_()
    return g_ips, g_min, g_max, hmin, hmax, ips_i


def _params(policy: nn.Module):
    params = {n: p.detach() for n, p in policy.named_parameters()}
    buffers = {n: b.detach() for n, b in policy.named_buffers()}
    return params, buffers


def _meta_core(policy: nn.Module, b1: Batch, b2: Batch, constraints: ReplicationConstraints, u: torch.Tensor,
               v: torch.Tensor, eta: float, lam: float, prior: torch.Tensor, engine: str = "auto"):
    """Meta-gradient of Algorithm 2 and a closure giving the policy gradient at the updated ``u, v``.

    ``theta' = theta - eta grad_theta L_inner(theta, u, v)`` depends on ``u_k`` only through
    ``e^{u_k} grad_theta H_k(theta)`` (``H_k``: the summed min-hinge of domain ``k`` in ``b1``
    over ``B``), so ``dL_meta/du_k = -eta e^{u_k} <g_meta, grad_theta H_k(theta)>`` with
    ``g_meta = grad L_meta(theta')``; likewise for ``v``. Passes over the policy:

    1. forward on ``b1`` at ``theta``, the closed-form output cotangent of the penalised loss
       (eq. 5; ``_output_grads``) and a VJP: the inner gradient ``g_inner``;
    2. forward on ``b2`` at ``theta' = theta - eta g_inner`` and a VJP seeded with eq. (6)'s
       output cotangent: ``g_meta`` (with ``lam = 1`` and no row of ``b2`` violating at
       ``theta'`` the VJP is skipped: the meta-gradient is 0);
    3. on the rows of ``b1`` that violate (the others have ``grad_theta hinge = 0`` exactly):
       the JVP ``J g_meta`` of the policy's output at ``theta`` (``J = d probs / d theta``),
       contracted with each row's hinge gradient and summed per domain;
    4. ``finish(u_new, v_new)``: the gradient of eq. (5) on ``b1`` at ``theta`` with the
       updated weights, ``g_inner + J_rows^T (C_new - C_old)``: the loss's output cotangent
       ``C`` changes on violating rows only, and the gradient is linear in it.

    ``engine``: how the passes differentiate the policy (``bayes_safe.offline.jet``):
    ``"jet"`` (closed forms from pass 1's stored activations, for ``nn.Sequential`` MLPs: passes
    3 and 4 need no new forward), ``"autograd"`` (any module: pass 3 is one forward with dual
    numbers that records a graph, which pass 4 reuses), ``"auto"`` (the jet when it applies).

    Returns ``(grad_u [M], grad_v [M], finish, info)``; both gradients are float64; ``info``
    holds the number of violating rows of ``b1`` and the penalised loss (eq. 5) at ``u, v``.
    """
    Jet = jet_class(policy, engine)
    params, _ = _params(policy)
    n1, n2 = b1.x.shape[0], b2.x.shape[0]
    m = constraints.n_domains
    names = list(params)

    # 1. inner pass: forward on b1 at theta, closed-form output cotangent, VJP
    jet1 = Jet(policy, params, b1.x, b1.mask)
    g_ips, g_min, g_max, hmin, hmax, ips_i = _output_grads(jet1.probs, b1, constraints)
    k = b1.k

    def cotangent(uu, vv, kk, gi, gmin, gmax):
        wu = torch.exp(uu).div_(n1).to(gi.dtype)[kk, None]
        wv = torch.exp(vv).div_(n1).to(gi.dtype)[kk, None]
        return (gi / n1).addcmul_(wu, gmin).addcmul_(wv, gmax)

    g_inner = jet1.vjp(cotangent(u, v, k, g_ips, g_min, g_max))
    violating = (hmin > 0) | (hmax > 0)
    rows1 = violating.nonzero().reshape(-1)
    zero = torch.zeros(m, dtype=torch.float64)
    info = {"violating": int(rows1.numel()), "loss": float(_penalised(ips_i, hmin, hmax, k, u, v))}
    if rows1.numel() == 0:  # no violation in the inner batch: every meta-gradient is exactly zero
        return zero, zero.clone(), lambda uu, vv: g_inner, info

    # 2. meta pass at theta' = theta - eta g_inner, seeded with eq. (6)'s output cotangent
    clone = {nm: params[nm] - eta * g_inner[nm] for nm in names}
    jet2 = Jet(policy, clone, b2.x, b2.mask)
    c2ips, c2min, c2max, lo2, hi2, _ = _output_grads(jet2.probs, b2, constraints, ips=lam != 1.0)
    g_meta = None
    if lam != 1.0:
        c2 = (lam / n2 / prior).to(jet2.probs.dtype)[b2.k][:, None] * (c2min + c2max)
        g_meta = jet2.vjp(c2.add_(c2ips, alpha=(1.0 - lam) / n2))
    else:  # only the rows of b2 that violate at theta' have a cotangent
        rows2 = ((lo2 > 0) | (hi2 > 0)).nonzero().reshape(-1)
        if rows2.numel():
            c2 = (1.0 / n2 / prior).to(jet2.probs.dtype)[b2.k[rows2]][:, None] * (c2min[rows2] + c2max[rows2])
            g_meta = jet2.vjp(c2, rows2)
    del jet2

    # 3. J g_meta on the violating rows of b1 (what finish's VJP reuses)
    kr, g_min_r, g_max_r = k[rows1], g_min[rows1], g_max[rows1]
    on_rows = (kr, g_ips[rows1], g_min_r, g_max_r)
    c_old = cotangent(u, v, *on_rows)

    def finish(u_new, v_new):
        corr = jet1.vjp(cotangent(u_new, v_new, *on_rows) - c_old, rows1)
        return {nm: g_inner[nm] + corr[nm] for nm in names}

    if g_meta is None:  # the meta objective is flat at theta'
        return zero, zero.clone(), finish, info
    dprobs = jet1.jvp(g_meta, rows1)
    s_min = torch.zeros(m, dtype=torch.float64).index_add_(0, kr, (g_min_r * dprobs).sum(1).to(torch.float64)) / n1
    s_max = torch.zeros(m, dtype=torch.float64).index_add_(0, kr, (g_max_r * dprobs).sum(1).to(torch.float64)) / n1
    return -eta * torch.exp(u) * s_min, -eta * torch.exp(v) * s_max, finish, info


def meta_gradient(policy: nn.Module, b1: Batch, b2: Batch, constraints: ReplicationConstraints, u: torch.Tensor,
                  v: torch.Tensor, *, eta: float, lam: float, prior: torch.Tensor, engine: str = "auto"):
    """Exact meta-gradient of Algorithm 2 (module docstring), via one JVP (``_meta_core``).

    Args:
        policy: the policy at ``theta`` (its parameters are read, not changed).
        b1: the inner batch ``(x, a, r, k)``; b2: the meta batch ``(x', a', r', k')``.
        u, v: ``[M]`` float64 log penalty weights.
        eta: inner SGD rate; lam: eq. (6) balance; prior: ``[M]`` ``p(k)``.
        engine: ``"auto"``, ``"jet"`` (``nn.Sequential`` MLPs) or ``"autograd"`` (any module).

    Returns:
        ``(grad_u, grad_v)``, two ``[M]`` float64 tensors: ``dL_meta/du`` and ``dL_meta/dv``.
    """
    grad_u, grad_v, _, _ = _meta_core(policy, b1, b2, constraints, u.detach(), v.detach(), eta, lam, prior, engine)
    return grad_u.detach(), grad_v.detach()


def meta_gradient_reference(policy: nn.Module, b1: Batch, b2: Batch, constraints: ReplicationConstraints,
                            u: torch.Tensor, v: torch.Tensor, *, eta: float, lam: float, prior: torch.Tensor):
    """The meta-gradient of Algorithm 2 taken literally: clone ``theta``, one differentiable SGD
    step of the penalised loss (eq. 5) on ``b1`` with nested ``torch.func.grad``, the meta
    objective (eq. 6) on ``b2`` at ``theta'``, differentiated with respect to ``(u, v)``.

    Same arguments and returns as ``meta_gradient`` (which is faster and must agree).
    """
    params, buffers = _params(policy)

    def inner_loss(p, uu, vv):
        probs = mask_probs(functional_call(policy, (p, buffers), (b1.x,)), b1.mask)
        i1, lo1, hi1 = _terms(probs, b1, constraints)
        return _penalised(i1, lo1, hi1, b1.k, uu, vv)

    def meta_of(uu, vv):
        g = grad(inner_loss)(params, uu, vv)
        clone = {name: p - eta * g[name] for name, p in params.items()}
        probs2 = mask_probs(functional_call(policy, (clone, buffers), (b2.x,)), b2.mask)
        i2, lo2, hi2 = _terms(probs2, b2, constraints)
        return _meta_objective(i2, lo2, hi2, b2.k, lam, prior)

    return grad(meta_of, argnums=(0, 1))(u, v)


# ---------------------------------------------------------------------- training
@dataclasses.dataclass
class TrainResult:
    """What ``train_policy`` returns.

    Attributes:
        policy: the trained module, with the selected epoch's weights loaded.
        method: the method's hyperparameters (``to_dict``).
        history: one dict per epoch (validation ``macro``, ``micro``, ``value`` (SNIPS),
            training ``loss`` (mean over the epoch's batches), ``train_violation`` (share of
            the epoch's training rows that violated when their batch was used), ``u_mean``,
            ``seconds`` (wall), ``cpu_seconds`` (process CPU time, robust to a shared machine));
            epoch 0 is the initial policy.
        best_epoch: the selected epoch (1-based; 0 = the initial policy was never beaten).
        log_weights: ``{"u": [T, M], "v": [T, M]}`` float64 log penalty weights after each of
            the first ``T = record_weights`` iterations (empty for IPS; constant for quadratic).
        u, v: ``[M]`` final log penalty weights.
        steps: optimisation steps taken; seconds: training time (without validation);
        samples_per_second: logged samples processed per second of training.
    """

    policy: nn.Module
    method: dict
    history: list
    best_epoch: int
    log_weights: dict
    u: torch.Tensor
    v: torch.Tensor
    steps: int
    seconds: float
    samples_per_second: float

    def summary(self) -> dict:
        return {"method": self.method, "best_epoch": self.best_epoch, "steps": self.steps, "seconds": self.seconds,
                "samples_per_second": self.samples_per_second, "history": self.history,
                "u": self.u.tolist(), "v": self.v.tolist()}


def _validate_inputs(policy, train, constraints, method, valid, epochs, batch_size, lr):
    if not isinstance(policy, nn.Module):
        raise TypeError(f"policy: expected a torch.nn.Module ending in a softmax, got {type(policy).__name__}")
    if not any(True for _ in policy.parameters()):
        raise ValueError("policy: the module has no parameters to train")
    if not isinstance(train, LoggedData):
        raise TypeError(f"train: expected a LoggedData, got {type(train).__name__}")
    if int(epochs) < 1:
        raise ValueError(f"epochs: expected a positive int, got {epochs!r}")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
    if not (math.isfinite(float(lr)) and float(lr) > 0):
        raise ValueError(f"lr: expected a finite number > 0, got {lr!r}")
    if method.constrained:
        if constraints is None:
            raise ValueError(f"constraints: method {method.name!r} needs a ReplicationConstraints")
        train.require_logging_probs(f"method {method.name!r}")
    for name, data in (("train", train), ("valid", valid)):
        if data is None or constraints is None:
            continue
        constraints.check_domains(data.domain_names, name)
        counts = data.domain_counts()
        empty = [d for d, c, on in zip(data.domain_names, counts.tolist(), constraints.constrained().tolist())
                 if on and c == 0]
        if empty and name == "train":
            raise ValueError(f"train: constrained domain(s) {empty} have no samples; drop their constraints or add data")
    if valid is not None:
        if not isinstance(valid, LoggedData):
            raise TypeError(f"valid: expected a LoggedData or None, got {type(valid).__name__}")
        if valid.n_actions != train.n_actions or valid.n_features != train.n_features:
            raise ValueError("valid: n_actions and n_features must match train")


def _evaluate(policy, valid: LoggedData, constraints) -> dict:
    probs = policy_probs(policy, valid.contexts, valid.action_mask)
    out = {"value": snips(probs, valid)}
    if constraints is not None and valid.logging_probs is not None:
        vr = violation_rates(probs, valid, constraints)
        out.update(macro=vr["macro"], micro=vr["micro"])
    return out


def train_policy(
    policy: nn.Module,
    train: LoggedData,
    constraints: ReplicationConstraints | None = None,
    method=None,
    *,
    valid: LoggedData | None = None,
    epochs: int = 32,
    batch_size: int = 4096,
    lr: float = 1e-3,
    seed: int = 0,
    select: str = "auto",
    patience: int | None = None,
    record_weights: int = 3000,
    threads: int | None = 1,
    callback=None,
    verbose: bool = False,
) -> TrainResult:
    """Train ``policy`` off-policy on ``train`` with one of the four methods (module docstring).

    Args:
        policy: a module mapping contexts ``[B, d]`` to probabilities ``[B, A]`` (see
            ``bayes_safe.offline.policy.mlp_policy``); trained in place.
        train: logged data (with ``logging_probs`` for the constrained methods).
        constraints: per-domain replication ranges (needed by the constrained methods, and
            for violation-based selection).
        method: ``IPS`` (default), ``Quadratic``, ``Minimax``,
            ``MetaGradient``, or a name for ``make_method`` with default settings.
        valid: validation split for early selection (None: keep the last epoch).
        epochs: passes over ``train`` (the paper: up to 32).
        batch_size: mini-batch size ``B``.
        lr: Adam learning rate of the policy (the paper: Adam's default, 1e-3).
        seed: seed of the shuffles (the policy's initialisation is the caller's).
        select: ``"auto"`` (module docstring), ``"violation"``, ``"value"`` or ``"last"``.
        patience: stop after this many epochs without improvement (None: never).
        record_weights: how many first iterations' log penalty weights to keep (Figure 4).
        threads: torch intra-op threads while training (1: ``bayes_safe.threads.single_thread``;
            None: leave the setting alone).
        callback: ``callback(epoch, policy) -> dict`` called after every epoch (and for the
            initial policy, epoch 0, when ``valid`` is given); its entries are added to that
            epoch's ``history`` row (e.g. test metrics for a learning curve). Not timed.
        verbose: one line per epoch, at INFO on the ``bayes_safe.offline.training`` logger (printed
            as ``bayes-safe train: ...`` when the application configured no logging of its own).
    """
    if method is None:
        method = IPS()
    elif isinstance(method, str):
        method = make_method(method)
    if not hasattr(method, "constrained") or getattr(method, "name", None) not in METHODS:
        raise TypeError(f"method: expected IPS, Quadratic, Minimax, MetaGradient or a name, got {method!r}")
    _validate_inputs(policy, train, constraints, method, valid, epochs, batch_size, lr)
    if select not in ("auto", "violation", "value", "last"):
        raise ValueError(f"select: expected 'auto', 'violation', 'value' or 'last', got {select!r}")
    if valid is None:
        select = "last"
    elif select == "auto":
        select = "violation" if (method.constrained and valid.logging_probs is not None) else "value"
    if select == "violation" and (constraints is None or valid.logging_probs is None):
        raise ValueError("select='violation' needs constraints and a validation split with logging_probs")
    if patience is not None and int(patience) < 1:
        raise ValueError(f"patience: expected a positive int or None, got {patience!r}")
    cons = constraints if method.constrained else None

    if threads is None:
        import contextlib

        ctx = contextlib.nullcontext()
    elif int(threads) == 1:
        ctx = single_thread()
    else:
        ctx = _n_threads(int(threads))
    with ctx:
        return _train(policy, train, cons, constraints, method, valid, int(epochs), int(batch_size), float(lr),
                      int(seed), select, patience, int(record_weights), callback, verbose)


class _n_threads:
    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self.old = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.old)


def _train(policy, train, cons, eval_cons, method, valid, epochs, batch_size, lr, seed, select, patience,
           record_weights, callback, verbose) -> TrainResult:
    n = len(train)
    m = train.n_domains
    batch_size = min(batch_size, n)
    g = torch.Generator().manual_seed(seed)
    p0a = train.propensities.to(torch.float32)
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    u = torch.zeros(m, dtype=torch.float64)
    v = torch.zeros(m, dtype=torch.float64)
    prior = train.domain_prior()
    if isinstance(method, MetaGradient):
        u.requires_grad_(True)
        v.requires_grad_(True)
        opt_uv = torch.optim.Adam([u, v], lr=method.lr)
    if isinstance(method, Minimax):
        eta, tau = float(method.eta), float(method.tau)
    quad = torch.full((m,), math.log(method.weight) if isinstance(method, Quadratic) and method.weight > 0 else 0.0,
                      dtype=torch.float64)

    # check the policy's output once, on a small batch
    with torch.no_grad():
        probe = train.contexts[: min(8, n)]
        check_policy_output(policy(probe), probe.shape[0], train.n_actions)

    trace_u: list[torch.Tensor] = []
    trace_v: list[torch.Tensor] = []
    history: list[dict] = []
    best_key, best_state, best_epoch, stale = None, copy.deepcopy(policy.state_dict()), 0, 0
    steps, train_seconds = 0, 0.0

    def key_of(ev):
        if select == "violation":
            return (ev["macro"], -ev["value"])
        return (-ev["value"],)

    if valid is not None and select != "last":
        ev0 = _evaluate(policy, valid, eval_cons)
        best_key = key_of(ev0)
        history.append({"epoch": 0, **ev0, "loss": float("nan"), "train_violation": float("nan"), "u_mean": 0.0,
                        "seconds": 0.0, "cpu_seconds": 0.0, **(callback(0, policy) if callback else {})})

    for epoch in range(1, epochs + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        # one shuffle per epoch, gathered once; mini-batches are then contiguous slices
        shuffled = Batch.take(train, torch.randperm(n, generator=g), p0a)
        shuffled2 = Batch.take(train, torch.randperm(n, generator=g), p0a) if isinstance(method, MetaGradient) else None
        loss_sum, loss_n, viol_sum = 0.0, 0, 0
        for start in range(0, n, batch_size):
            b = shuffled.rows(start, start + batch_size)
            if isinstance(method, MetaGradient):
                b2 = shuffled2.rows(start, start + batch_size)
                gu, gv, finish, info = _meta_grads(policy, b, b2, cons, u, v, method, prior)
                opt_uv.zero_grad(set_to_none=False)
                u.grad, v.grad = gu, gv
                opt_uv.step()
                with torch.no_grad():
                    u.clamp_(max=method.u_max)
                    v.clamp_(max=method.u_max)
                g_final = finish(u.detach(), v.detach())
                for name, p in policy.named_parameters():
                    p.grad = g_final[name]
                opt.step()
                loss, violating = info["loss"], info["violating"]
            else:
                opt.zero_grad(set_to_none=True)
                probs = mask_probs(policy(b.x), b.mask)
                ips_i, hmin, hmax = _terms(probs, b, cons)
                if isinstance(method, IPS):
                    loss_t = ips_i.mean()
                elif isinstance(method, Quadratic):
                    loss_t = (ips_i + float(method.weight) * (hmin * hmin + hmax * hmax)).mean()
                else:  # Minimax, Algorithm 1
                    loss_t = _penalised(ips_i, hmin, hmax, b.k, u, v)
                    if steps % max(1, round(tau)) == 0:
                        bsz = b.x.shape[0]
                        h_min = torch.zeros(m, dtype=torch.float64).index_add_(0, b.k, hmin.detach().double()) / bsz
                        h_max = torch.zeros(m, dtype=torch.float64).index_add_(0, b.k, hmax.detach().double()) / bsz
                        # gradient ascent u <- u + eta dL/du, dL/du = e^u h, clipped (module docstring)
                        u = torch.clamp(u + eta * torch.exp(u) * h_min, max=method.u_max)
                        v = torch.clamp(v + eta * torch.exp(v) * h_max, max=method.u_max)
                        eta *= method.gamma
                        tau *= method.xi
                loss_t.backward()
                opt.step()
                loss = float(loss_t.detach())
                violating = 0 if cons is None else int(((hmin > 0) | (hmax > 0)).sum())
            steps += 1
            viol_sum += violating
            if not math.isnan(loss):
                loss_sum += loss
                loss_n += 1
            if steps <= record_weights and method.constrained:
                trace_u.append((quad if isinstance(method, Quadratic) else u).detach().clone())
                trace_v.append((quad if isinstance(method, Quadratic) else v).detach().clone())
        epoch_seconds, epoch_cpu = time.perf_counter() - t0, time.process_time() - c0
        train_seconds += epoch_seconds
        row = {"epoch": epoch, "loss": loss_sum / loss_n if loss_n else float("nan"),
               "train_violation": viol_sum / n if cons is not None else float("nan"),
               "u_mean": float(u.detach().mean()), "seconds": epoch_seconds, "cpu_seconds": epoch_cpu}
        if not all(bool(torch.isfinite(p).all()) for p in policy.parameters()):
            raise FloatingPointError(f"training diverged at epoch {epoch}: the policy has NaN/inf parameters "
                                     f"(method {method.to_dict()}); lower lr")
        if valid is not None:
            ev = _evaluate(policy, valid, eval_cons)
            row.update(ev)
            if select != "last":
                key = key_of(ev)
                if key < best_key:
                    best_key, best_state, best_epoch, stale = key, copy.deepcopy(policy.state_dict()), epoch, 0
                else:
                    stale += 1
        if callback is not None:
            row.update(callback(epoch, policy))
        history.append(row)
        if verbose:
            if epoch == 0 or not history[:-1]:
                from .._console import console_logging

                console_logging("train", only_if_unconfigured=True)
            _log.info("[%s] epoch %s: %s", method.name, epoch,
                      ", ".join(f"{k}={v:.4g}" for k, v in row.items() if isinstance(v, float)))
        if patience is not None and stale >= int(patience):
            break
    if select == "last":
        best_epoch = len([h for h in history if h["epoch"] > 0])
    else:
        policy.load_state_dict(best_state)
    log_weights = {"u": torch.stack(trace_u) if trace_u else torch.zeros(0, m, dtype=torch.float64),
                   "v": torch.stack(trace_v) if trace_v else torch.zeros(0, m, dtype=torch.float64)}
    samples = n * sum(1 for h in history if h["epoch"] > 0)
    return TrainResult(policy=policy, method=method.to_dict(), history=history, best_epoch=best_epoch,
                       log_weights=log_weights, u=u.detach().clone(), v=v.detach().clone(), steps=steps,
                       seconds=train_seconds, samples_per_second=samples / train_seconds if train_seconds > 0 else float("nan"))


def _meta_grads(policy, b1, b2, cons, u, v, method: MetaGradient, prior):
    uu, vv = u.detach(), v.detach()
    gu, gv, finish, info = _meta_core(policy, b1, b2, cons, uu, vv, method.eta, method.lam, prior, method.engine)
    if method.reference:
        with torch.enable_grad():
            gu, gv = meta_gradient_reference(policy, b1, b2, cons, uu, vv, eta=method.eta, lam=method.lam,
                                             prior=prior)
    return gu.detach(), gv.detach(), finish, info
