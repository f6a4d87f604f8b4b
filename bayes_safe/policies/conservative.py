"""Conservative Thompson sampling: explore by posterior draws while a lower bound of the
cumulative reward stays at least ``(1 - alpha)`` times the baseline's.

Kazerouni, Ghavamzadeh, Abbasi-Yadkori & Van Roy (2017), "Conservative contextual linear
bandits", constraint (3): at every step ``t``

    sum_{i <= t} r(x_i, a_i)  >=  (1 - alpha) sum_{i <= t} r(x_i, b_i),

the policy's cumulative expected reward at least ``(1 - alpha)`` times the baseline policy's.
Their Algorithm 1 (CLUCB, ``bayes_safe.policies.CLUCB``) proposes the *optimistic* action and
plays it only if the constraint holds for the worst parameter of a frequentist confidence set,
else the baseline (the condition displayed in their s.4, before s.4.1, with known baseline
rewards); CLUCB2, their variant for unknown baseline rewards (in the paper's longer version, not
in the conference text), does the same with the baseline's rewards estimated too.
``ConservativeTS`` follows that check with two changes:

1. **the proposal is a Thompson draw** (``ThompsonSampling``), not the optimistic action, so it
   explores as much as the posterior says and no more (Thompson sampling in place of the
   optimistic choice, as the safe bake-off of issue 32 asks);
2. **the check is Bayesian.** Every term of (3) is linear in the weights, so with the played
   actions' features the constraint reads ``Q_t = <c_t, theta> >= 0``, with

       c_t = sum_{i in S_t} (x_{a_i} - (1 - alpha) x_{b_i}) + alpha sum_{i not in S_t} x_{b_i}

   (``S_t`` the steps the proposal was played, the others the baseline's; per-arm models keep one
   block of ``c`` per arm). Under the Gaussian posterior ``theta ~ N(m, Sigma)``, ``Q`` is
   Gaussian with mean ``<c, m>`` and variance ``c^T Sigma c``, and the proposal ``a'`` is played
   when ``P(Q_{t-1} + <x_{a'} - (1 - alpha) x_b, theta> >= 0) >= confidence``, i.e. the lower
   ``1 - confidence`` quantile ``mean - z sd`` of ``Q`` with it is at least 0 (``z =
   Phi^-1(confidence)``); otherwise the baseline is played and ``c`` grows by ``alpha x_b``.
   The baseline's rewards are learned, not assumed known (CLUCB2's setting): the model updates
   on every play, the baseline's included, so the budget the baseline earns becomes certain as
   fast as its reward is learned, and exploration starts once it covers a draw's risk.

**Realised budget** (``budget="realised"``). Constraint (3) is on expected rewards; a user (and
issue 32's bake-off) often judges it on the *realised* ones, ``sum r_i >= (1 - alpha) sum r_{b_i}``
with ``r`` the observed 0/1 rewards. Then the known part of the sum is known exactly once the
rewards are in: ``K_t = sum_i r_i - (1 - alpha) sum_{i not in S_t} r_i`` (the learner's own rewards,
and the baseline's where the baseline was played). What is unknown is the baseline's reward at
the steps the learner deviated, and the next step's rewards; they enter as the linear term
``c_t = -(1 - alpha) sum_{i in S_t} x_{b_i}`` (the mean reward the baseline would have earned,
the term of Kazerouni et al.'s check in s.4, displayed before s.4.1, whose baseline rewards are
unknown here) with variance ``c^T Sigma c`` plus the reward noise ``sigma^2 ((1 - alpha)^2 |S_t|
+ 1 + (1 - alpha)^2)``. A proposal is played when ``K_t + <c', m> - z sqrt(c'^T Sigma c' +
noise) >= 0`` for ``c'`` with the proposal's step. Decisions whose reward has not arrived count
as in the expected mode (by the model); rewards are matched to decisions first in, first out, so
``update`` must follow the ``select`` calls in their order (the one-stream ``select`` / ``update``
loop, or a batch ``[R]`` per step).

``variance_scale`` multiplies the posterior covariance and the noise variance in the check: a
model built with a temperature ``T`` (``calibrated_per_arm``) samples from a posterior ``T`` times
narrower or wider than the calibrated one; ``variance_scale = 1 / T`` checks the budget on the
calibrated posterior while Thompson sampling explores at the temperature.

**Win check** (``min_win_probability = q``, issue 44; default None: off). The budget check asks
whether a deviation can be *afforded*; it does not ask whether it is *right*, so a policy whose
margin is large spends it on Thompson draws that lose more often than the baseline. With ``q``
set, a proposal ``a`` other than the baseline ``b`` is also required to win under the calibrated
posterior (the covariance times ``variance_scale``, not the tempered one the draw came from):
``P(r_a(x) > r_b(x)) >= q``, i.e. ``<x_a - x_b, m> >= Phi^-1(q) sqrt((x_a - x_b)^T Sigma (x_a -
x_b))`` (per-arm models: the two arms' variances add). The posterior learns from every play,
deviations included, so where deviations have lost the two means move apart and the check turns
those proposals down: the check learns where deviations lose. It only ever replaces a proposal by
the baseline, which adds ``alpha x_b`` to ``c``, so the budget's guarantee is untouched.
Turned-down proposals are counted in ``vetoes``.

**Exclusive rewards** (``exclusive_rewards=True``, realised budget only; issue 44). The deviations'
term above bounds the baseline's unknown rewards by the model and by the baseline's success rate
on its own plays; both assume the deviations are not chosen where the baseline is unusually right,
and a learner whose proposals are wrong where the baseline is right breaks that (the quick bake-off:
a two-action stream whose 25 deviations were right 8 times, the baseline right at all 17 others,
27.6 % of the steps in violation). When rewards are in ``[0, 1]`` and at most one action earns at
each step (a 0/1 reward for the right class, one action per class), the baseline's reward at a
deviation is at most ``1 - r_a``: 0 where the deviation earned 1, at most 1 where it earned 0 (exactly
1 with two actions). The deviations' term is then the known ``(1 - alpha) sum_{i in S_t} (1 - r_i)``,
whatever the deviations' selection, and the check reads ``K_t - (1 - alpha) sum_{i in S_t} (1 - r_i)
+ (the pending and next steps' terms, by the posterior) >= 0``: the budget of the settled steps holds
for certain, and only the next step's (and pending decisions') rewards are bounded by the posterior.
``deviation_rewards`` sums the rewards earned at deviations.

A proposal equal to the baseline action is always played (it is the baseline). ``Q`` only
grows when the baseline is played or when a proposal is judged safe, so the policy keeps a
margin it has earned and spends it on exploration: it falls back to the baseline only when a
proposal's risk exceeds the margin.

Models: a conjugate ``BayesianLinear`` (Gaussian prior with known noise, or
Normal-Inverse-Gamma: ``Sigma`` is then the marginal covariance of the weights) over candidate
features, or a ``PerArmLinear``; batched ``[R]`` or unbatched (one stream). Other engines are
refused by name (the check needs ``posterior_mean`` and ``posterior_covariance``).

**Decisions commit.** ``select`` updates ``c`` with the decision it returns (the budget is a
record of decisions, whether or not their feedback has arrived); under a ``DrawBatch`` of
``Policy.action_probabilities`` (a query) nothing is committed, and under the ``Decider``'s
``DrawBatch(played=True)`` the first, played, draw's decision is.

**One stream, fast** (issue 42). Over an unbatched known-noise ``PerArmLinear`` (no forgetting),
``select`` with float64 features ``[K, d]``, an int baseline, no mask and a ``torch.Generator`` (or
None), and ``update`` with a float reward, run in numpy on the moments the model keeps
(``PerArmLinear``'s one-stream path): the proposal is ``sample_at``'s draw (the same random
numbers), the check's moments come from that draw's per-arm means and variances when no decision is
pending (else from the kept covariances), and the budget's terms touch two blocks. The decisions,
``budget``, ``known``, ``counterfactual`` and the counts are the general path's (the check's sums
may differ in the last bit: a proposal within rounding of the bound could go the other way);
``fast_path = False`` forces the general path. ``benchmarks/conservative_speed.py`` measures it.

Example (one stream):
    >>> import pyro.distributions as dist, torch
    >>> from bayes_safe.models import PerArmLinear
    >>> prior = dist.Normal(torch.zeros(3, dtype=torch.float64), 1.0).to_event(1)
    >>> policy = ConservativeTS(PerArmLinear(prior, 4, noise_std=0.5), alpha=0.1)
    >>> x = torch.randn(3, dtype=torch.float64).expand(4, 3)     # one context for every arm
    >>> int(policy.select(x, baseline=2))                          # no budget yet: the baseline
    2
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import _validation
from .._validation import check_in_range
from ..random import DrawBatch, Generator
from .base import Policy, check_model, check_select_inputs
from .thompson import ThompsonSampling, rows_shrink

__all__ = ["ConservativeTS"]


def _normal_quantile(p: float) -> float:
    return math.sqrt(2.0) * torch.special.erfinv(torch.tensor(2.0 * p - 1.0, dtype=torch.float64)).item()


def _moment_one(c: np.ndarray, cov: np.ndarray, mean: np.ndarray) -> tuple[float, float]:
    """Mean and variance of ``<c, theta>`` under one stream's per-arm posterior, ``c``, ``mean [K, d]``,
    ``cov [K, d, d]`` (two dot products and one batched product: picking the few blocks a step touches
    costs more in indexing than the zero blocks' arithmetic)."""
    return float(np.vdot(c, mean)), float(np.vdot(c, cov @ c[:, :, None]))


class ConservativeTS(Policy):
    """Thompson sampling under Kazerouni et al.'s (2017) cumulative constraint (3), checked on the
    posterior (module docstring).

    Args:
        model: a conjugate ``BayesianLinear`` (batch ``[R]`` or none) or a ``PerArmLinear``.
        alpha: the budget: at least ``(1 - alpha)`` of the baseline's cumulative reward, in
            ``[0, 1)``.
        confidence: the posterior probability with which a played proposal keeps the budget, in
            ``(0.5, 1)`` (default 0.95: ``z = 1.645``).
        budget: ``"expected"`` (constraint (3) on expected rewards, the default) or ``"realised"``
            (on the observed rewards; module docstring).
        variance_scale: multiplies the covariance (and noise variance) the check uses (> 0; default 1).
        min_win_probability: None (default), or ``q`` in ``(0, 1)``: the win check (module docstring).
        exclusive_rewards: False (default); True: rewards in ``[0, 1]`` of which at most one action earns
            at each step (a class label), so the baseline's reward at a deviation is at most ``1 - r``
            (module docstring; ``budget="realised"`` only).
        exploration: the proposals' draw rule, ``ThompsonSampling``'s (None, default: the model's own,
            ``"rows"`` for ``calibrated_per_arm``'s; ``"posterior"``; ``"rows"``). It changes the proposals
            only: the check, and so the budget's guarantee, is the same.

    Attributes:
        budget: ``c`` of the module docstring, the shape of the model's posterior mean
            (``[R, d]``, or ``[R, K, d]`` per arm; without the ``R`` of an unbatched model).
        explored, fallbacks: per replication, the steps a proposal other than the baseline was
            played, and the steps the baseline was played in place of one (the budget's own rule,
            inside its guarantee: not a fallback of ``Policy.fallback_constraints``, which stays
            None, so ``simulate`` records no ``Trace.fallback`` for it).
        fast_path: True (default): one stream over an unbatched known-noise ``PerArmLinear`` decides
            and learns in numpy on the model's kept moments when the inputs are the common ones
            (float64 ``[K, d]`` features, an int baseline, no mask, a ``torch.Generator`` or None);
            the same decisions and bookkeeping as the general path, which ``False`` forces.
    """

    def __init__(self, model, alpha: float = 0.1, confidence: float = 0.95, *, budget: str = "expected",
                 variance_scale: float = 1.0, min_win_probability: float | None = None,
                 exclusive_rewards: bool = False, exploration: str | None = None):
        check_model(model, "model", "sample_at")
        self.alpha = float(check_in_range(alpha, "alpha", 0.0, 1.0))
        if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0.5 < confidence < 1:
            raise ValueError(f"confidence: expected a probability in (0.5, 1), got {confidence!r}")
        self.confidence = float(confidence)
        if budget not in ("expected", "realised"):
            raise ValueError(f"budget: expected 'expected' or 'realised', got {budget!r}")
        self.budget_kind = budget
        if not isinstance(exclusive_rewards, bool):
            raise TypeError(f"exclusive_rewards: expected True or False, got {exclusive_rewards!r}")
        if exclusive_rewards and budget != "realised":
            raise ValueError("exclusive_rewards: the bound is on realised rewards; pass budget='realised'")
        self.exclusive_rewards = exclusive_rewards
        if isinstance(variance_scale, bool) or not isinstance(variance_scale, (int, float)) or not (
                0 < variance_scale < math.inf):
            raise ValueError(f"variance_scale: expected a positive number, got {variance_scale!r}")
        self.variance_scale = float(variance_scale)
        self._z = _normal_quantile(self.confidence)
        if min_win_probability is not None and (isinstance(min_win_probability, bool) or not isinstance(
                min_win_probability, (int, float)) or not 0 < min_win_probability < 1):
            raise ValueError(f"min_win_probability: expected None or a probability in (0, 1), got {min_win_probability!r}")
        self.min_win_probability = None if min_win_probability is None else float(min_win_probability)
        self._win_z = None if min_win_probability is None else _normal_quantile(self.min_win_probability)
        self.model = model
        self._core = getattr(model, "arms", model)  # PerArmLinear: its BayesianLinear over [*batch, K]
        self._per_arm = self._core is not model
        if not getattr(self._core, "conjugate", False):
            name = getattr(self._core, "engine_name", type(self._core).__name__)
            raise ValueError(f"model: ConservativeTS checks its budget on a Gaussian posterior (posterior_mean and "
                             f"posterior_covariance): a conjugate BayesianLinear or a PerArmLinear; this model's engine "
                             f"is {name!r}")
        self._ts = ThompsonSampling(model, exploration)
        self.exploration = self._ts.exploration
        self._batch = tuple(model.batch_shape)
        if len(self._batch) > 1:
            raise ValueError(f"model: expected a batch shape [R] or none, got {list(self._batch)}")
        shape = tuple(self._core.posterior_mean.shape)
        self.budget = torch.zeros(shape, dtype=torch.float64)
        R = self._batch[0] if self._batch else 1
        self.explored = torch.zeros(R, dtype=torch.long)
        self.fallbacks = torch.zeros(R, dtype=torch.long)
        self.vetoes = torch.zeros(R, dtype=torch.long)  # proposals the win check turned down
        # realised mode: the known part K_t [R], the deviations' count [R] and the decisions whose reward is pending
        self.known = torch.zeros(R, dtype=torch.float64)
        self.deviations = torch.zeros(R, dtype=torch.long)
        self.baseline_plays = torch.zeros(R, dtype=torch.long)
        self.baseline_successes = torch.zeros(R, dtype=torch.float64)
        self.deviation_rewards = torch.zeros(R, dtype=torch.float64)  # the rewards earned at the deviations
        self.counterfactual = torch.zeros(shape, dtype=torch.float64)  # c_dev: -(1 - alpha) x_b at the deviations
        self._pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        noise = getattr(self._core, "noise_std", None)
        self._noise_var = 0.25 if noise is None else float(noise) ** 2  # NIG: the largest 0/1 variance
        # the one-stream fast path (an unbatched PerArmLinear with its kept moments; ``_select_one``):
        # ``fast_path = False`` on an instance runs the general path only (the same decisions)
        self._fast_ok = self._per_arm and not self._batch and hasattr(model, "_marginal_fast")
        self.fast_path = True
        self._views: dict[str, tuple[torch.Tensor, np.ndarray]] = {}  # numpy views of the state tensors

    def models(self) -> dict[str, object]:
        return {"reward": self.model}

    def _settings(self) -> dict[str, object]:
        out = {"alpha": self.alpha, "confidence": self.confidence, "budget": self.budget_kind,
               "variance_scale": self.variance_scale}
        if self.min_win_probability is not None:
            out["min_win_probability"] = self.min_win_probability
        if self.exclusive_rewards:
            out["exclusive_rewards"] = True
        if self._ts.exploration != "posterior":
            out["exploration"] = self._ts.exploration
        return out

    def _moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The posterior mean ``[R, (K,) d]`` and covariance ``[R, (K,) d, d]`` (a leading 1 when unbatched)."""
        # the model's own moments (a one-stream PerArmLinear keeps them: no factorisation per decision)
        mean, cov = self.model.posterior_mean, self.model.posterior_covariance
        if not self._batch:
            mean, cov = mean[None], cov[None]
        return mean, cov

    def _delta(self, features: torch.Tensor, actions: torch.Tensor, baseline: torch.Tensor,
               keep: float | None = None) -> torch.Tensor:
        """What playing ``actions [*S, R]`` adds to ``c``: ``x_a - (1 - alpha) x_b`` (``alpha x_b``
        where ``a = b``), ``[*S, R, (K,) d]``; ``keep`` in place of ``1 - alpha`` (1: the win check's
        ``x_a - x_b``)."""
        keep = 1 - self.alpha if keep is None else keep
        R, K, d = features.shape
        rows = torch.arange(R)
        xa = features[rows, actions]                        # [*S, R, d]
        xb = features[rows, baseline]                       # [R, d]
        if not self._per_arm:
            return xa - keep * xb
        lead = actions.shape
        out = torch.zeros(*lead, K, d, dtype=torch.float64)
        out.scatter_add_(-2, actions[..., None, None].expand(*lead, 1, d), xa[..., None, :])
        out.scatter_add_(-2, baseline.expand(lead)[..., None, None].expand(*lead, 1, d),
                         -keep * xb.expand(*lead, d)[..., None, :])
        return out

    def _block(self, features: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``x_a`` in the weights' layout: ``[R, d]``, or ``[R, K, d]`` with ``x_a`` in block ``a``."""
        R, K, d = features.shape
        xa = features[torch.arange(R), actions]
        if not self._per_arm:
            return xa
        return torch.zeros(R, K, d, dtype=torch.float64).scatter_(-2, actions[:, None, None].expand(R, 1, d),
                                                                   xa[:, None, :])

    def _moment(self, c: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance of ``<c, theta>`` under ``N(mean, cov)``, ``c [*S, R, (K,) d]`` -> ``[*S, R]``."""
        m = (c * mean).sum(-1)
        v = (c[..., None, :] @ cov @ c[..., :, None])[..., 0, 0]
        if self._per_arm:
            m, v = m.sum(-1), v.sum(-1)
        return m, v

    def _lower(self, c: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor) -> torch.Tensor:
        """``mean - z sd`` of ``<c, theta>`` under ``N(mean, cov)`` (expected budget), or of the
        realised budget (module docstring), ``c [*S, R, (K,) d]`` -> ``[*S, R]``."""
        m, v = self._moment(c, mean, cov)
        if self.budget_kind == "expected":
            return m - self._z * (self.variance_scale * v).clamp_min(0).sqrt()
        b = (1 - self.alpha) ** 2
        noise = self._noise_var * (len(self._pending) * (1 + b) + 1 + b)
        lower = self.known + m - self._z * (self.variance_scale * (v + noise)).clamp_min(0).sqrt()
        return lower - self._counterfactual_cost(mean, cov)

    def _counterfactual_cost(self, mean: torch.Tensor, cov: torch.Tensor) -> torch.Tensor:
        """An upper ``confidence`` bound on ``(1 - alpha)`` times the baseline's rewards at the
        deviations ``[R]``: the larger of the model's (``<-c_dev, theta>`` and the rewards' noise)
        and the baseline's own success rate's (a Beta(1, 1) posterior on its plays, times the deviations);
        with exclusive rewards the known ``(1 - alpha) sum (1 - r)`` over the deviations."""
        if self.exclusive_rewards:
            return (1 - self.alpha) * (self.deviations.to(torch.float64) - self.deviation_rewards)
        m, v = self._moment(self.counterfactual if self._batch else self.counterfactual[None], mean, cov)
        b = (1 - self.alpha) ** 2
        model = -m + self._z * (self.variance_scale * (v + self._noise_var * b * self.deviations)).clamp_min(0).sqrt()
        n = self.baseline_plays.to(torch.float64)
        p = (self.baseline_successes + 1) / (n + 2)
        dev = self.deviations.to(torch.float64)
        rate = (1 - self.alpha) * dev * (p + self._z * (p * (1 - p) / (n + 3)).sqrt())
        return torch.maximum(model, rate)

    def select(self, features, baseline=None, generator: Generator = None, valid=None) -> torch.Tensor:
        if (self._fast_ok and valid is None and (generator is None or type(generator) is torch.Generator)
                and self.fast_path and self.model._marginal_fast()):
            # one stream, a PerArmLinear keeping its moments: the common inputs (float64 [K, d], an int or one
            # long baseline) checked in a few comparisons, anything else by the general check below
            m = self.model
            if type(features) is torch.Tensor and features.dtype is torch.float64 and features.shape == (m.num_arms, m.dim):
                b = baseline if type(baseline) is int else baseline.item() if (
                    type(baseline) is torch.Tensor and baseline.dtype is torch.long and baseline.dim() <= 1
                    and baseline.numel() == 1) else None
                if b is not None and 0 <= b < m.num_arms and (
                        _validation.trusted() or math.isfinite(features.sum().item())):
                    return self._select_one(features, b, generator)
        features, baseline, valid = check_select_inputs(features, baseline, valid, models=(self.model,),
                                                        require_baseline="ConservativeTS")
        proposed = self._ts.select(features, baseline, generator=generator, valid=valid)   # [R] or [S, R]
        mean, cov = self._moments()
        delta = self._delta(features, proposed, baseline)
        affordable = self._lower(self._budget() + delta, mean, cov) >= 0
        vetoed = torch.zeros_like(affordable)
        if self._win_z is not None:  # the win check on the calibrated posterior (module docstring)
            m, v = self._moment(self._delta(features, proposed, baseline, keep=1.0), mean, cov)
            vetoed = affordable & (proposed != baseline) & (
                m < self._win_z * (self.variance_scale * v).clamp_min(0).sqrt())
        safe = (proposed == baseline) | (affordable & ~vetoed)
        actions = torch.where(safe, proposed, baseline)
        query = isinstance(generator, DrawBatch) and not generator.played
        if not query:
            played = actions if actions.dim() == 1 else actions[0]
            ok = (safe | vetoed) if safe.dim() == 1 else (safe | vetoed)[0]
            self.vetoes += (vetoed if vetoed.dim() == 1 else vetoed[0]).long()
            step = self._delta(features, played, baseline)   # alpha x_b where the baseline is played
            budget = self._budget() + step
            self.budget = budget if self._batch else budget[0]
            moved = played != baseline
            self.explored += moved.long()
            self.fallbacks += (~ok).long()
            if self.budget_kind == "realised":
                self._pending.append((step, moved, self._block(features, baseline)))
        return actions

    def _budget(self) -> torch.Tensor:
        return self.budget if self._batch else self.budget[None]

    # ------------------------------------------------------------------ the one-stream fast path
    # An unbatched PerArmLinear keeps each arm's covariance and mean (numpy, ``_marginal_state``): the
    # check reads them in place (no [K, d, d] copy per decision), the budget's terms touch two blocks,
    # and the realised mode's pending decisions are kept as those blocks, not as [1, K, d] tensors.
    # The same arithmetic as the general path, term by term: the budget, the counts and the known part
    # are the same numbers; the check's sums may differ from torch's in the last bit.

    def _view(self, name: str) -> np.ndarray:
        """A numpy view of the tensor attribute ``name`` (cached while the attribute is that tensor)."""
        t = self.__dict__[name]
        kept = self._views.get(name)
        if kept is not None and kept[0] is t:
            return kept[1]
        a = t.numpy()
        self._views[name] = (t, a)
        return a

    def _set(self, name: str, a: np.ndarray) -> None:
        """Set the tensor attribute ``name`` to a new tensor on ``a``'s memory."""
        t = torch.from_numpy(a)
        setattr(self, name, t)
        self._views[name] = (t, a)

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_views", None)  # views of the tensors' memory: a copy (deepcopy, pickle) makes its own
        return state

    def __setstate__(self, state) -> None:
        self.__dict__.update(state)
        self._views = {}
        self.__dict__.setdefault("exclusive_rewards", False)  # saved before issue 44's exclusive rewards
        if "deviation_rewards" not in self.__dict__:
            self.deviation_rewards = torch.zeros_like(self.known)

    def _select_one(self, features: torch.Tensor, b: int, generator) -> torch.Tensor:
        """``select`` for one stream: ``features [K, d]`` (checked), the baseline ``b``; ``[1]`` as the general path."""
        model = self.model
        # ThompsonSampling's draw (sample_at's numbers) with each arm's mean and variance at its row
        scores, mu, var = model._draw_one(features, generator)
        shrink_var = self._ts._noise_var
        if shrink_var is not None:  # exploration="rows": ThompsonSampling's shrunk draw (the same numbers)
            scores = mu + rows_shrink(var, shrink_var) * (scores - mu)
        p = int(scores.argmax())                                     # the first maximal index, as torch's argmax
        F = features.numpy()
        keep = -(1 - self.alpha)
        xb_term = keep * F[b]                                        # -(1 - alpha) x_b
        budget = self._view("budget")
        ok = True
        if p != b:
            cov, mean = model._marginal_state()
            c = budget.copy()                                        # the budget with the proposal's step
            c[p] += F[p]
            c[b] += xb_term
            if budget.any():
                m, v = _moment_one(c, cov, mean)
            else:  # the step alone (no decision pending): its two blocks' moments are the draw's
                m, v = float(mu[p] + keep * mu[b]), float(var[p] + keep * keep * var[b])
            mean_rows = (float(mu[p]), float(mu[b]), float(var[p]), float(var[b]))
            ok = self._lower_one(m, v, cov, mean) >= 0
            if ok and self._win_z is not None:  # the win check: the two arms' moments at their rows (the draw's)
                mp, mb, vp, vb = mean_rows
                if mp - mb < self._win_z * math.sqrt(max(self.variance_scale * (vp + vb), 0.0)):
                    self._view("vetoes")[0] += 1
                    p = b  # played as the baseline; not a fallback of the budget
        if ok and p != b:
            played, new, steps = p, c, ((p, F[p].copy()), (b, xb_term))
            self._view("explored")[0] += 1
        else:
            played, new = b, budget.copy()
            sb = F[b] + xb_term                                      # alpha x_b, as x_b - (1 - alpha) x_b
            new[b] += sb
            steps = ((b, sb),)
            if not ok:
                self._view("fallbacks")[0] += 1
        self._set("budget", new)
        if self.budget_kind == "realised":
            self._pending.append((steps, played != b, b, F[b].copy()))  # four entries: a fast path's step
        return torch.from_numpy(np.array([played], dtype=np.int64))

    def _lower_one(self, m: float, v: float, cov: np.ndarray, mean: np.ndarray) -> float:
        """``_lower`` of one stream, given the mean ``m`` and variance ``v`` of ``<c, theta>`` (the kept
        ``cov [K, d, d]``, ``mean [K, d]`` for the deviations' term)."""
        if self.budget_kind == "expected":
            return m - self._z * math.sqrt(max(self.variance_scale * v, 0.0))
        b = (1 - self.alpha) ** 2
        noise = self._noise_var * (len(self._pending) * (1 + b) + 1 + b)
        lower = float(self._view("known")[0]) + m - self._z * math.sqrt(max(self.variance_scale * (v + noise), 0.0))
        dev = int(self._view("deviations")[0])
        cf = self._view("counterfactual")
        if dev == 0 and not cf.any():
            return lower  # no deviation yet: nothing to pay for (the general path subtracts max(0, 0))
        if self.exclusive_rewards:
            return lower - (1 - self.alpha) * (dev - float(self._view("deviation_rewards")[0]))
        m, v = _moment_one(cf, cov, mean)
        model_cost = -m + self._z * math.sqrt(max(self.variance_scale * (v + self._noise_var * b * dev), 0.0))
        n = float(self._view("baseline_plays")[0])
        p = (float(self._view("baseline_successes")[0]) + 1) / (n + 2)
        rate = (1 - self.alpha) * dev * (p + self._z * math.sqrt(p * (1 - p) / (n + 3)))
        return lower - max(model_cost, rate)

    def _settle_one(self, entry: tuple, r: float) -> None:
        """The realised mode's bookkeeping of ``update`` for a fast path's pending step (the general path's numbers)."""
        steps, moved, b, xb = entry
        if moved:
            self._view("known")[0] += r
            self._view("deviations")[0] += 1
            self._view("deviation_rewards")[0] += r
            cf = self._view("counterfactual").copy()
            cf[b] += -(1 - self.alpha) * xb
            self._set("counterfactual", cf)
        else:
            self._view("known")[0] += self.alpha * r
            self._view("baseline_plays")[0] += 1
            self._view("baseline_successes")[0] += r
        budget = self._view("budget").copy()
        for k, v in steps:
            budget[k] -= v
        self._set("budget", budget)

    def _pending_tensors(self, entry: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A fast path's pending step as the general path keeps it: ``(step, moved, x_b's block)``, ``[1, K, d]``."""
        if len(entry) == 3:
            return entry
        steps, moved, b, xb = entry
        step = torch.zeros((1, *self.budget.shape), dtype=torch.float64)
        for k, v in steps:
            step[0, k] += torch.from_numpy(v)
        base_x = torch.zeros_like(step)
        base_x[0, b] = torch.from_numpy(xb)
        return step, torch.tensor([moved]), base_x

    def update(self, features_chosen, reward, constraints=None, actions=None) -> None:
        """Learn from every play, the baseline's included (its reward is learned, not assumed).
        Realised budget: the reward settles the oldest pending decision's term (module docstring)."""
        if self.budget_kind == "realised" and self._pending:
            if len(self._pending[0]) == 4:  # a fast path's step settled by a float reward: the same numbers in numpy
                r = reward if type(reward) is float else reward.item() if (
                    type(reward) is torch.Tensor and reward.dtype is torch.float64 and reward.numel() == 1) else None
                if r is not None:
                    self._settle_one(self._pending.pop(0), r)
                    self.model.update(features_chosen, reward, actions=actions)
                    return
            step, moved, base_x = self._pending_tensors(self._pending.pop(0))
            r = torch.as_tensor(reward, dtype=torch.float64).reshape(-1)
            if r.numel() != moved.numel():
                raise ValueError(f"reward: expected {moved.numel()} rewards (one per replication), got {r.numel()}")
            # out: the step's expected term; in: the reward, less (1 - alpha) of it where the baseline was
            # played, and, where the learner deviated, -(1 - alpha) x_b (the baseline's unknown reward)
            self.known += torch.where(moved, r, self.alpha * r)
            self.deviations += moved.long()
            self.baseline_plays += (~moved).long()
            self.baseline_successes += torch.where(moved, torch.zeros_like(r), r)
            self.deviation_rewards += torch.where(moved, r, torch.zeros_like(r))
            shape = (-1,) + (1,) * (step.dim() - 1)
            cf = torch.where(moved.reshape(shape), -(1 - self.alpha) * base_x, torch.zeros_like(step))
            self.counterfactual = self.counterfactual + (cf if self._batch else cf[0])
            self.budget = self.budget - (step if self._batch else step[0])
        if self._per_arm:
            self.model.update(features_chosen, reward, actions=actions)
        else:
            self.model.update(features_chosen, reward)
