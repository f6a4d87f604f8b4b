"""Per-replication random streams: the numbers do not depend on the block size, and a stream's
buffer stays bounded at any R x d (issue 20: 1.3 GiB at R = 10,000, d = 64 before)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bayes_safe.random import CounterRNG, ReplicationRNG, replication_seeds


def test_draws_do_not_depend_on_the_block_size():
    seeds = replication_seeds(3, 5)
    small, large = ReplicationRNG(seeds, block=1), ReplicationRNG(seeds, block=256)
    for _ in range(40):
        assert torch.equal(small.normal((6,), key="w"), large.normal((6,), key="w"))
        assert torch.equal(small.uniform((2,), key="u"), large.uniform((2,), key="u"))


def test_a_wide_batch_draws_a_bounded_block_and_replication_r_equals_its_own_run():
    R, d = 10_000, 64
    seeds = replication_seeds(0, R)
    rng = ReplicationRNG(seeds)
    first = rng.normal((d, 1), key="weights")
    stream = next(iter(rng._streams.values()))
    assert stream.block == 1 and stream.buffer.numel() == R * d  # one step's draws, not 256 steps x R x d
    alone = ReplicationRNG([seeds[1234]]).normal((d, 1), key="weights")
    assert torch.equal(first[1234], alone[0])


def test_vectorised_seeding_reproduces_numpy_bit_for_bit():
    """``replication_seeds`` and the streams' PCG64 seeding are evaluated for all replications at
    once (issue 20: start-up at R = 10,000); they must give numpy's own seeds and generators."""
    import zlib

    import numpy as np

    from bayes_safe.random import _Stream

    for seed in (0, 5, 2**40 + 3, 2**130 + 9):
        children = np.random.SeedSequence(seed).spawn(37)
        want = [int(c.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1)) for c in children]
        assert replication_seeds(seed, 37) == want
    seeds = [0, 1, 2**32 - 1, 2**32, 2**63 + 5, 2**64 - 1, 2**70 + 1, *replication_seeds(4, 20)]
    key = "normal/w/(3,)"
    stream = _Stream(seeds, key, (3,), "normal", 4, torch.float64)
    for r, s in enumerate(seeds):
        reference = np.random.Generator(np.random.PCG64([s, zlib.crc32(key.encode())]))
        assert np.array_equal(stream.gens[r].standard_normal(50), reference.standard_normal(50)), s


@pytest.mark.parametrize("rng_class", [ReplicationRNG, CounterRNG])
def test_seeds_are_checked_by_name_before_any_draw(rng_class):
    """A user's seeds: numpy and 0-d torch integers are taken as ints; a float is refused (not truncated to
    another seed), as are strings, a bare int where a sequence is expected, and an empty list."""
    assert rng_class([np.int64(3), torch.tensor(4), 5]).seeds == [3, 4, 5]
    with pytest.raises(TypeError, match=r"seeds: expected a sequence of ints .*item 1 is 1\.5"):
        rng_class([0, 1.5])
    with pytest.raises(TypeError, match=r"seeds: .*item 0 is 'a'"):
        rng_class(["a"])
    with pytest.raises(TypeError, match=r"seeds: expected a sequence of ints \(one per replication\), got 5"):
        rng_class(5)
    with pytest.raises(ValueError, match="seeds: expected at least one seed"):
        rng_class([])
    with pytest.raises(ValueError, match=r"block: expected a positive int, got 0"):
        ReplicationRNG([1], block=0)
