"""``simulate``'s lean Thompson path (issue 20): the scores of large batches in chunks of
multiply-and-sum, with the numbers of the general path and of one-replication runs.

The problems are written here. The general path is taken by a ``ThompsonSampling`` subclass
(``policy.select`` / ``policy.update``, scores by the batched matmul of ``sample_at``).
"""

from __future__ import annotations

import pyro.distributions as dist
import pytest
import torch

from bayes_safe import BayesianLinear, ThompsonSampling, simulate
from bayes_safe.envs import Problem, Units
from bayes_safe.models import linear
from bayes_safe.random import replication_seeds, standard_normal
from bayes_safe.simulation import TRACE_FIELDS


class Arms(Problem):
    """``K`` fixed arms in ``R^d`` per replication, one reward, Gaussian noise (sd 0.5)."""

    name = "arms"
    metric_names = ("reward",)
    replication_streams = True

    def __init__(self, features: torch.Tensor, theta: torch.Tensor):
        self.features, self.theta = features, theta  # [R, K, d], [R, d]
        self.replications = features.shape[0]
        self.means = (features * theta[:, None, :]).sum(-1, keepdim=True)  # [R, K, 1]
        self.base = torch.zeros(self.replications, dtype=torch.long)

    @classmethod
    def random(cls, R: int, K: int, d: int, seed: int = 0) -> Arms:
        g = torch.Generator().manual_seed(seed)
        return cls(torch.randn(R, K, d, generator=g, dtype=torch.float64), torch.randn(R, d, generator=g, dtype=torch.float64))

    def replication(self, r: int) -> Arms:
        return Arms(self.features[r:r + 1], self.theta[r:r + 1])

    def draw(self, n, generator):
        return Units(self.features, self.base, context=standard_normal((n, 1), generator, key="env/noise"))

    def outcomes(self, units, actions):
        return self.means[torch.arange(self.replications), actions] + 0.5 * units.context

    def expected_all(self, units):
        return self.means


class GeneralTS(ThompsonSampling):
    """A subclass: ``simulate`` takes the general path (``select`` / ``update``)."""


def _ts(R: int, d: int, cls=ThompsonSampling):
    prior = dist.Normal(torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64)).expand([d]).to_event(1)
    return cls(BayesianLinear(prior, noise_std=0.5, batch_shape=[R]))


@pytest.fixture
def chunk_sizes(monkeypatch):
    """Spy on the lean steps' set-up: the chunk size each run chose (0: the matmul)."""
    seen = []
    setup = linear._ThompsonStep._setup

    def spy(self, features_t):
        setup(self, features_t)
        seen.append(self.chunk)

    monkeypatch.setattr(linear._ThompsonStep, "_setup", spy)
    return seen


def _assert_same_traces(got, want):
    for f in TRACE_FIELDS:
        assert torch.equal(getattr(got, f), getattr(want, f)), f


def test_streamed_scores_give_the_general_paths_numbers(monkeypatch, chunk_sizes):
    # every block streamed, in chunks of 2 replications: R = 5 ends on a partial chunk
    R, K, d = 5, 7, 3
    monkeypatch.setattr(linear, "_STREAMED_SCORES_BYTES", 0)
    monkeypatch.setattr(linear, "_STREAMED_CHUNK_NUMBERS", 2 * K * d)
    problem = Arms.random(R, K, d, seed=1)
    lean = simulate(_ts(R, d), problem, 80, seed=3)
    general = simulate(_ts(R, d, GeneralTS), problem, 80, seed=3)
    exact = linear._streamed_scores_exact(K, d)
    assert chunk_sizes == [2 if exact else 0]  # streamed wherever it gives the matmul's bits
    _assert_same_traces(lean, general)


def test_at_scale_the_lean_path_equals_the_general_path_and_single_runs(chunk_sizes):
    # 6,000 x 100 x 4 float64 features: 18 MiB, above the streaming threshold
    R, K, d, T = 6_000, 100, 4, 5
    assert R * K * d * 8 > linear._STREAMED_SCORES_BYTES
    problem = Arms.random(R, K, d, seed=7)
    lean = simulate(_ts(R, d), problem, T, seed=11)
    assert chunk_sizes == [linear._STREAMED_CHUNK_NUMBERS // (K * d) if linear._streamed_scores_exact(K, d) else 0]
    _assert_same_traces(lean, simulate(_ts(R, d, GeneralTS), problem, T, seed=11))
    seeds = replication_seeds(11, R)
    for r in (0, 2_999, R - 1):
        alone = simulate(_ts(1, d), problem.replication(r), T, seed=[seeds[r]])
        _assert_same_traces(alone, lean.replication(r))


def test_transposed_features_follow_in_place_changes_and_die_with_their_features():
    import gc
    import weakref

    model = _ts(2, 3).model
    features = torch.randn(2, 4, 3, dtype=torch.float64)
    g = torch.Generator()
    first = model.sample_at(features, g.manual_seed(0))
    features[:, 1] += 10.0  # the user changes the candidates in place: not served the stale copy
    changed = model.sample_at(features, g.manual_seed(0))
    assert torch.equal(changed, model.sample_at(features.clone(), g.manual_seed(0)))
    assert not torch.equal(changed, first)
    copy = weakref.ref(linear._transposed(features))
    assert copy() is not None
    del features
    gc.collect()
    assert copy() is None  # the cache held the features weakly: their copy went with them


def test_a_run_keeps_no_copy_of_its_features_after_it_returns():
    problem = Arms.random(3, 5, 2, seed=0)
    before = dict(linear._transposed.entries)
    simulate(_ts(3, 2), problem, 4, seed=0)
    assert linear._transposed.entries == before  # the lean path transposed into its own cache
