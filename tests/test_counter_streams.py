"""Counter-based random streams and counter-built problems (issue 46): what a GPU run relies on,
checked on the CPU.

``CounterRNG`` computes each replication's numbers from ``(seed, stream, counter)`` with 64-bit integer
arithmetic on the device where they are used; ``instances="counter"`` builds a million problem
instances at once the same way. A user relies on: the hash being the documented one (integer products
wrap modulo 2^64 on every device, so the CPU and a GPU compute the same words); replication ``r`` of a
batch being its run alone; the numbers having the law claimed (normal, uniform; unrelated streams for
related seeds); the counter-built problems having the law of the per-replication ones; the device's
Cholesky path repairing what the CPU's repairs and raising what it cannot; and clear errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from bayes_safe import ThompsonSampling, simulate
from bayes_safe.envs import daulton2019, kazerouni2017, kazerouni2017_neurips
from bayes_safe.factory import make_policy
from bayes_safe.models import _gaussian
from bayes_safe.random import (
    CounterRNG,
    ReplicationRNG,
    _hash_words,
    _signed,
    counter_normal,
    replication_seeds,
)

M64 = (1 << 64) - 1


def _splitmix_final(x: int) -> int:
    """SplitMix64's output function in Python's exact integers (the reference)."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def test_the_hash_is_splitmix64_modulo_2_64():
    """torch's int64 products must wrap as unsigned 64-bit arithmetic does: the words equal a Python
    reference on keys and counters that overflow (the top bit set included)."""
    rng = np.random.default_rng(7)
    keys = [int(k) for k in rng.integers(0, 2**63, 6)] + [M64, 1 << 63, 0]
    counters = [0, 1, 3, 2**40 + 17, M64 - 5, (1 << 63) + 11]
    want = [[_signed(_splitmix_final(_splitmix_final((k + c) & M64) ^ k)) for c in counters] for k in keys]
    got = _hash_words(torch.tensor([[_signed(k)] for k in keys]), torch.tensor([[_signed(c) for c in counters]]))
    assert got.tolist() == want


def test_a_replication_of_a_batch_is_its_stream_alone():
    seeds = replication_seeds(3, 6)
    batch = CounterRNG(seeds)
    draws = [batch.normal((4,), key="w") for _ in range(3)] + [batch.uniform((2, 3), key="u")]
    for r in (0, 4):
        alone = CounterRNG([seeds[r]])
        mine = [alone.normal((4,), key="w") for _ in range(3)] + [alone.uniform((2, 3), key="u")]
        for a, b in zip(draws, mine):
            assert torch.equal(a[r], b[0])
    # successive draws, other keys, other shapes and other seeds are other numbers
    again = CounterRNG(seeds)
    first = again.normal((4,), key="w")
    assert torch.equal(first, draws[0]) and not torch.equal(draws[0], draws[1])
    assert not torch.equal(first, CounterRNG(seeds).normal((4,), key="v"))
    assert not torch.equal(first[:, :1], CounterRNG(seeds).normal((1,), key="w"))
    assert draws[0].dtype == torch.float64 and CounterRNG(seeds).normal((2,), dtype=torch.float32).dtype == torch.float32


@pytest.mark.parametrize("seeds", ["spawned", "consecutive"])
def test_the_numbers_have_the_law_claimed(seeds):
    """Normal and uniform by Kolmogorov-Smirnov on 40,000 numbers; replications of consecutive integer
    seeds (0, 1, 2, ...: related keys) uncorrelated; the first and second moments."""
    R = 200
    seed_list = replication_seeds(0, R) if seeds == "spawned" else list(range(R))
    rng = CounterRNG(seed_list)
    z = rng.normal((200,), key="z").reshape(-1).numpy()
    u = rng.uniform((200,), key="u").reshape(-1).numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    assert abs(z.mean()) < 5 / math.sqrt(z.size) and abs(z.var() - 1) < 5 * math.sqrt(2 / z.size)
    assert u.min() >= 0 and u.max() < 1
    # replication r against r + 1 over 400 draws of one stream: correlations within 5 standard errors
    steps = torch.stack([rng.normal((), key="s") for _ in range(400)])  # [400, R]
    corr = torch.corrcoef(steps.T)
    neighbours = corr.diagonal(offset=1)
    assert neighbours.abs().max() < 5 / math.sqrt(400), float(neighbours.abs().max())
    assert abs(float(neighbours.mean())) < 5 / math.sqrt(400 * (R - 1))


def test_simulate_with_counter_streams_keeps_replications_separable():
    """``simulate(..., generator=CounterRNG(...))`` on a counter-built problem: replication ``r`` of the
    batch is the one-replication run of its seed (what a GPU run gives by default)."""
    seeds = replication_seeds(11, 4)
    env = kazerouni2017_neurips(4, seed=seeds, num_arms=12, baseline_rank=3, instances="counter")
    trace = simulate(make_policy("ts", env), env, 25, generator=CounterRNG(seeds), progress=False)
    one = kazerouni2017_neurips(1, seed=[seeds[2]], num_arms=12, baseline_rank=3, instances="counter")
    alone = simulate(make_policy("ts", one), one, 25, generator=CounterRNG([seeds[2]]), progress=False)
    assert torch.equal(trace.actions[:, 2], alone.actions[:, 0])
    assert torch.allclose(trace.regret[:, 2], alone.regret[:, 0], rtol=0, atol=1e-12)
    # and TS-ASC on the two-metric problem, the same promise
    env = daulton2019(4, seed=seeds, instances="counter")
    trace = simulate(make_policy("ts-asc", env, alpha=0.1), env, 15, generator=CounterRNG(seeds), progress=False)
    one = daulton2019(1, seed=[seeds[1]], instances="counter")
    alone = simulate(make_policy("ts-asc", one, alpha=0.1), one, 15, generator=CounterRNG([seeds[1]]), progress=False)
    assert torch.equal(trace.actions[:, 1], alone.actions[:, 0])


def _ks(a: torch.Tensor, b: torch.Tensor) -> float:
    return stats.ks_2samp(a.reshape(-1).numpy(), b.reshape(-1).numpy()).pvalue


def test_counter_instances_have_the_law_of_the_default_ones():
    """The counter-built problems against the per-replication ones (different numbers, the same law):
    the optimal, baseline and per-arm mean rewards by two-sample Kolmogorov-Smirnov; every arm's mean
    reward positive as the papers require (the reflection draws the half-space law exactly)."""
    counter, default = (kazerouni2017_neurips(1500, seed=5, instances=i) for i in ("counter", "generator"))
    for name in ("optimal_reward", "baseline_expected"):
        assert _ks(getattr(counter, name)[..., 0] if name == "baseline_expected" else getattr(counter, name),
                   getattr(default, name)[..., 0] if name == "baseline_expected" else getattr(default, name)) > 1e-3, name
    # one number per instance (the arms of an instance share its parameter: pooled, they are not independent)
    assert _ks(counter.expected[:, 0, 0], default.expected[:, 0, 0]) > 1e-3
    assert _ks(counter.expected[..., 0].mean(-1), default.expected[..., 0].mean(-1)) > 1e-3
    assert bool((counter.expected > 0).all())
    counter, default = (kazerouni2017(600, seed=5, num_arms=20, dim=4, instances=i) for i in ("counter", "generator"))
    assert _ks(counter.expected[:, 0, 0], default.expected[:, 0, 0]) > 1e-3
    assert _ks(counter.baseline_expected, default.baseline_expected) > 1e-3
    assert bool((counter.expected[:, :-1] > 0).all())
    assert bool((counter.arm_features[:, :-1].abs() <= 1).all())


def test_counter_daulton2019_has_the_law_of_the_default_one():
    counter = daulton2019(1200, seed=2, num_arms=30, top_reward=10, baseline_rank=5, instances="counter")
    default = daulton2019(300, seed=2, num_arms=30, top_reward=10, baseline_rank=5)
    assert bool((counter.expected > 0).all())  # both metrics of every arm positive
    for m in (0, 1):  # one number per instance: arm 0's mean, the mean over arms, the baseline's
        assert _ks(counter.expected[:, 0, m], default.expected[:, 0, m]) > 1e-3, m
        assert _ks(counter.expected[..., m].mean(-1), default.expected[..., m].mean(-1)) > 1e-3, m
        assert _ks(counter.baseline_expected[:, m], default.baseline_expected[:, m]) > 1e-3, m
    cosine = torch.nn.functional.cosine_similarity
    assert _ks(cosine(counter.parameters[:, 0], counter.parameters[:, 1], dim=-1),
               cosine(default.parameters[:, 0], default.parameters[:, 1], dim=-1)) > 1e-3
    assert _ks(counter.optimal_reward, default.optimal_reward) > 1e-3
    # the instance-level condition holds for every replication: the constraint costs reward
    feasible = counter.feasible
    best_in = counter.expected[..., 0].masked_fill(~feasible, -math.inf).amax(-1)
    best_out = counter.expected[..., 0].masked_fill(feasible, -math.inf).amax(-1)
    assert bool((best_in < best_out).all())


def test_the_wedge_draw_is_the_rejection_law():
    """Arms in the intersection of two half-spaces, drawn in polar form in the parameters' plane, against
    plain rejection of ``N(0, I)`` draws (numpy) for a pair of parameters at 150 degrees (acceptance 1/6)."""
    from bayes_safe.envs.linear import _wedge_arms

    d, n = 4, 6000
    a = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    b = torch.tensor([math.cos(math.radians(150)), math.sin(math.radians(150)), 0.0, 0.0], dtype=torch.float64)
    theta = torch.stack([a, b * 2.0])[None]  # [1, 2, d]; the scale of a parameter does not matter
    arms = _wedge_arms(torch.tensor([_signed(12345)]), 0, n, d, theta)[0]  # [n, d]
    assert bool(((arms @ theta[0].T) > 0).all())
    draws = np.random.default_rng(0).standard_normal((20 * n, d))
    keep = draws[(draws @ theta[0].T.numpy() > 0).all(1)]
    for direction in (a, b, torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=torch.float64),
                      torch.tensor([0.5, 0.5, 0.5, 0.5], dtype=torch.float64)):
        p = stats.ks_2samp((arms @ direction).numpy(), keep @ direction.numpy()).pvalue
        assert p > 1e-3, (direction, p)


def test_counter_instances_are_refused_clearly():
    with pytest.raises(ValueError, match=r"instances: expected one of \['generator', 'counter'\]"):
        kazerouni2017_neurips(2, instances="fast")
    with pytest.raises(ValueError, match=r"dim: instances='counter' .* needs dim >= 2"):
        daulton2019(2, dim=1, instances="counter")


def test_the_device_factor_repairs_and_raises_as_the_cpu_path_does():
    """``_device_cholesky`` (the path off the CPU, run here on CPU tensors): the factors of positive
    definite matrices are torch's own, a matrix that jitter repairs is repaired, and one that it cannot
    is raised by ``check_device_factors`` after the fact, never returned silently."""
    g = torch.Generator().manual_seed(0)
    A = torch.randn(5, 4, 4, generator=g, dtype=torch.float64)
    P = A @ A.mT + torch.eye(4, dtype=torch.float64)
    near = P[1] - (torch.linalg.eigvalsh(P[1])[0] + 1e-9) * torch.eye(4, dtype=torch.float64)  # tiny negative
    batch = P.clone()
    batch[1] = near
    L = _gaussian._device_cholesky(batch)
    keep = [0, 2, 3, 4]
    assert torch.equal(L[keep], torch.linalg.cholesky(P[keep]))
    assert torch.isfinite(L[1]).all() and torch.allclose(L[1] @ L[1].mT, near, atol=1e-4)
    _gaussian.check_device_factors("cpu")  # repaired: nothing to raise
    batch[2] = -torch.eye(4, dtype=torch.float64)  # no jitter makes this positive definite
    _gaussian._device_cholesky(batch)
    with pytest.raises(torch.linalg.LinAlgError, match="not positive definite even with jitter"):
        _gaussian.check_device_factors("cpu")
    _gaussian.check_device_factors("cpu")  # the flag is cleared by the check


def test_ts_asc_reads_alpha_once_per_value():
    """TS-ASC keeps ``1 - alpha`` as Python floats (no read of device memory per decision) and follows an
    in-place change of ``alpha``."""
    env = daulton2019(2, seed=0)
    policy = make_policy("ts-asc", env, alpha=0.1)
    assert policy._alpha_factors() == [pytest.approx(0.9)]
    policy.alpha.fill_(0.25)
    assert policy._alpha_factors() == [pytest.approx(0.75)]
    policy.select(env.arm_features, env.baseline_action, ReplicationRNG.from_seed(0, 2))


def test_counter_normals_are_the_same_numbers_through_every_door():
    seeds = replication_seeds(4, 3)
    rng = CounterRNG(seeds)
    assert torch.equal(counter_normal(seeds, "normal/k/(5,)", 0, 5), rng.normal((5,), key="k"))
    # a model drawing from a CounterRNG: the ThompsonSampling draw consumes the documented stream
    env = kazerouni2017_neurips(3, seed=seeds, num_arms=5, baseline_rank=2, instances="counter")
    policy = ThompsonSampling(make_policy("ts", env).model)
    a = policy.select(env.arm_features, env.baseline_action, CounterRNG(seeds))
    assert a.shape == (3,) and a.dtype == torch.long
