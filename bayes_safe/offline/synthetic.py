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

import numpy as np

from .data import LoggedData

__all__ = ["CRITICAL_DOMAINS", "DOMAIN_NAMES", "EXPLORE_DOMAINS", "SkillRouting", "skill_routing_logs"]

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
