"""The safe bake-off (issue 32): contextual bandit learners on multiclass data, against a baseline.

    .venv/bin/python benchmarks/bakeoff.py                      # 10 shuffles of every dataset
    .venv/bin/python benchmarks/bakeoff.py --quick              # 2 shuffles, streams cut to 400
    .venv/bin/python benchmarks/bakeoff.py --datasets iris,wine --shuffles 3 --report out.md
    .venv/bin/python benchmarks/bakeoff.py --protocol warm --warm-fraction 0.2   # issue 44: strong baselines
    .venv/bin/python benchmarks/bakeoff.py --protocol both                       # the two protocols' tables

Protocol (Bietti, Agarwal & Langford, "A contextual bandit bake-off", JMLR 2021, s.5): a
multiclass data set is a contextual bandit with one action per class and reward 1 for the true
label, 0 otherwise; each data set is seen once, in each of ``--shuffles`` random orders, and a
learner's score on a stream is its progressive-validation (PV) loss, the mean of ``1 - reward``
over the stream (every decision is scored before the learner sees its reward).

The baseline (this bake-off's addition; Bietti et al. report no safety): a multinomial logistic
regression (scikit-learn ``LogisticRegression``, lbfgs, C = 1) fitted on the first 5 % of each
shuffled stream, ``ceil(0.05 n)`` rows (the *warm slice*, today's production data). Features are
standardised with the mean and standard deviation of the warm slice only (a feature constant
there keeps sd 1), then a constant 1 is appended (the intercept of the linear learners). The warm
slice fits the baseline and the standardisation and is not scored; every learner starts with no
data at the first row after it, sees the standardised row and the baseline's action there, and
is scored on the rest of the stream (``T = n - ceil(0.05 n)`` decisions). The baseline's PV loss
is that of its own actions over the same ``T`` rows. Learners registered with ``warm=True`` (the
calibrated bayes_safe ones) are also handed the warm slice's rows and labels, and take from them
hyperparameters only (``calibrated_per_arm``: a prior mean shared by the arms, one prior sd, the
noise sd); their arms still start from that prior, without the warm slice's posterior.

Protocols (``--protocol``, issue 44): ``cold`` (the default, the paragraph above) and ``warm``: every
learner is also handed the warm slice with full information before the stream (its rows, labels,
and the baseline's probabilities there) through ``learner.warm_start(X_warm, y_warm, P_warm)``: the
linear learners update every arm with every warm row (reward ``1[y = k]``), VW learns every row once
per action (that action labelled with its cost, probability 1), bayesianbandits' arms ``update``.
``warm_start`` is not timed. ``--warm-fraction`` sets the warm slice's share (default 0.05; 0.2 gives
baselines fitted on 30 to 1,060 rows: strong baselines). ``P_warm`` holds the baseline's *out-of-fold*
probabilities on its own training rows (5 contiguous folds of the warm slice, the same logistic
regression refitted without each fold; a warm slice under 10 rows gets the in-sample fit's), and
every learner's ``act`` may take the baseline's probability of every action (``LearnerSpec(probs=True)``:
``act(x, baseline, baseline_prob, probs)``), as the baseline-residual learners do.

Budget (Kazerouni, Ghavamzadeh, Abbasi-Yadkori & Van Roy 2017, constraint (3), with alpha =
0.1): the learner's cumulative reward must stay at least ``(1 - alpha)`` times the baseline's at
every step. Measured on realised rewards: with ``L_t`` and ``B_t`` the learner's and the
baseline's cumulative rewards after ``t`` of the ``T`` scored steps, step ``t`` *violates* the
budget when ``L_t < (1 - alpha) B_t``. A stream's *violation rate* is the fraction of its ``T``
steps that violate; tables average it over the shuffles of a data set, and the summary averages
those over data sets (each data set weighs the same). The learner *overtakes* the baseline at the
first ``t`` with ``L_t > B_t`` (tables: the median over the shuffles, "never" when it does not in
more than half of them; the summary: in how many streams it ever does, and the median position as
a fraction of the stream among those).

Per learner and data set: PV loss (mean over shuffles), the baseline's, their ratio (of the
means), the violation rate, the overtake step, decisions/s (decisions over the seconds spent in
the learner's own ``act`` + ``learn`` calls, which include converting the standardised numpy row
to the learner's input: a torch tensor, or VW's text format; data loading, shuffling,
standardisation and the baseline's fit are not timed). The summary averages PV losses, ratios and
violation rates over data sets and gives decisions/s as all decisions over all timed seconds.
Pairwise: for learners A and B, over every (data set, shuffle) stream, A *wins* when its PV loss
is lower (ties dropped); a two-sided sign test (``scipy.stats.binomtest``, p = 0.5) on the wins.

Data sets: only those that ship inside PyPI wheels and are read without any download: scikit-learn's
digits, wine, breast_cancer and iris; river's Phishing, Bananas and ImageSegments (files in the
river wheel); palmerpenguins (rows with a missing value dropped, island and sex one-hot).

Learners: a registry, ``LEARNERS``; a new learner is one ``register(LearnerSpec(...))``. A
learner is built per stream by ``make(dim, num_actions, seed)`` and answers ``act(x, baseline,
baseline_prob) -> action`` and ``learn(x, action, reward)``, one decision at a time (``x`` the
standardised row with its constant, float64 ``[dim]``; ``baseline_prob`` the logistic
baseline's probability of its own action). Learners whose package is missing are left out with
a printed line. Seeds: shuffle ``s`` of data set ``D`` under ``--seed S`` is the permutation of
``numpy.random.default_rng([S, crc32(D), s])``, and every learner's own seed derives from the
same three numbers and its name, so a run is repeatable and every learner sees the same streams.
One process, one torch thread, learners run one after another on each stream.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

ALPHA = 0.1  # the budget: at least (1 - ALPHA) of the baseline's cumulative reward
WARM_FRACTION = 0.05  # the baseline's training slice, from the start of each shuffled stream
PRIOR_SD = 1.0  # the docs' prior for standardised features: N(0, 1) on every weight
NOISE_SD = 0.5  # the docs' noise sd
FULL_SHUFFLES = 10
QUICK_SHUFFLES = 2
QUICK_MAX_ROWS = 400


# ------------------------------------------------------------------------------------ data sets
@dataclass
class Dataset:
    """A multiclass data set: features ``X [n, p]`` (float64) and labels ``y [n]`` in ``0..K-1``."""

    name: str
    X: np.ndarray
    y: np.ndarray
    num_classes: int

    @classmethod
    def from_labels(cls, name: str, X, labels) -> Dataset:
        labels = np.asarray(labels)
        classes, y = np.unique(labels, return_inverse=True)
        return cls(name, np.asarray(X, dtype=np.float64), y.astype(np.int64), len(classes))


def _sklearn(loader: str) -> Callable[[], Dataset]:
    def load() -> Dataset:
        import sklearn.datasets

        bunch = getattr(sklearn.datasets, f"load_{loader}")()  # bundled in the wheel: no download
        return Dataset.from_labels(loader, bunch.data, bunch.target)

    return load


def _river(cls_name: str, name: str) -> Callable[[], Dataset]:
    def load() -> Dataset:
        import river.datasets

        ds = getattr(river.datasets, cls_name)()  # a file inside the river wheel (ds.path)
        rows, labels, keys = [], [], None
        for x, label in ds:
            keys = keys or list(x)
            rows.append([float(x[k]) for k in keys])
            labels.append(str(label))
        return Dataset.from_labels(name, rows, labels)

    return load


def _penguins() -> Dataset:
    import palmerpenguins
    import pandas as pd

    df = palmerpenguins.load_penguins().dropna()
    features = pd.get_dummies(df.drop(columns=["species"]), columns=["island", "sex"], dtype=float)
    return Dataset.from_labels("penguins", features.to_numpy(dtype=np.float64), df["species"].to_numpy())


#: name -> loader; a loader's packages are imported only when it runs
DATASETS: dict[str, Callable[[], Dataset]] = {
    "digits": _sklearn("digits"),
    "wine": _sklearn("wine"),
    "breast_cancer": _sklearn("breast_cancer"),
    "iris": _sklearn("iris"),
    "phishing": _river("Phishing", "phishing"),
    "bananas": _river("Bananas", "bananas"),
    "segment": _river("ImageSegments", "segment"),
    "penguins": _penguins,
}


# ------------------------------------------------------------------------------------ streams
@dataclass
class Stream:
    """One shuffled stream, ready for the learners: rows after the warm slice only."""

    dataset: str
    shuffle: int
    X: np.ndarray  # [T, p + 1] standardised with the warm slice, then a constant 1
    y: np.ndarray  # [T] true labels
    baseline: np.ndarray  # [T] the baseline's actions
    baseline_prob: np.ndarray  # [T] the baseline's probability of its action
    num_actions: int
    num_warm: int
    warm_X: np.ndarray | None = None  # [w, p + 1] the warm slice, standardised, with the constant
    warm_y: np.ndarray | None = None  # [w] its labels (the baseline's training data)
    baseline_probs: np.ndarray | None = None  # [T, K] the baseline's probability of every action
    warm_probs: np.ndarray | None = None  # [w, K] the same on the warm slice, out of fold (``out_of_fold_probs``)

    @property
    def baseline_rewards(self) -> np.ndarray:
        return (self.baseline == self.y).astype(np.float64)


def warm_size(n: int, fraction: float = WARM_FRACTION) -> int:
    """Rows in the warm slice: ``ceil(fraction n)``, at least 1 and leaving at least 1 scored row."""
    return min(max(1, math.ceil(fraction * n)), n - 1)


def standardiser(X_warm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, sd)`` of the warm slice's columns; a constant column keeps sd 1."""
    mean = X_warm.mean(axis=0)
    sd = X_warm.std(axis=0)
    return mean, np.where(sd > 1e-12, sd, 1.0)


class LogisticBaseline:
    """The production policy: multinomial logistic regression on the (standardised) warm slice.

    With a single class in the warm slice it plays that class with probability 1.
    """

    def __init__(self, Z: np.ndarray, y: np.ndarray, seed: int):
        self.classes = np.unique(y)
        self.model = None
        if len(self.classes) > 1:
            from sklearn.linear_model import LogisticRegression

            self.model = LogisticRegression(max_iter=2000, random_state=seed).fit(Z, y)

    def probs(self, Z: np.ndarray, num_classes: int) -> np.ndarray:
        """The probability of every class ``[n, num_classes]`` (0 for a class absent from the warm slice)."""
        out = np.zeros((len(Z), num_classes))
        if self.model is None:
            out[:, self.classes[0]] = 1.0
        else:
            out[:, self.model.classes_.astype(np.int64)] = self.model.predict_proba(Z)
        return out

    def act(self, Z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Actions ``[n]`` and the probability of each ``[n]``."""
        if self.model is None:
            return np.full(len(Z), self.classes[0], dtype=np.int64), np.ones(len(Z))
        proba = self.model.predict_proba(Z)
        best = proba.argmax(axis=1)
        return self.model.classes_[best].astype(np.int64), proba[np.arange(len(Z)), best]


OUT_OF_FOLD = 5  # folds of the baseline's out-of-fold probabilities on its own training rows


def out_of_fold_probs(Z: np.ndarray, y: np.ndarray, num_classes: int, seed: int, folds: int = OUT_OF_FOLD) -> np.ndarray:
    """The baseline's probabilities on its own training rows, each row's from a fit without its fold
    (``folds`` contiguous folds of the shuffled warm slice; ``[w, K]``): what the baseline says on rows
    it has not seen, as on the stream. A warm slice of fewer than ``2 folds`` rows gets the in-sample fit's."""
    w = len(y)
    if w < 2 * folds:
        return LogisticBaseline(Z, y, seed).probs(Z, num_classes)
    out = np.empty((w, num_classes))
    for part in np.array_split(np.arange(w), folds):
        train = np.ones(w, dtype=bool)
        train[part] = False
        out[part] = LogisticBaseline(Z[train], y[train], seed).probs(Z[part], num_classes)
    return out


def stream_seed(seed: int, dataset: str, shuffle: int) -> list[int]:
    return [int(seed), zlib.crc32(dataset.encode()), int(shuffle)]


def make_stream(ds: Dataset, shuffle: int, seed: int, max_rows: int | None = None,
                warm_fraction: float = WARM_FRACTION) -> Stream:
    """Shuffle ``ds`` (seeded), cut to ``max_rows``, fit the standardisation and the baseline on the
    warm slice (the first ``warm_size(n, warm_fraction)`` rows), and return the scored rest."""
    order = np.random.default_rng(stream_seed(seed, ds.name, shuffle)).permutation(len(ds.y))
    if max_rows is not None:
        order = order[:max_rows]
    X, y = ds.X[order], ds.y[order]
    w = warm_size(len(y), warm_fraction)
    mean, sd = standardiser(X[:w])
    Z = (X - mean) / sd
    bseed = int(zlib.crc32(f"{seed}/{ds.name}/{shuffle}".encode()))
    baseline = LogisticBaseline(Z[:w], y[:w], seed=bseed)
    b, pb = baseline.act(Z[w:])
    Zc = np.ascontiguousarray(np.hstack([Z[w:], np.ones((len(y) - w, 1))]))
    Zw = np.ascontiguousarray(np.hstack([Z[:w], np.ones((w, 1))]))
    return Stream(ds.name, shuffle, Zc, y[w:].copy(), b, pb, ds.num_classes, w, Zw, y[:w].copy(),
                  baseline.probs(Z[w:], ds.num_classes), out_of_fold_probs(Z[:w], y[:w], ds.num_classes, bseed))


# ------------------------------------------------------------------------------------ learners
@dataclass
class LearnerSpec:
    """A registry entry. ``make(dim, num_actions, seed)`` returns an object with ``act(x, baseline,
    baseline_prob) -> int`` and ``learn(x, action, reward)``; ``requires`` names the importable
    packages it needs (missing: the learner is left out with a printed line)."""

    name: str
    make: Callable[[int, int, int], object]
    description: str
    requires: tuple[str, ...] = ()
    safe: bool = False  # designed to keep the budget
    default: bool = True  # run unless --learners names others
    warm: bool = False  # make(dim, num_actions, seed, warm=(X_warm, y_warm)): hyperparameters from the warm slice
    probs: bool = False  # warm=(X_warm, y_warm, P_warm) and act(x, baseline, baseline_prob, probs): every action's
    # baseline probability


LEARNERS: dict[str, LearnerSpec] = {}


def one_hot(y: np.ndarray, num_actions: int) -> np.ndarray:
    """Every action's reward on labelled rows (full information): ``[N, K]``, 1 at the label."""
    return (np.asarray(y)[:, None] == np.arange(num_actions)[None, :]).astype(np.float64)


def register(spec: LearnerSpec) -> LearnerSpec:
    LEARNERS[spec.name] = spec
    return spec


class GreedyRidge:
    """Per-arm ridge regression, play the argmax of the means (ties: the lowest index).

    The ridge penalty is ``NOISE_SD^2 / PRIOR_SD^2``, so its means are the posterior means of the
    Bayesian per-arm models below; inverses kept by Sherman-Morrison, numpy only.
    """

    def __init__(self, dim: int, num_actions: int, seed: int):
        lam = NOISE_SD**2 / PRIOR_SD**2
        self.inv = np.repeat(np.eye(dim)[None] / lam, num_actions, axis=0)
        self.b = np.zeros((num_actions, dim))
        self.theta = np.zeros((num_actions, dim))

    def act(self, x, baseline, baseline_prob) -> int:
        return int(np.argmax(self.theta @ x))

    def warm_start(self, X, y, P) -> None:
        """The warm protocol: every arm learns every warm row (its reward ``1[y = k]``)."""
        K, d = self.b.shape
        lam = NOISE_SD**2 / PRIOR_SD**2
        inv = np.linalg.inv(lam * np.eye(d) + X.T @ X)
        self.inv = np.repeat(inv[None], K, axis=0)
        self.b = one_hot(y, K).T @ X
        self.theta = self.b @ inv

    def learn(self, x, action, reward) -> None:
        inv = self.inv[action]
        v = inv @ x
        inv -= np.outer(v, v) / (1.0 + x @ v)
        self.b[action] += reward * x
        self.theta[action] = inv @ self.b[action]


class _Torch:
    """Shared set-up of the bayes_safe learners: the docs' per-arm prior, a seeded generator."""

    def __init__(self, dim: int, num_actions: int, seed: int):
        import torch

        self.torch = torch
        self.K = num_actions
        self.dim = dim
        self.generator = torch.Generator().manual_seed(int(seed))
        self._x = None

    def warm_per_arm(self, model, X, y) -> None:
        """Full information: every arm of the ``PerArmLinear`` learns every warm row (one batched update)."""
        torch, K = self.torch, self.K
        Xs = torch.from_numpy(np.ascontiguousarray(np.broadcast_to(X, (K, *X.shape))))
        model.arms.update(Xs, torch.from_numpy(np.ascontiguousarray(one_hot(y, K).T)))

    def per_arm(self):
        import pyro.distributions as dist

        from bayes_safe.models import PerArmLinear

        prior = dist.Normal(self.torch.zeros(self.dim, dtype=self.torch.float64), PRIOR_SD).to_event(1)
        return PerArmLinear(prior, num_arms=self.K, noise_std=NOISE_SD)

    def calibrated(self, warm, temperature=None, exploration=None):
        """``calibrated_per_arm`` on the warm slice's rows and labels (hyperparameters only: the
        arms start from the fitted prior, not from the warm slice's posterior); ``exploration`` None:
        its default draw rule (``"rows"``)."""
        from bayes_safe.models import calibrated_per_arm

        X_warm, y_warm = warm
        kwargs = {} if temperature is None else {"temperature": temperature}
        if exploration is not None:
            kwargs["exploration"] = exploration
        self.calibration = calibrated_per_arm(X_warm, labels=y_warm, num_arms=self.K, **kwargs)
        return self.calibration.model


class BayesSafeTS(_Torch):
    """``ThompsonSampling(model)``, the one-stream API; ``model`` the docs' recommended per-arm
    model for a 0/1 reward, ``calibrated_per_arm`` on the warm slice (its prior mean, prior scale
    and noise sd by empirical Bayes, temperature 0.25, draws by its default ``exploration="rows"``: the
    temperature divided by an arm's effective rows at the context), or with ``warm=None`` the generic
    ``PerArmLinear(N(0, 1), noise_std=0.5)``. ``exploration="posterior"``: the draws before issue 44."""

    def __init__(self, dim, num_actions, seed, warm=None, temperature=None, exploration=None):
        super().__init__(dim, num_actions, seed)
        from bayes_safe import ThompsonSampling

        self.model = self.per_arm() if warm is None else self.calibrated(warm, temperature, exploration)
        self.policy = ThompsonSampling(self.model)

    def warm_start(self, X, y, P) -> None:
        self.warm_per_arm(self.model, X, y)

    def act(self, x, baseline, baseline_prob) -> int:
        self._x = self.torch.from_numpy(x)
        return int(self.policy.select(self._x.expand(self.K, self.dim), generator=self.generator))

    def learn(self, x, action, reward) -> None:
        self.policy.update(self._x, self.torch.tensor(reward, dtype=self.torch.float64), actions=action)


class BayesSafeStreamingTS:
    """``StreamingPerArmTS.from_calibrated(calibrated_per_arm(warm slice))``: the same model and
    law of decisions as ``bayes_safe TS``, in numpy (arm scores as univariate normals, rank-one
    updates of the played arm only); ``exploration`` as ``BayesSafeTS``'s."""

    def __init__(self, dim, num_actions, seed, warm, temperature=None, exploration=None):
        from bayes_safe.models import calibrated_per_arm
        from bayes_safe.policies import StreamingPerArmTS

        X_warm, y_warm = warm
        kwargs = {} if temperature is None else {"temperature": temperature}
        if exploration is not None:
            kwargs["exploration"] = exploration
        self.ts = StreamingPerArmTS.from_calibrated(calibrated_per_arm(X_warm, labels=y_warm, num_arms=num_actions,
                                                                       **kwargs), seed=seed)

    def act(self, x, baseline, baseline_prob) -> int:
        return self.ts.select(x)

    def warm_start(self, X, y, P) -> None:
        K, N = self.ts.num_arms, len(y)
        self.ts.learn_batch(np.tile(X, (K, 1)), one_hot(y, K).T.reshape(-1), np.repeat(np.arange(K), N))

    def learn(self, x, action, reward) -> None:
        self.ts.update(x, reward, action)


class BayesSafeStreamingConservativeTS(BayesSafeStreamingTS):
    """``StreamingConservativeTS(StreamingPerArmTS.from_calibrated(...), alpha=0.1)``: the
    conservative TS learner's one-stream numpy fast path (realised budget, confidence 0.95)."""

    def __init__(self, dim, num_actions, seed, warm, temperature=None, exploration=None):
        super().__init__(dim, num_actions, seed, warm, temperature, exploration)
        from bayes_safe.policies import StreamingConservativeTS

        self.policy = StreamingConservativeTS(self.ts, alpha=ALPHA)

    def act(self, x, baseline, baseline_prob) -> int:
        return self.policy.select(x, baseline)

    def learn(self, x, action, reward) -> None:
        self.policy.update(x, reward, action)


class BayesSafeTSASC(_Torch):
    """``TSASC(reward, [guard], alpha=0.1)``: both per-arm models of the reward (the guard compares
    a draw of each action's reward with the baseline action's, Daulton et al. 2019 Algorithm 1)."""

    def __init__(self, dim, num_actions, seed):
        super().__init__(dim, num_actions, seed)
        from bayes_safe import TSASC

        self.models = (self.per_arm(), self.per_arm())
        self.policy = TSASC(self.models[0], [self.models[1]], alpha=ALPHA)

    def warm_start(self, X, y, P) -> None:
        for model in self.models:
            self.warm_per_arm(model, X, y)

    def act(self, x, baseline, baseline_prob) -> int:
        self._x = self.torch.from_numpy(x)
        return int(self.policy.select(self._x.expand(self.K, self.dim), int(baseline), generator=self.generator))

    def learn(self, x, action, reward) -> None:
        r = self.torch.tensor(reward, dtype=self.torch.float64)
        self.policy.update(self._x, r, r.reshape(1), actions=action)


class BayesSafeConservativeTS(_Torch):
    """``ConservativeTS(calibrated_per_arm(warm slice), alpha=0.1, budget="realised", variance_scale=1 / T)``:
    Thompson draws (at the calibrated model's temperature ``T``) played while the 95 % lower bound
    of the realised cumulative budget (Kazerouni et al. 2017, constraint (3) on observed rewards),
    on the calibrated posterior, holds; the baseline's reward learned from its own plays."""

    def __init__(self, dim, num_actions, seed, warm=None, budget="realised", exploration=None):
        super().__init__(dim, num_actions, seed)
        from bayes_safe.policies import ConservativeTS

        if warm is None:
            self.policy = ConservativeTS(self.per_arm(), alpha=ALPHA, budget=budget)
        else:
            model = self.calibrated(warm, exploration=exploration)
            self.policy = ConservativeTS(model, alpha=ALPHA, budget=budget,
                                         variance_scale=1.0 / self.calibration.temperature)

    def warm_start(self, X, y, P) -> None:
        self.warm_per_arm(self.policy.model, X, y)

    def act(self, x, baseline, baseline_prob) -> int:
        self._x = self.torch.from_numpy(x)
        return int(self.policy.select(self._x.expand(self.K, self.dim), int(baseline), generator=self.generator))

    def learn(self, x, action, reward) -> None:
        self.policy.update(self._x, self.torch.tensor(reward, dtype=self.torch.float64), actions=action)


class BayesSafeCLUCB(_Torch):
    """``CLUCB(BayesianLinear(N(0, 1), noise_std=0.5), baseline_reward, alpha=0.1)``.

    CLUCB takes one linear model with batch ``[1]``, not a ``PerArmLinear``, so the per-arm
    model is written as one model over block features: action ``k``'s row holds ``x`` in block
    ``k`` and zeros elsewhere (width ``K dim``; the same posterior as per-arm models). The known
    baseline reward CLUCB needs is the logistic baseline's probability of its own action;
    ``delta`` and ``weight_bound`` keep their defaults (0.001 and 1).
    """

    def __init__(self, dim, num_actions, seed):
        super().__init__(dim, num_actions, seed)
        import pyro.distributions as dist

        from bayes_safe import BayesianLinear
        from bayes_safe.policies import CLUCB

        torch = self.torch
        width = num_actions * dim
        prior = dist.Normal(torch.zeros(width, dtype=torch.float64), PRIOR_SD).to_event(1)
        model = BayesianLinear(prior, noise_std=NOISE_SD, batch_shape=[1])
        self.model = model
        self._rb = torch.zeros(1, dtype=torch.float64)
        self.policy = CLUCB(model, lambda features, baseline: self._rb, alpha=ALPHA)
        self._blocks = torch.zeros(num_actions, num_actions, dim, dtype=torch.float64)
        self._arms = torch.arange(num_actions)
        self._features = None

    def act(self, x, baseline, baseline_prob) -> int:
        self._blocks[self._arms, self._arms] = self.torch.from_numpy(x)
        self._features = self._blocks.reshape(self.K, self.K * self.dim)
        self._rb[0] = float(baseline_prob)
        return int(self.policy.select(self._features, int(baseline), generator=self.generator))

    def learn(self, x, action, reward) -> None:
        self.policy.update(self._features[action].clone(), self.torch.tensor(reward, dtype=self.torch.float64))

    def warm_start(self, X, y, P) -> None:
        """Every warm row at every action's block features, in one batched update of the linear model."""
        N, d, K = X.shape[0], self.dim, self.K
        blocks = np.zeros((N, K, K, d))
        blocks[:, np.arange(K), np.arange(K)] = X[:, None, :]
        rows = blocks.reshape(1, N * K, K * d)
        self.model.update(self.torch.from_numpy(rows), self.torch.from_numpy(one_hot(y, K).reshape(1, N * K)))


class BayesSafeResidual(_Torch):
    """``baseline_residual`` (``bayes_safe.models.baseline_residual``): per-arm features ``[x, p_k(x)]``,
    the prior mean the baseline itself (weight 1 on its probability of the arm), the residual's prior
    and noise by empirical Bayes on the warm slice (its rows, labels and the baseline's out-of-fold
    probabilities there). ``policy``: ``"ts"`` (``ThompsonSampling``) or ``"conservative"``
    (``ConservativeTS``, realised budget, checked on the calibrated posterior: ``variance_scale = 1 /
    T``, with the win check ``min_win_probability = min_win``); ``engine``: ``"torch"`` or ``"numpy"``
    (``StreamingPerArmTS`` / ``StreamingConservativeTS``, the same law of decisions). Both protocols:
    the arms start from the prior (``baseline_residual``'s default ``warm_posterior=False``, measured
    better than the warm rows' posterior; the baseline, fitted on the warm slice, carries it)."""

    uses_baseline_probs = True

    def __init__(self, dim, num_actions, seed, warm, policy="ts", engine="torch", temperature=None,
                 score_scale=0.25, min_win=None, exclusive=False, **options):
        super().__init__(dim, num_actions, seed)
        self.kind, self.engine, self.seed = policy, engine, seed
        # temperature None: baseline_residual's default (0.01 since issue 44's third round; 0.25 before)
        self.options = {"score_scale": score_scale, **options}
        if temperature is not None:
            self.options["temperature"] = temperature
        self.min_win = min_win
        self.exclusive = exclusive  # the conservative check's exclusive-rewards bound (a class label: one action pays)
        self._build(*warm)

    def _build(self, X, y, P, **override) -> None:
        from bayes_safe.models.baseline_residual import baseline_residual

        self.res = res = baseline_residual(X, P, labels=y, **{**self.options, **override})
        extra = {} if self.min_win is None else {"min_win_probability": self.min_win}
        if self.exclusive:
            extra["exclusive_rewards"] = True
        if self.engine == "numpy":
            from bayes_safe.policies import StreamingConservativeTS, StreamingPerArmTS

            self.ts = StreamingPerArmTS.from_residual(res, seed=self.seed)
            self.policy = StreamingConservativeTS(self.ts, alpha=ALPHA, **extra) if self.kind == "conservative" else None
        else:
            from bayes_safe import ThompsonSampling
            from bayes_safe.policies import ConservativeTS

            model = res.model()
            self.policy = (ConservativeTS(model, alpha=ALPHA, budget="realised", variance_scale=1.0 / res.temperature,
                                          **extra) if self.kind == "conservative" else ThompsonSampling(model))

    def warm_start(self, X, y, P) -> None:
        self._build(X, y, P, warm_posterior=self.options.get("warm_posterior", False))

    def act(self, x, baseline, baseline_prob, probs=None) -> int:
        from bayes_safe.models.baseline_residual import residual_features

        F = residual_features(x, probs)
        self._F = F
        if self.engine == "numpy":
            return self.policy.select(F, baseline) if self.kind == "conservative" else self.ts.select(F)
        self._x = self.torch.from_numpy(F)
        if self.kind == "conservative":
            return int(self.policy.select(self._x, int(baseline), generator=self.generator))
        return int(self.policy.select(self._x, generator=self.generator))

    def learn(self, x, action, reward) -> None:
        if self.engine == "numpy":
            (self.policy or self.ts).update(self._F, reward, action)
            return
        self.policy.update(self._x[action], self.torch.tensor(reward, dtype=self.torch.float64), actions=action)


class VowpalWabbit:
    """Vowpal Wabbit's ``--cb_explore_adf`` from Python: one shared line of the context, one line
    per action (``|a cK``), ``-q sa`` crosses them (a linear model per action); cost ``1 - reward``;
    the action sampled from VW's pmf with a seeded numpy generator. ``baseline_first``: the
    baseline's action is listed first (``--baseline_challenger_cb`` treats action 0 of the list
    as the baseline)."""

    def __init__(self, dim, num_actions, seed, args: str, baseline_first: bool = False):
        from vowpalwabbit import Workspace

        self.ws = Workspace(f"--cb_explore_adf -q sa --quiet --random_seed {int(seed) % 2**31} {args}")
        self.rng = np.random.default_rng(seed)
        self.K = num_actions
        self.baseline_first = baseline_first
        self.lines = [f"|a c{k}" for k in range(num_actions)]
        self._state = None

    def act(self, x, baseline, baseline_prob) -> int:
        shared = "shared |s " + " ".join(f"{j}:{v:.6g}" for j, v in enumerate(x.tolist()))
        if self.baseline_first:
            b = int(baseline)
            order = [b, *(k for k in range(self.K) if k != b)]
        else:
            order = range(self.K)
        lines = [self.lines[k] for k in order]
        pmf = np.asarray(self.ws.predict([shared, *lines]), dtype=np.float64)
        i = int(np.searchsorted(np.cumsum(pmf), self.rng.random() * pmf.sum(), side="right"))
        i = min(i, self.K - 1)
        self._state = (shared, lines, i, float(pmf[i]))
        return int(order[i]) if self.baseline_first else i

    def learn(self, x, action, reward) -> None:
        shared, lines, i, p = self._state
        labelled = list(lines)
        labelled[i] = f"0:{1.0 - reward}:{p} {lines[i]}"
        self.ws.learn([shared, *labelled])

    def warm_start(self, X, y, P) -> None:
        """Full information: every warm row once per action, that action labelled with its cost and
        probability 1 (the baseline's action first in the baseline-challenger's lists)."""
        for x, label, probs in zip(X, y.tolist(), P):
            shared = "shared |s " + " ".join(f"{j}:{v:.6g}" for j, v in enumerate(x.tolist()))
            if self.baseline_first:
                b = int(np.argmax(probs))
                order = [b, *(k for k in range(self.K) if k != b)]
            else:
                order = list(range(self.K))
            lines = [self.lines[k] for k in order]
            for i, k in enumerate(order):
                labelled = list(lines)
                labelled[i] = f"0:{0.0 if k == label else 1.0}:1 {lines[i]}"
                self.ws.learn([shared, *labelled])

    def __del__(self):
        ws = getattr(self, "ws", None)
        if ws is not None:
            ws.finish()


class BayesianBanditsTS:
    """bayesianbandits' ``ContextualAgent`` with one ``NormalRegressor`` per arm (prior precision
    ``1 / PRIOR_SD^2``, noise precision ``1 / NOISE_SD^2``: the bayes_safe TS model) and its
    ``ThompsonSampling``."""

    def __init__(self, dim, num_actions, seed):
        import bayesianbandits as bb

        rng = np.random.default_rng(seed)
        arms = [bb.Arm(k, learner=bb.NormalRegressor(alpha=1 / PRIOR_SD**2, beta=1 / NOISE_SD**2, random_state=rng))
                for k in range(num_actions)]
        self.agent = bb.ContextualAgent(arms, bb.ThompsonSampling(), random_seed=rng)

    def act(self, x, baseline, baseline_prob) -> int:
        return int(self.agent.pull(x[None])[0])

    def warm_start(self, X, y, P) -> None:
        R = one_hot(y, len(self.agent.arms))
        for k, arm in enumerate(self.agent.arms):
            arm.update(X, R[:, k])

    def learn(self, x, action, reward) -> None:
        self.agent.update(x[None], np.array([reward]))


register(LearnerSpec("greedy", GreedyRidge, "greedy: per-arm ridge, argmax of the mean (numpy)"))
register(LearnerSpec("bayes_safe TS", BayesSafeTS,
                     "bayes_safe ThompsonSampling, calibrated_per_arm on the warm slice (empirical Bayes, temperature 0.25, "
                     "exploration 'rows')",
                     requires=("torch", "pyro"), warm=True))
register(LearnerSpec("bayes_safe TS generic prior", BayesSafeTS, "bayes_safe ThompsonSampling, PerArmLinear N(0,1), noise sd 0.5",
                     requires=("torch", "pyro")))
register(LearnerSpec("bayes_safe TS streaming", BayesSafeStreamingTS,
                     "bayes_safe StreamingPerArmTS (numpy one-stream fast path), calibrated_per_arm on the warm slice",
                     requires=("torch", "pyro"), warm=True))
register(LearnerSpec("bayes_safe conservative TS streaming", BayesSafeStreamingConservativeTS,
                     "bayes_safe StreamingConservativeTS (numpy one-stream fast path of conservative TS, realised budget)",
                     requires=("torch", "pyro"), safe=True, warm=True))
# the draws before issue 44 (every arm at the fixed temperature, exploration="posterior"), on request
register(LearnerSpec("bayes_safe TS posterior draws", lambda d, k, s, warm: BayesSafeTS(d, k, s, warm, None, "posterior"),
                     "bayes_safe ThompsonSampling, calibrated_per_arm, temperature 0.25, exploration 'posterior'",
                     requires=("torch", "pyro"), warm=True, default=False))
register(LearnerSpec("bayes_safe TS streaming posterior draws",
                     lambda d, k, s, warm: BayesSafeStreamingTS(d, k, s, warm, None, "posterior"),
                     "bayes_safe StreamingPerArmTS, calibrated_per_arm, temperature 0.25, exploration 'posterior'",
                     requires=("torch", "pyro"), warm=True, default=False))
register(LearnerSpec("bayes_safe conservative TS posterior draws",
                     lambda d, k, s, warm: BayesSafeConservativeTS(d, k, s, warm, exploration="posterior"),
                     "bayes_safe ConservativeTS alpha=0.1 realised, calibrated_per_arm, exploration 'posterior'",
                     requires=("torch", "pyro"), safe=True, warm=True, default=False))
for _t in (1.0, 0.1, 0.03, 0.01):  # fixed temperatures (posterior draws, as measured before), on request
    register(LearnerSpec(f"bayes_safe TS T={_t:g}",
                         lambda d, k, s, warm, t=_t: BayesSafeTS(d, k, s, warm, t, "posterior"),
                         f"bayes_safe ThompsonSampling, calibrated_per_arm, temperature {_t:g}, exploration 'posterior'",
                         requires=("torch", "pyro"), warm=True, default=False))
    register(LearnerSpec(f"bayes_safe TS streaming T={_t:g}",
                         lambda d, k, s, warm, t=_t: BayesSafeStreamingTS(d, k, s, warm, t, "posterior"),
                         f"bayes_safe StreamingPerArmTS, calibrated_per_arm, temperature {_t:g}, exploration 'posterior'",
                         requires=("torch", "pyro"), warm=True, default=False))
register(LearnerSpec("bayes_safe TS-ASC", BayesSafeTSASC,
                     "bayes_safe TSASC alpha=0.1, guard = per-arm reward model vs the baseline action",
                     requires=("torch", "pyro"), safe=True))
register(LearnerSpec("bayes_safe conservative TS", BayesSafeConservativeTS,
                     "bayes_safe ConservativeTS alpha=0.1 (confidence 0.95), realised budget, calibrated_per_arm on the warm slice",
                     requires=("torch", "pyro"), safe=True, warm=True))
register(LearnerSpec("bayes_safe conservative TS expected", lambda d, k, s, warm: BayesSafeConservativeTS(d, k, s, warm, "expected"),
                     "bayes_safe ConservativeTS alpha=0.1, budget on expected rewards, calibrated_per_arm",
                     requires=("torch", "pyro"), safe=True, warm=True, default=False))
RESIDUAL_MIN_WIN = 0.5  # the win check of the residual conservative learners (a priori: no worse than even odds)
# the bake-off's reward is a class label (one action pays 1): the conservative check's exclusive-rewards bound
RESIDUAL_EXCLUSIVE = True
for _kind, _engine, _label in (("ts", "torch", "residual TS"), ("ts", "numpy", "residual TS streaming"),
                                ("conservative", "torch", "residual conservative TS"),
                                ("conservative", "numpy", "residual conservative TS streaming")):
    _win = RESIDUAL_MIN_WIN if _kind == "conservative" else None
    _exc = RESIDUAL_EXCLUSIVE and _kind == "conservative"
    register(LearnerSpec(f"bayes_safe {_label}",
                         lambda d, k, s, warm, p=_kind, e=_engine, q=_win, x=_exc: BayesSafeResidual(
                             d, k, s, warm, p, e, min_win=q, exclusive=x),
                         f"bayes_safe {'ConservativeTS alpha=0.1 realised, exclusive rewards, win check 0.5' if _kind == 'conservative' else 'ThompsonSampling'}"
                         f" ({_engine}) on baseline_residual: per-arm features [x, p_k(x)], prior mean the baseline",
                         requires=("torch", "pyro"), safe=_kind == "conservative", warm=True, probs=True))
for _t in (0.25, 0.1, 0.03, 0.01):  # residual TS at set temperatures (0.25: the default before), on request
    for _engine, _suffix in (("torch", ""), ("numpy", " streaming")):
        register(LearnerSpec(f"bayes_safe residual TS{_suffix} T={_t:g}",
                             lambda d, k, s, warm, t=_t, e=_engine: BayesSafeResidual(d, k, s, warm, "ts", e, temperature=t),
                             f"bayes_safe ThompsonSampling ({_engine}) on baseline_residual, temperature {_t:g}",
                             requires=("torch", "pyro"), warm=True, probs=True, default=False))
for _t in (0.25, 0.03, 0.01):  # the safe residual learner at set temperatures (0.25: the default before), on request
    for _engine, _suffix in (("torch", ""), ("numpy", " streaming")):
        register(LearnerSpec(f"bayes_safe residual conservative TS{_suffix} T={_t:g}",
                             lambda d, k, s, warm, t=_t, e=_engine: BayesSafeResidual(
                                 d, k, s, warm, "conservative", e, temperature=t, min_win=RESIDUAL_MIN_WIN,
                                 exclusive=RESIDUAL_EXCLUSIVE),
                             f"bayes_safe residual conservative TS ({_engine}, exclusive, win check 0.5), temperature {_t:g}",
                             requires=("torch", "pyro"), safe=True, warm=True, probs=True, default=False))
_RESIDUAL_VARIANTS = {  # the measured alternatives (issue 44), on request
    "no win check": {"min_win": None},
    "warm posterior": {"warm_posterior": True},
    "residual scale": {"scale_from": "residuals"},
    "model bound": {"exclusive": False},   # the deviations' term by the model and the success rate (before issue 44's fix)
}
for _variant, _opts in _RESIDUAL_VARIANTS.items():
    for _engine, _suffix in (("numpy", " streaming"), ("torch", "")) if _variant == "model bound" else (("numpy", " streaming"),):
        register(LearnerSpec(f"bayes_safe residual conservative TS{_suffix} {_variant}",
                             lambda d, k, s, warm, o=_opts, e=_engine: BayesSafeResidual(
                                 d, k, s, warm, "conservative", e,
                                 **{"min_win": RESIDUAL_MIN_WIN, "exclusive": RESIDUAL_EXCLUSIVE, **o}),
                             f"bayes_safe residual conservative TS{_suffix}, {_variant}", requires=("torch", "pyro"),
                             safe=True, warm=True, probs=True, default=False))
register(LearnerSpec("bayes_safe CLUCB", BayesSafeCLUCB,
                     "bayes_safe CLUCB alpha=0.1, block-per-arm BayesianLinear, known baseline reward = its probability",
                     requires=("torch", "pyro"), safe=True))
_VW_CONFIGS = {  # Bietti et al. 2021's best configurations of each method family
    "VW epsilon": "--epsilon 0.02",
    "VW squarecb": "--squarecb --gamma_scale 10",
    "VW regcbopt": "--regcbopt --mellowness 0.01",
    "VW bag": "--bag 4 --greedify",
}
for _name, _args in _VW_CONFIGS.items():
    register(LearnerSpec(_name, lambda d, k, s, a=_args: VowpalWabbit(d, k, s, a),
                         f"vowpalwabbit --cb_explore_adf {_args}", requires=("vowpalwabbit",)))
register(LearnerSpec("VW baseline-challenger",
                     lambda d, k, s: VowpalWabbit(d, k, s, "--epsilon 0.02 --baseline_challenger_cb", baseline_first=True),
                     "vowpalwabbit --cb_explore_adf --epsilon 0.02 --baseline_challenger_cb (baseline listed first)",
                     requires=("vowpalwabbit",), safe=True))
register(LearnerSpec("bayesianbandits TS", BayesianBanditsTS,
                     "bayesianbandits ContextualAgent, NormalRegressor per arm, ThompsonSampling",
                     requires=("bayesianbandits",)))


def learner_name(name: str) -> str | None:
    """The registry name ``name`` stands for: case, spaces, hyphens and underscores do not matter
    (``--learners bayes_safe-ts,vw-regcbopt``); None if none matches."""

    def key(n: str) -> str:
        return "".join(ch for ch in n.lower() if ch not in " -_")

    matches = [n for n in LEARNERS if key(n) == key(name)]
    return matches[0] if matches else None


def available(names: Sequence[str]) -> list[LearnerSpec]:
    """The registry entries named, less those whose packages do not import (a printed line each)."""
    import importlib

    out = []
    for name in names:
        spec = LEARNERS[name]
        missing = []
        for pkg in spec.requires:
            try:
                importlib.import_module(pkg)
            except Exception as exc:  # noqa: BLE001 - an extension that fails to load counts as missing
                missing.append(f"{pkg} ({type(exc).__name__})")
        if missing:
            print(f"left out: {name} (not installed or fails to import: {', '.join(missing)})")
        else:
            out.append(spec)
    return out


# ------------------------------------------------------------------------------------ metrics
def pv_loss(rewards: np.ndarray) -> float:
    """Progressive-validation loss: the mean of ``1 - reward`` over the scored stream."""
    return float(1.0 - np.mean(rewards))


def budget_violations(learner_rewards, baseline_rewards, alpha: float = ALPHA) -> np.ndarray:
    """Per step ``t``: ``L_t < (1 - alpha) B_t`` on the cumulative rewards (bool ``[T]``)."""
    L = np.cumsum(np.asarray(learner_rewards, dtype=np.float64))
    B = np.cumsum(np.asarray(baseline_rewards, dtype=np.float64))
    return L < (1.0 - alpha) * B - 1e-9


def violation_rate(learner_rewards, baseline_rewards, alpha: float = ALPHA) -> float:
    """Fraction of the scored steps at which the budget is broken."""
    return float(np.mean(budget_violations(learner_rewards, baseline_rewards, alpha)))


def first_overtake(learner_rewards, baseline_rewards) -> int | None:
    """The first step ``t`` (1-based) with ``L_t > B_t``; None if the learner never overtakes."""
    ahead = np.cumsum(learner_rewards) > np.cumsum(baseline_rewards) + 1e-9
    return int(np.argmax(ahead)) + 1 if ahead.any() else None


@dataclass
class Result:
    learner: str
    dataset: str
    shuffle: int
    steps: int
    pv: float
    baseline_pv: float
    violation: float
    overtake: int | None
    seconds: float


def run_stream(learner, stream: Stream) -> tuple[np.ndarray, float]:
    """One learner over one stream: its rewards ``[T]`` and the seconds of its act + learn calls."""
    T = len(stream.y)
    rewards = np.zeros(T)
    X, y, b, pb = stream.X, stream.y, stream.baseline.tolist(), stream.baseline_prob.tolist()
    labels = y.tolist()
    probs = stream.baseline_probs if getattr(learner, "uses_baseline_probs", False) else None
    clock = time.perf_counter
    spent = 0.0
    for t in range(T):
        x = X[t]
        t0 = clock()
        a = learner.act(x, b[t], pb[t]) if probs is None else learner.act(x, b[t], pb[t], probs[t])
        t1 = clock()
        r = 1.0 if a == labels[t] else 0.0
        t2 = clock()
        learner.learn(x, a, r)
        spent += (t1 - t0) + (clock() - t2)
        rewards[t] = r
    return rewards, spent


PROTOCOLS = ("cold", "warm")


def evaluate(spec: LearnerSpec, stream: Stream, seed: int, protocol: str = "cold") -> Result:
    """One learner on one stream. ``protocol``: ``"cold"`` (learners start with no data; ``warm=True``
    ones take hyperparameters from the warm slice) or ``"warm"`` (every learner's model also learns the
    warm slice with full information, ``learner.warm_start(X_warm, y_warm, P_warm)``, before the stream;
    a learner without ``warm_start`` is refused)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol: expected one of {PROTOCOLS}, got {protocol!r}")
    lseed = int(np.random.default_rng([*stream_seed(seed, stream.dataset, stream.shuffle),
                                       zlib.crc32(spec.name.encode())]).integers(2**31 - 1))
    if spec.warm:
        warm = (stream.warm_X, stream.warm_y) + ((stream.warm_probs,) if spec.probs else ())
        learner = spec.make(stream.X.shape[1], stream.num_actions, lseed, warm=warm)
    else:
        learner = spec.make(stream.X.shape[1], stream.num_actions, lseed)
    if protocol == "warm":
        if not hasattr(learner, "warm_start"):
            raise TypeError(f"learner {spec.name!r} has no warm_start(X, y, P): it cannot run in the warm protocol")
        learner.warm_start(stream.warm_X, stream.warm_y, stream.warm_probs)
    rewards, seconds = run_stream(learner, stream)
    base = stream.baseline_rewards
    return Result(spec.name, stream.dataset, stream.shuffle, len(rewards), pv_loss(rewards), pv_loss(base),
                  violation_rate(rewards, base), first_overtake(rewards, base), seconds)


def sign_tests(results: Sequence[Result]) -> dict[tuple[str, str], tuple[int, int, float]]:
    """For each ordered pair (A, B): (wins of A, wins of B, two-sided sign-test p) over the streams."""
    from scipy.stats import binomtest

    pv: dict[str, dict[tuple[str, int], float]] = {}
    for r in results:
        pv.setdefault(r.learner, {})[(r.dataset, r.shuffle)] = r.pv
    names = list(pv)
    out = {}
    for a in names:
        for b in names:
            if a == b:
                continue
            keys = pv[a].keys() & pv[b].keys()
            wins = sum(pv[a][k] < pv[b][k] for k in keys)
            losses = sum(pv[a][k] > pv[b][k] for k in keys)
            p = binomtest(wins, wins + losses, 0.5).pvalue if wins + losses else 1.0
            out[(a, b)] = (wins, losses, float(p))
    return out


# ------------------------------------------------------------------------------------ tables
@dataclass
class Row:
    learner: str
    pv: float
    baseline_pv: float
    ratio: float
    violation: float
    overtake: str
    rate: float
    streams: int = 0
    extra: dict = field(default_factory=dict)


def _ratio(pv: float, base: float) -> float:
    return pv / base if base > 0 else float("nan")


def dataset_rows(results: Sequence[Result], dataset: str) -> list[Row]:
    rows = []
    for name in dict.fromkeys(r.learner for r in results):
        rs = [r for r in results if r.learner == name and r.dataset == dataset]
        if not rs:
            continue
        pv, base = statistics.fmean(r.pv for r in rs), statistics.fmean(r.baseline_pv for r in rs)
        steps = [r.overtake if r.overtake is not None else math.inf for r in rs]
        med = statistics.median(steps)
        overtake = "never" if math.isinf(med) else f"{med:g}"
        rate = sum(r.steps for r in rs) / max(sum(r.seconds for r in rs), 1e-12)
        rows.append(Row(name, pv, base, _ratio(pv, base), statistics.fmean(r.violation for r in rs), overtake, rate,
                        len(rs)))
    return rows


def summary_rows(results: Sequence[Result]) -> list[Row]:
    datasets = list(dict.fromkeys(r.dataset for r in results))
    rows = []
    for name in dict.fromkeys(r.learner for r in results):
        per = [row for d in datasets for row in dataset_rows([r for r in results if r.learner == name], d)]
        rs = [r for r in results if r.learner == name]
        ratios = [row.ratio for row in per if not math.isnan(row.ratio)]
        over = [r.overtake / r.steps for r in rs if r.overtake is not None]
        overtake = f"{len(over)}/{len(rs)}" + (f" @ {statistics.median(over):.0%}" if over else "")
        rate = sum(r.steps for r in rs) / max(sum(r.seconds for r in rs), 1e-12)
        rows.append(Row(name, statistics.fmean(row.pv for row in per), statistics.fmean(row.baseline_pv for row in per),
                        statistics.fmean(ratios) if ratios else float("nan"),
                        statistics.fmean(row.violation for row in per), overtake, rate, len(rs)))
    return rows


def markdown_table(rows: Sequence[Row], overtake_header: str = "overtakes at (median step)") -> str:
    lines = [f"| learner | PV loss | baseline PV loss | ratio | budget violation rate | {overtake_header} | decisions/s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.learner} | {r.pv:.4f} | {r.baseline_pv:.4f} | {r.ratio:.2f} | {r.violation:.3f} | "
                     f"{r.overtake} | {r.rate:,.0f} |")
    return "\n".join(lines)


def sign_table(results: Sequence[Result]) -> str:
    tests = sign_tests(results)
    names = list(dict.fromkeys(r.learner for r in results))
    short = {n: f"({i + 1})" for i, n in enumerate(names)}
    lines = ["| A \\ B | " + " | ".join(short[n] for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for a in names:
        cells = []
        for b in names:
            if a == b:
                cells.append("-")
                continue
            w, losses, p = tests[(a, b)]
            cells.append(f"{w}-{losses}{'*' if p < 0.05 else ''}")
        lines.append(f"| {short[a]} {a} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def load_average() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def render(results: Sequence[Result], *, command: str, load_start: str, load_end: str, shuffles: int,
           max_rows: int | None, wall: float, datasets: Sequence[Dataset]) -> str:
    parts = ["## Summary (averaged over data sets)", "",
             markdown_table(summary_rows(results), "overtakes the baseline: streams @ median position"), ""]
    parts += ["## Pairwise wins (PV loss, over every data set x shuffle stream)", "",
              ("Cell: wins of the row's learner - wins of the column's (ties dropped); `*`: two-sided sign test "
              "p < 0.05 (`scipy.stats.binomtest`)."), "", sign_table(results), ""]
    parts += ["## Per data set", ""]
    for ds in datasets:
        rows = dataset_rows(results, ds.name)
        if not rows:
            continue
        T = next(r.steps for r in results if r.dataset == ds.name)
        parts += [(f"### {ds.name} (n = {len(ds.y) if max_rows is None else min(max_rows, len(ds.y))}, "
                  f"{ds.X.shape[1]} features, {ds.num_classes} actions, {T} scored steps per stream)"), "",
                  markdown_table(rows), ""]
    head = [f"Command: `{command}`", "",
            f"Load average (1, 5, 15 min) at start: {load_start}; at end: {load_end}. "
            f"{shuffles} shuffle{'s' if shuffles != 1 else ''} per data set" + (f", streams cut to {max_rows} rows" if max_rows else "") +
            f"; wall time {wall / 60:.1f} min; {_git_state()}; Python {platform.python_version()}, {_versions()}.", ""]
    return "\n".join(head + parts)


def _git_state() -> str:
    """The commit measured, and whether bayes_safe/ had uncommitted changes (files changed)."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "bayes_safe"], cwd=root, capture_output=True,
                               text=True, timeout=10, check=True).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return "commit unknown"
    changed = [line for line in dirty if line.strip()]
    return f"commit {head}" + (f" with {len(changed)} uncommitted file(s) under bayes_safe/" if changed else "")


def _versions() -> str:
    import importlib.metadata as md

    out = []
    for pkg in ("torch", "scikit-learn", "vowpalwabbit", "river", "bayesianbandits"):
        try:
            out.append(f"{pkg} {md.version(pkg)}")
        except md.PackageNotFoundError:
            pass
    return ", ".join(out)


# ------------------------------------------------------------------------------------ main
def run(dataset_names: Sequence[str], learner_specs: Sequence[LearnerSpec], shuffles: int, seed: int,
        max_rows: int | None = None, log=print, protocol: str = "cold",
        warm_fraction: float = WARM_FRACTION) -> tuple[list[Result], list[Dataset]]:
    results, datasets = [], []
    for name in dataset_names:
        try:
            ds = DATASETS[name]()
        except ImportError as exc:
            print(f"left out: data set {name} (its package is not installed: {exc.name or exc})")
            continue
        datasets.append(ds)
        for s in range(shuffles):
            stream = make_stream(ds, s, seed, max_rows, warm_fraction)
            for spec in learner_specs:
                res = evaluate(spec, stream, seed, protocol)
                results.append(res)
                log(f"  {name:14s} shuffle {s}  {spec.name:24s} PV {res.pv:.3f} (baseline {res.baseline_pv:.3f}) "
                    f"violations {res.violation:.3f}  {res.steps / max(res.seconds, 1e-12):,.0f}/s")
    return results, datasets


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SHUFFLES} shuffles, streams cut to {QUICK_MAX_ROWS} rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shuffles", type=int, default=None, help=f"random orders per data set (default {FULL_SHUFFLES})")
    parser.add_argument("--max-rows", type=int, default=None, help="cut every shuffled stream to this many rows")
    parser.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated, from: " + ", ".join(DATASETS))
    parser.add_argument("--learners", default=None,
                        help="comma-separated registry names, case/space/-/_ insensitive (default: all): " + ", ".join(LEARNERS))
    parser.add_argument("--report", default=None, help="write the markdown report here")
    parser.add_argument("--quiet", action="store_true", help="no line per stream")
    parser.add_argument("--protocol", choices=[*PROTOCOLS, "both"], default="cold",
                        help="cold (default): learners start with no data, calibrated ones take hyperparameters from "
                             "the warm slice; warm: every learner's model also learns the warm slice with full "
                             "information; both: the two, one after the other")
    parser.add_argument("--warm-fraction", type=float, default=WARM_FRACTION,
                        help=f"the warm slice's share of each stream (default {WARM_FRACTION}; larger: a stronger "
                             "baseline, fitted on more rows)")
    args = parser.parse_args(argv)
    if not 0 < args.warm_fraction < 1:
        parser.error(f"--warm-fraction: expected a number in (0, 1), got {args.warm_fraction}")

    import torch

    torch.set_num_threads(1)
    names = [d.strip() for d in args.datasets.split(",") if d.strip()]
    unknown = [d for d in names if d not in DATASETS]
    if unknown:
        parser.error(f"--datasets: unknown {unknown}; choose from {list(DATASETS)}")
    if args.learners:
        asked = [n.strip() for n in args.learners.split(",") if n.strip()]
        bad = [n for n in asked if learner_name(n) is None]
        if bad:
            parser.error(f"--learners: unknown {bad}; choose from {list(LEARNERS)}")
        wanted = [learner_name(n) for n in asked]
    else:
        wanted = [s.name for s in LEARNERS.values() if s.default]
    shuffles = args.shuffles if args.shuffles is not None else (QUICK_SHUFFLES if args.quick else FULL_SHUFFLES)
    max_rows = args.max_rows if args.max_rows is not None else (QUICK_MAX_ROWS if args.quick else None)
    specs = available(wanted)
    try:
        python = os.path.relpath(sys.executable)
    except ValueError:  # another drive (Windows)
        python = sys.executable
    command = " ".join([python, "benchmarks/bakeoff.py", *(argv if argv is not None else sys.argv[1:])])
    texts = []
    for protocol in (PROTOCOLS if args.protocol == "both" else (args.protocol,)):
        load_start = load_average()
        print(f"bake-off, {protocol} protocol (warm slice {args.warm_fraction:g} of each stream): {len(names)} data sets "
              f"x {shuffles} shuffles, {len(specs)} learners; load average {load_start}")
        t0 = time.perf_counter()
        results, datasets = run(names, specs, shuffles, args.seed, max_rows,
                                log=(lambda *a: None) if args.quiet else print, protocol=protocol,
                                warm_fraction=args.warm_fraction)
        text = render(results, command=command, load_start=load_start, load_end=load_average(), shuffles=shuffles,
                      max_rows=max_rows, wall=time.perf_counter() - t0, datasets=datasets)
        texts.append(f"# Protocol: {protocol} (warm slice: {args.warm_fraction:g} of each stream)\n\n{text}")
        print()
        print(texts[-1])
    if args.report:
        with open(args.report, "w") as fh:
            fh.write("# Safe bake-off: measured run\n\n" + "\n\n".join(texts) + "\n")
        print(f"\nreport written to {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
