"""Conservative Thompson sampling: explore by posterior draws while a lower bound of the
cumulative reward stays at least ``(1 - alpha)`` times the baseline's.

Kazerouni, Ghavamzadeh, Abbasi-Yadkori & Van Roy (2017), "Conservative contextual linear
bandits", constraint (3): at every step ``t``

    sum_{i <= t} r(x_i, a_i)  >=  (1 - alpha) sum_{i <= t} r(x_i, b_i),

the policy's cumulative expected reward at least ``(1 - alpha)`` times the baseline policy's.
Their Algorithm 1 (CLUCB, ``bayes_safe.policies.CLUCB``) proposes the *optimistic* action and
plays it only if the constraint holds for the worst parameter of a frequentist confidence set,
else the baseline; CLUCB2 (their s.4.2) does the same when the baseline's rewards are unknown.
``ConservativeTS`` follows CLUCB2's check with two changes:

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

import torch

from .._validation import check_in_range
from ..random import DrawBatch, Generator
from .base import Policy, check_model, check_select_inputs
from .thompson import ThompsonSampling

__all__ = ["ConservativeTS"]


def _normal_quantile(p: float) -> float:
    return math.sqrt(2.0) * torch.special.erfinv(torch.tensor(2.0 * p - 1.0, dtype=torch.float64)).item()


class ConservativeTS(Policy):
    """Thompson sampling under Kazerouni et al.'s (2017) cumulative constraint (3), checked on the
    posterior (module docstring).

    Args:
        model: a conjugate ``BayesianLinear`` (batch ``[R]`` or none) or a ``PerArmLinear``.
        alpha: the budget: at least ``(1 - alpha)`` of the baseline's cumulative reward, in
            ``[0, 1)``.
        confidence: the posterior probability with which a played proposal keeps the budget, in
            ``(0.5, 1)`` (default 0.95: ``z = 1.645``).

    Attributes:
        budget: ``c`` of the module docstring, the shape of the model's posterior mean
            (``[R, d]``, or ``[R, K, d]`` per arm; without the ``R`` of an unbatched model).
        explored, fallbacks: per replication, the steps a proposal other than the baseline was
            played, and the steps the baseline was played in place of one.
    """

    def __init__(self, model, alpha: float = 0.1, confidence: float = 0.95):
        check_model(model, "model", "sample_at")
        self.alpha = float(check_in_range(alpha, "alpha", 0.0, 1.0))
        if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0.5 < confidence < 1:
            raise ValueError(f"confidence: expected a probability in (0.5, 1), got {confidence!r}")
        self.confidence = float(confidence)
        self._z = _normal_quantile(self.confidence)
        self.model = model
        self._core = getattr(model, "arms", model)  # PerArmLinear: its BayesianLinear over [*batch, K]
        self._per_arm = self._core is not model
        if not getattr(self._core, "conjugate", False):
            name = getattr(self._core, "engine_name", type(self._core).__name__)
            raise ValueError(f"model: ConservativeTS checks its budget on a Gaussian posterior (posterior_mean and "
                             f"posterior_covariance): a conjugate BayesianLinear or a PerArmLinear; this model's engine "
                             f"is {name!r}")
        self._ts = ThompsonSampling(model)
        self._batch = tuple(model.batch_shape)
        if len(self._batch) > 1:
            raise ValueError(f"model: expected a batch shape [R] or none, got {list(self._batch)}")
        shape = tuple(self._core.posterior_mean.shape)
        self.budget = torch.zeros(shape, dtype=torch.float64)
        R = self._batch[0] if self._batch else 1
        self.explored = torch.zeros(R, dtype=torch.long)
        self.fallbacks = torch.zeros(R, dtype=torch.long)

    def models(self) -> dict[str, object]:
        return {"reward": self.model}

    def _settings(self) -> dict[str, object]:
        return {"alpha": self.alpha, "confidence": self.confidence}

    def _moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The posterior mean ``[R, (K,) d]`` and covariance ``[R, (K,) d, d]`` (a leading 1 when unbatched)."""
        mean, cov = self._core.posterior_mean, self._core.posterior_covariance
        if not self._batch:
            mean, cov = mean[None], cov[None]
        return mean, cov

    def _delta(self, features: torch.Tensor, actions: torch.Tensor, baseline: torch.Tensor) -> torch.Tensor:
        """What playing ``actions [*S, R]`` adds to ``c``: ``x_a - (1 - alpha) x_b`` (``alpha x_b``
        where ``a = b``), ``[*S, R, (K,) d]``."""
        R, K, d = features.shape
        rows = torch.arange(R)
        xa = features[rows, actions]                        # [*S, R, d]
        xb = features[rows, baseline]                       # [R, d]
        if not self._per_arm:
            return xa - (1 - self.alpha) * xb
        lead = actions.shape
        out = torch.zeros(*lead, K, d, dtype=torch.float64)
        out.scatter_add_(-2, actions[..., None, None].expand(*lead, 1, d), xa[..., None, :])
        out.scatter_add_(-2, baseline.expand(lead)[..., None, None].expand(*lead, 1, d),
                         -(1 - self.alpha) * xb.expand(*lead, d)[..., None, :])
        return out

    def _lower(self, c: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor) -> torch.Tensor:
        """``mean - z sd`` of ``<c, theta>`` under ``N(mean, cov)``, ``c [*S, R, (K,) d]`` -> ``[*S, R]``."""
        m = (c * mean).sum(-1)
        v = (c[..., None, :] @ cov @ c[..., :, None])[..., 0, 0]
        if self._per_arm:
            m, v = m.sum(-1), v.sum(-1)
        return m - self._z * v.clamp_min(0).sqrt()

    def select(self, features, baseline=None, generator: Generator = None, valid=None) -> torch.Tensor:
        features, baseline, valid = check_select_inputs(features, baseline, valid, models=(self.model,),
                                                        require_baseline="ConservativeTS")
        proposed = self._ts.select(features, baseline, generator=generator, valid=valid)   # [R] or [S, R]
        mean, cov = self._moments()
        delta = self._delta(features, proposed, baseline)
        safe = (proposed == baseline) | (self._lower(self._budget() + delta, mean, cov) >= 0)
        actions = torch.where(safe, proposed, baseline)
        query = isinstance(generator, DrawBatch) and not generator.played
        if not query:
            played = actions if actions.dim() == 1 else actions[0]
            ok = safe if safe.dim() == 1 else safe[0]
            step = self._delta(features, played, baseline)   # alpha x_b where the baseline is played
            budget = self._budget() + step
            self.budget = budget if self._batch else budget[0]
            moved = played != baseline
            self.explored += moved.long()
            self.fallbacks += (~ok).long()
        return actions

    def _budget(self) -> torch.Tensor:
        return self.budget if self._batch else self.budget[None]

    def update(self, features_chosen, reward, constraints=None, actions=None) -> None:
        """Learn from every play, the baseline's included (its reward is learned, not assumed)."""
        if self._per_arm:
            self.model.update(features_chosen, reward, actions=actions)
        else:
            self.model.update(features_chosen, reward)
