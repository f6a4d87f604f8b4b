"""Calibrated per-arm models for classification-style bandits (0/1 reward, one model per action).

```python
from bayes_safe.models import calibrated_per_arm

cal = calibrated_per_arm(X_warm, labels=y_warm, num_arms=K)   # warm rows with their labels
policy = ThompsonSampling(cal.model)                            # or ConservativeTS(cal.model, alpha=0.1)
print(cal)                                                      # the fitted prior scale and noise sd
```

**Why.** ``N(0, 1)`` on every weight of standardised features with noise sd 0.5 (the generic
advice for a unit-scale outcome) is far too wide for a 0/1 reward: at ``d`` features a draw of an
untried arm's reward has sd about ``sqrt(d)`` (8 at ``d = 65``) for an outcome in ``[0, 1]``, and
noise sd 0.5 is above the largest sd a 0/1 outcome can have. Thompson sampling then explores for
hundreds of steps (issue 32's bake-off: 1.95x the baseline's progressive-validation loss, against
greedy's 1.09x).

**What.** Empirical Bayes (type-II maximum likelihood; Bishop 2006, s.3.5) on a warm slice of
rows, e.g. the data today's production policy was trained on, with the arms as the instances of
``fit_prior``'s population model: arm ``k``'s weights ``w_k ~ N(mu, Sigma)`` and reward ``y =
x^T w_k + N(0, sigma^2)``. The fit gives three things and nothing else: the prior mean ``mu``
shared by all arms (for one-hot rewards about ``1 / K`` on the intercept, since the arms' rewards
sum to 1), the prior scale (``covariance="isotropic"``: one ``tau`` for every weight, so that a
draw's spread is the size of the effects the warm slice supports, about ``1 / sqrt(d)`` of the
reward's range per standardised feature) and the noise ``sigma`` (at most 0.5, the largest sd of
a 0/1 outcome). The warm rows' posterior is *not* kept: every arm starts from the shared prior,
so the warm labels do not enter the arms' means (pass them through ``power_prior`` for that).
Shrinkage across actions is the shared ``mu``.

**Temperature.** ``temperature`` ``T`` multiplies the posterior covariance by ``T`` at every step
and leaves the posterior mean unchanged: the model is built with prior sd ``tau sqrt(T)`` and noise
sd ``sigma sqrt(T)``, so the posterior precision is ``1 / T`` times the calibrated one and the mean
(a ratio of the two) is the same. ``T < 1`` shrinks Thompson draws toward the mean (``T -> 0`` is
greedy); ``T = 1`` is the calibrated posterior. The default 0.25 (draws at half the posterior's
sd) is the bake-off's choice: Bietti et al. (JMLR 2021) find that minimising exploration is a key
design goal on classification-style data, where the context itself explores. A policy that
checks a budget on the posterior (``ConservativeTS``) then checks it on the tempered posterior;
pass ``temperature=1.0`` for the calibrated intervals.

**Exploration** (``exploration``, issue 44; default ``"rows"``). The model is built with
``thompson_exploration = exploration``, the draw rule ``ThompsonSampling`` and ``ConservativeTS``
use by default (their ``exploration`` argument overrides it). ``"rows"``: a draw of arm ``k``'s
score at ``x`` is at temperature ``T / max(1, n_k(x))``, with ``n_k(x) = sigma^2 / v_k(x)`` the arm's
effective rows there (``v_k(x)`` its score's calibrated posterior variance): arms that hold less than
one row's worth of information at ``x`` are drawn as before, arms pinned by many rows (a warm start
with the production data) are drawn ever closer to their mean. Measured (issue 44's bake-off, 8 data
sets x 10 shuffles, two stream orders, ``docs/reports/bakeoff.md``): below the fixed temperature's loss
in both protocols on both orders, and level with greedy over the two orders when every arm is
warm-started (0.1254 against 0.1254 mean PV loss), where the fixed-temperature draws lost more.
``"posterior"``: draws from the tempered posterior (the behaviour before issue 44).

Warm data come either as full-information labels (``labels [N]``: the reward of arm ``k`` is
``labels == k``, every row informs every arm) or as a bandit log (``actions [N]``, ``rewards
[N]``: a row informs the arm played). At least two arms must have rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyro.distributions as dist
import torch

from .._validation import check_exploration
from .empirical_bayes import PriorFit, fit_prior
from .per_arm import PerArmLinear

__all__ = ["CalibratedPerArm", "calibrated_per_arm"]

F64 = torch.float64
MAX_BINARY_NOISE_SD = 0.5  # the sd of a Bernoulli(1/2): no 0/1 outcome is noisier


@dataclass(frozen=True)
class CalibratedPerArm:
    """What ``calibrated_per_arm`` built.

    Attributes:
        model: the ``PerArmLinear`` (prior ``N(mu, tau^2 T I)``, noise sd ``sigma sqrt(T)``), with
            ``thompson_exploration`` set to ``exploration``.
        prior_mean: ``mu [d]``; prior_scale: ``tau``; noise_std: ``sigma`` (both before the temperature).
        temperature: ``T``.
        fit: the ``PriorFit`` of the empirical-Bayes step (evidence, iterations).
        num_warm: the warm rows ``N``.
        exploration: the policies' default draw rule on ``model`` (``"rows"`` or ``"posterior"``).
    """

    model: PerArmLinear
    prior_mean: torch.Tensor
    prior_scale: float
    noise_std: float
    temperature: float
    fit: PriorFit
    num_warm: int = 0
    exploration: str = "rows"

    def __repr__(self) -> str:
        return (f"CalibratedPerArm(num_arms={self.model.num_arms}, dim={self.model.dim}, prior_scale={self.prior_scale:.4g}, "
                f"noise_std={self.noise_std:.4g}, temperature={self.temperature:g}, exploration={self.exploration!r}, "
                f"largest prior mean={float(self.prior_mean.abs().max()):.3g}, warm rows={self.num_warm})")


def _matrix(x, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] < 1:
        raise ValueError(f"{name}: expected a 2-D array [N, d] with N >= 1, got shape {list(a.shape)}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name}: contains NaN or infinite values")
    return a


def _indices(x, name: str, n: int, num_arms: int) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.shape != (n,) or not (np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"{name}: expected {n} integer arm indices, got shape {list(a.shape)} and dtype {a.dtype}")
    if ((a < 0) | (a >= num_arms)).any():
        raise ValueError(f"{name}: expected indices in [0, {num_arms}), got min {a.min()} and max {a.max()}")
    return a.astype(np.int64)


def calibrated_per_arm(contexts, *, num_arms: int, labels=None, actions=None, rewards=None,
                       temperature: float = 0.25, max_noise_std: float | None = MAX_BINARY_NOISE_SD,
                       min_scale: float = 1e-3, feature_names=None, exploration: str = "rows") -> CalibratedPerArm:
    """A ``PerArmLinear`` whose prior mean, prior scale and noise are fitted on warm rows (module docstring).

    Args:
        contexts: warm contexts ``[N, d]`` (standardise them as the policy's contexts will be, and
            include the constant feature if the policy's contexts have one).
        num_arms: ``K``.
        labels: ``[N]`` correct arms (full information: arm ``k``'s reward is ``labels == k``); or
        actions, rewards: ``[N]`` played arms and their rewards (a bandit log).
        temperature: ``T > 0``, the posterior covariance multiplier (default 0.25; 1 is the calibrated posterior).
        max_noise_std: a ceiling on the fitted noise sd (default 0.5, the largest sd of a 0/1
            outcome); None for no ceiling (a reward that is not 0/1).
        min_scale: the smallest prior sd allowed (as for ``fit_prior``).
        feature_names: passed to ``PerArmLinear``.
        exploration: ``"rows"`` (default) or ``"posterior"``: the draw rule the model carries for
            ``ThompsonSampling`` and ``ConservativeTS`` (module docstring, "Exploration").
    """
    X = _matrix(contexts, "contexts")
    N, d = X.shape
    if isinstance(num_arms, bool) or not isinstance(num_arms, int) or num_arms < 2:
        raise ValueError(f"num_arms: expected an int >= 2, got {num_arms!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < math.inf:
        raise ValueError(f"temperature: expected a positive number, got {temperature!r}")
    check_exploration(exploration)
    if max_noise_std is not None and not 0 < max_noise_std < math.inf:
        raise ValueError(f"max_noise_std: expected a positive number or None, got {max_noise_std!r}")
    if (labels is None) == (actions is None and rewards is None):
        raise ValueError("give either labels (full information) or actions and rewards (a bandit log)")
    if labels is not None:
        y = _indices(labels, "labels", N, num_arms)
        Xs = np.tile(X, (num_arms, 1))                                   # every row informs every arm
        ys = (y[None, :] == np.arange(num_arms)[:, None]).astype(np.float64).reshape(-1)
        groups = np.repeat(np.arange(num_arms), N)
    else:
        if actions is None or rewards is None:
            raise ValueError("a bandit log needs both actions and rewards")
        groups = _indices(actions, "actions", N, num_arms)
        ys = np.asarray(rewards.detach().cpu().numpy() if isinstance(rewards, torch.Tensor) else rewards,
                        dtype=np.float64)
        if ys.shape != (N,) or not np.isfinite(ys).all():
            raise ValueError(f"rewards: expected {N} finite numbers, got shape {list(ys.shape)}")
        Xs = X
    if len(np.unique(groups)) < 2:
        raise ValueError("at least two arms need warm rows (the prior is the spread between arms)")
    fit = fit_prior(Xs, ys, groups, covariance="isotropic", min_scale=min_scale)
    mu = fit.mean.to(F64)
    tau = float(fit.prior.base_dist.scale.mean())
    sigma = fit.noise_std if max_noise_std is None else min(fit.noise_std, float(max_noise_std))
    root = math.sqrt(float(temperature))
    prior = dist.Normal(mu, torch.full((d,), tau * root, dtype=F64)).to_event(1)
    model = PerArmLinear(prior, num_arms, noise_std=sigma * root, feature_names=feature_names)
    model.thompson_exploration = exploration  # the policies' default draw rule (module docstring)
    return CalibratedPerArm(model, mu, tau, sigma, float(temperature), fit, N, exploration)
