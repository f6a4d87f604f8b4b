"""A seeded synthetic skill-routing problem (the setting of Kachuee & Lee 2022, s.4.1).

The paper's data (40M requests of a voice assistant, 27 imbalanced domains, a production
routing policy, a user-satisfaction reward) is private; this generator makes logs of the
same shape so that every method and estimator can be run and checked against the truth:

* **Domains.** 27 named domains (``DOMAIN_NAMES``, ordered by size); domain ``k`` (rank
  ``k + 1``) receives a share proportional to ``(k + 1) ** -size_exponent`` of the requests
  (Zipf-like, 1.0 by default: the largest domain is 27 times the smallest).
* **Context.** ``x = [onehot(k) (27), z (n_features)]`` with ``z ~ N(0, I)``; the domain is a
  feature of ``x``, as in the paper (s.3.1).
* **Actions.** ``n_actions`` candidate skills.
* **Reward model (with domain effects).** Bernoulli user satisfaction with mean
  ``mu(x, a) = sigmoid(b_a + B[k, a] + z^T W[:, a])``; ``b ~ N(1, 0.5^2)``,
  ``B ~ N(0, domain_effect^2)`` (every domain prefers different skills),
  ``W ~ N(0, feature_effect^2 / n_features)``.
* **Production policy.** A softmax over a noisy, shrunk copy of the true logits,
  ``Pi_0(.|x) = (1 - epsilon) softmax(beta (b' + B'[k] + z^T W')) + epsilon / A`` with
  ``B' = B + N(0, 0.5^2)``, ``W' = 0.5 W + N(0, 0.3^2 / n_features)``: it knows the domains
  roughly and the features poorly, so there is reward to gain by leaving it, and the
  epsilon floor keeps importance weights below ``A / epsilon``.

The environment (all parameters above) is fixed by ``env_seed``; the logged rounds
(domains, features, actions, rewards) by the ``seed`` of ``SkillRouting.sample``, so the
paper's "four seeds for data sampling" draw four logs of one environment.

The three constraint benchmarks of s.4.2 (``global``, ``critical``, ``explore``) are JSON
files next to this module (``benchmarks/*.json``), loaded by
``bayes_safe.offline.constraints.load_benchmark``; copy and edit one to make your own.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from .data import LoggedData

__all__ = ["CRITICAL_DOMAINS", "DOMAIN_NAMES", "EXPLORE_DOMAINS", "RareHarmLogs", "SkillRouting", "rare_harm_logs",
           "skill_routing_logs"]

#: 27 domains, largest first (the share of domain k is proportional to (k + 1) ** -size_exponent)
DOMAIN_NAMES = (
    "music", "knowledge", "home_automation", "general", "weather", "timers", "shopping", "video",
    "notifications", "reminders", "calendar", "communication", "news", "local_search", "sports",
    "books", "recipes", "games", "podcasts", "radio", "movies", "travel", "finance", "health",
    "education", "translation", "jokes",
)
#: the business-critical domains of the paper's critical benchmark (appendix A.1)
CRITICAL_DOMAINS = ("home_automation", "shopping", "notifications")
#: the domains pushed to explore in the paper's explore benchmark (appendix A.1)
EXPLORE_DOMAINS = ("knowledge", "music")


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@dataclasses.dataclass
class SkillRouting:
    """The environment of the module docstring.

    Args:
        n_features: dimension of the non-domain features ``z``.
        n_actions: number of candidate skills ``A``.
        size_exponent: Zipf exponent of the domain sizes (0 = balanced).
        domain_effect: standard deviation of the domain-action effects ``B``.
        feature_effect: scale of the feature effects ``W``.
        beta: inverse temperature of the production policy.
        epsilon: uniform floor mixed into the production policy, in ``[0, 1)``.
        env_seed: seed of every parameter above.
    """

    n_features: int = 12
    n_actions: int = 8
    size_exponent: float = 1.0
    domain_effect: float = 1.0
    feature_effect: float = 2.0
    beta: float = 1.5
    epsilon: float = 0.05
    env_seed: int = 0

    def __post_init__(self):
        if int(self.n_features) < 1:
            raise ValueError(f"n_features: expected >= 1, got {self.n_features}")
        if int(self.n_actions) < 2:
            raise ValueError(f"n_actions: expected >= 2, got {self.n_actions}")
        if not 0 <= float(self.epsilon) < 1:
            raise ValueError(f"epsilon: expected a value in [0, 1), got {self.epsilon}")
        if float(self.size_exponent) < 0:
            raise ValueError(f"size_exponent: expected >= 0, got {self.size_exponent}")
        rng = np.random.default_rng([int(self.env_seed), 20220724])
        m, a, d = len(DOMAIN_NAMES), int(self.n_actions), int(self.n_features)
        shares = (np.arange(1, m + 1, dtype=np.float64)) ** -float(self.size_exponent)
        self.domain_shares = shares / shares.sum()
        self.b = rng.normal(1.0, 0.5, a)
        self.B = rng.normal(0.0, self.domain_effect, (m, a))
        self.W = rng.normal(0.0, self.feature_effect / np.sqrt(d), (d, a))
        self.b0 = self.b + rng.normal(0.0, 0.5, a)
        self.B0 = self.B + rng.normal(0.0, 0.5, (m, a))
        self.W0 = 0.5 * self.W + rng.normal(0.0, 0.3 / np.sqrt(d), (d, a))

    @property
    def domain_names(self) -> tuple[str, ...]:
        return DOMAIN_NAMES

    @property
    def context_dim(self) -> int:
        return len(DOMAIN_NAMES) + int(self.n_features)

    def expected_reward(self, k: np.ndarray, z: np.ndarray) -> np.ndarray:
        """``[N, A]`` true mean reward ``mu(x, a)`` for domains ``k [N]`` and features ``z [N, d]``."""
        return _sigmoid(self.b + self.B[k] + z @ self.W)

    def logging_policy(self, k: np.ndarray, z: np.ndarray) -> np.ndarray:
        """``[N, A]`` production policy ``Pi_0(.|x)``."""
        p = _softmax(self.beta * (self.b0 + self.B0[k] + z @ self.W0))
        return (1 - self.epsilon) * p + self.epsilon / self.n_actions

    def sample(self, n: int, seed: int = 0) -> LoggedData:
        """``n`` logged rounds of the production policy, reproducible from ``seed``.

        Returns a ``LoggedData`` with ``logging_probs`` (``[n, A]``) and
        ``expected_rewards`` (``[n, A]``, the truth, for exact policy values).
        """
        n = int(n)
        if n < len(DOMAIN_NAMES):
            raise ValueError(f"n: expected at least {len(DOMAIN_NAMES)} rounds (one per domain), got {n}")
        rng = np.random.default_rng([int(self.env_seed), int(seed), 1])
        m = len(DOMAIN_NAMES)
        # every domain gets at least one row (a domain with no samples is an error downstream)
        k = np.concatenate([np.arange(m), rng.choice(m, size=n - m, p=self.domain_shares)])
        k = k[rng.permutation(n)]
        z = rng.standard_normal((n, int(self.n_features)))
        pi0 = self.logging_policy(k, z)
        u = rng.random(n)
        a = np.minimum((pi0.cumsum(1) < u[:, None]).sum(1), self.n_actions - 1)
        mu = self.expected_reward(k, z)
        r = (rng.random(n) < mu[np.arange(n), a]).astype(np.float64)
        x = np.concatenate([np.eye(m)[k], z], axis=1)
        return LoggedData.from_tensors(x, a, r, pi0[np.arange(n), a], k, domain_names=DOMAIN_NAMES,
                                       n_actions=self.n_actions, logging_probs=pi0, expected_rewards=mu)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def skill_routing_logs(n: int = 100_000, seed: int = 0, env_seed: int = 0, **env_kwargs) -> LoggedData:
    """Shortcut: ``SkillRouting(env_seed=env_seed, **env_kwargs).sample(n, seed)``."""
    return SkillRouting(env_seed=env_seed, **env_kwargs).sample(n, seed)


# ---------------------------------------------------------------------- rare harms
@dataclasses.dataclass(frozen=True)
class RareHarmLogs:
    """``n_logs`` seeded logs of ``n_rows`` rows each, made by ``rare_harm_logs`` (see there), as tensors
    ``[L, n]`` so that an interval method can be run on every log at once.

    Attributes:
        contexts: ``[L, n, 3]`` the covariates ``x``.
        actions: ``[L, n]`` the logged action; target: ``[L, n]`` the target policy's action (deterministic).
        propensities: ``[L, n]`` the logging probability of the logged action.
        p_target: ``[L, n]`` the logging probability of the target's action (the matched share, about ``match``).
        harm, reward: ``[L, n]`` the logged 0/1 outcomes.
        rate, reward_rate: the target's true harm rate and reward rate (the estimand, the same in every log).
        n_actions: ``K``.
    """

    contexts: torch.Tensor
    actions: torch.Tensor
    target: torch.Tensor
    propensities: torch.Tensor
    p_target: torch.Tensor
    harm: torch.Tensor
    reward: torch.Tensor
    rate: float
    reward_rate: float
    n_actions: int

    @property
    def weights(self) -> torch.Tensor:
        """``[L, n]`` the target's importance weights ``1[a = target] / propensity``."""
        return (self.actions == self.target).to(torch.float64) / self.propensities

    @property
    def w_max(self) -> torch.Tensor:
        """``[L]`` the largest weight the target can reach in each log: ``1 / min p_target`` over its contexts."""
        return 1.0 / self.p_target.amin(-1)

    def log(self, i: int = 0):
        """Log ``i`` as a user holds it: ``(frame, data, probs)``: a pandas frame of the rows (covariates
        ``x0..x2``, ``action``, ``propensity``, ``harm``, ``reward``, ``pi0_<k>``), the ``LoggedData``
        loaded from it (``LoggedData.from_dataframe``, with the logging probabilities) and the target's
        probabilities ``[n, K]`` as a numpy array."""
        import pandas as pd

        K = self.n_actions
        a, t, p = self.actions[i].numpy(), self.target[i].numpy(), self.p_target[i].numpy()
        n = len(a)
        pi0 = np.repeat(((1 - p) / (K - 1))[:, None], K, 1)
        pi0[np.arange(n), t] = p
        x = self.contexts[i].numpy()
        frame = pd.DataFrame({"x0": x[:, 0], "x1": x[:, 1], "x2": x[:, 2], "action": a,
                              "propensity": self.propensities[i].numpy(), "harm": self.harm[i].numpy(),
                              "reward": self.reward[i].numpy(), "site": "all",
                              **{f"pi0_{k}": pi0[:, k] for k in range(K)}})
        data = LoggedData.from_dataframe(frame, context_columns=["x0", "x1", "x2"], action_column="action",
                                         reward_column="reward", propensity_column="propensity", domain_column="site",
                                         logging_prob_columns=[f"pi0_{k}" for k in range(K)])
        probs = np.zeros((n, K))
        probs[np.arange(n), t] = 1.0
        return frame, data, probs


def rare_harm_logs(n_logs: int = 200, n_rows: int = 2000, rate: float = 0.01, *, match: float = 0.05,
                   spread: float = 1.25, n_actions: int = 10, harm_ratio: float = 2.0, seed: int = 0) -> RareHarmLogs:
    """Seeded logs where a target policy's harm is rare and its actions rarely logged (issue 39).

    The setting: a user judges a candidate policy from the logs of another one by a harm (an adverse
    event, a hidden item) at a rate of 0.5-2 %, and the log played the candidate's actions a twentieth of
    the time, so the candidate is seen on tens of rows and its harm on a handful or none.

    * context ``x ~ N(0, I_3)``; ``K = n_actions`` actions;
    * the target is deterministic: action ``t(x) = floor(K Phi(x_2))``;
    * the logging policy plays ``t(x)`` with probability ``p(x) = match * spread ** (2 Phi(x_1) - 1)``
      (from ``match / spread`` to ``match * spread``: varied weights, the largest ``spread / match``), and
      every other action with ``(1 - p(x)) / (K - 1)``;
    * harm is 0/1 with probability ``rate * exp(x_0 / 2 - 1/8)`` under the target's action (mean exactly
      ``rate`` over contexts, up to a cap at 1 of no weight at these rates) and ``harm_ratio`` times that
      under the others (the log's own harm rate is not the target's);
    * a 0/1 reward, common (0.3 under the target's action, 0.2 otherwise): a metric where the bootstrap
      has enough matched events.

    Args:
        n_logs, n_rows: ``L`` logs of ``n`` rows; rate: the target's true harm rate.
        seed: every log is a function of ``(seed, log index)`` (log ``i`` is the same whatever ``n_logs``).

    Returns:
        ``RareHarmLogs`` (tensors ``[L, n]``, the truth in ``rate``).
    """
    L, n, K = int(n_logs), int(n_rows), int(n_actions)
    if L < 1 or n < 2 or K < 2:
        raise ValueError(f"n_logs >= 1, n_rows >= 2, n_actions >= 2 expected, got {n_logs}, {n_rows}, {n_actions}")
    if not 0 < float(rate) * float(harm_ratio) * 3 < 1 or not 0 < float(match) * float(spread) < 1 or spread < 1:
        raise ValueError(f"rate, harm_ratio, match, spread: expected small rates and spread >= 1, got {rate}, "
                         f"{harm_ratio}, {match}, {spread}")
    normal = torch.distributions.Normal(0.0, 1.0)
    out = {k: [] for k in ("x", "a", "t", "prop", "pt", "harm", "reward")}
    for i in range(L):
        g = torch.Generator().manual_seed(int(np.random.SeedSequence([int(seed), i, 39]).generate_state(1)[0]))
        x = torch.randn(n, 3, generator=g, dtype=torch.float64)
        u = normal.cdf(x)
        t = (u[:, 2] * K).long().clamp(max=K - 1)
        p = float(match) * float(spread) ** (2 * u[:, 1] - 1)
        hit = torch.rand(n, generator=g, dtype=torch.float64) < p
        other = torch.randint(K - 1, (n,), generator=g)
        a = torch.where(hit, t, other + (other >= t).long())
        prop = torch.where(hit, p, (1 - p) / (K - 1))
        h = float(rate) * torch.exp(x[:, 0] / 2 - 0.125)
        h = torch.where(hit, h, float(harm_ratio) * h).clamp(max=1.0)
        harm = (torch.rand(n, generator=g, dtype=torch.float64) < h).to(torch.float64)
        reward = (torch.rand(n, generator=g, dtype=torch.float64) < torch.where(hit, 0.3, 0.2)).to(torch.float64)
        for k, v in zip(out, (x, a, t, prop, p, harm, reward)):
            out[k].append(v)
    s = {k: torch.stack(v) for k, v in out.items()}
    # the cap at 1 of the harm probability: its effect on the mean, exactly (a normal integral)
    true = float(rate) * _capped_lognormal_mean(float(rate))
    return RareHarmLogs(s["x"], s["a"], s["t"], s["prop"], s["pt"], s["harm"], s["reward"], true, 0.3, K)


def _capped_lognormal_mean(rate: float) -> float:
    """``E[min(exp(Z / 2 - 1/8), 1 / rate)]`` for ``Z ~ N(0, 1)`` (1 up to a negligible cap at small rates)."""
    c = math.log(1.0 / rate) + 0.125  # the cap on the scale of Z / 2
    z = 2 * c
    phi = 0.5 * (1 + math.erf((z - 0.5) / math.sqrt(2)))  # P(Z < z) under the tilted normal N(0.5, 1)
    tail = 0.5 * (1 - math.erf(z / math.sqrt(2)))
    return phi + tail / rate
