"""Random streams, one per replication, so that batched runs equal single runs.

A simulation that advances ``R`` replications in lockstep must give, for replication ``r``,
exactly the trace that a run of replication ``r`` alone gives with the same seed. Drawing
``randn(R, d)`` from one generator breaks that (replication ``r``'s numbers would depend on
``R``). ``ReplicationRNG`` keeps one generator per replication and per named stream
(numpy PCG64 seeded with ``(replication seed, crc32(stream name))``), and draws from them in
blocks of ``block`` steps, so the Python loop over replications runs once per block rather
than once per step (it is off the hot path).

Start-up at large ``R``: numpy's seeding (``SeedSequence`` hashing, about 10 us per
generator, and ``SeedSequence.spawn`` for ``replication_seeds``) is evaluated here for all
replications at once with vectorised uint32 arithmetic that reproduces numpy's algorithm bit
for bit (tested against numpy), and each PCG64 is then built from its ready state words
(about 1.5 us). The numbers drawn are numpy's own, unchanged.

Every model and policy that needs randomness accepts ``generator=`` as either ``None`` (the
global torch generator), a ``torch.Generator`` (one stream for the whole batch: fast,
reproducible, but not replication-separable), or a ``ReplicationRNG``.

**Devices.** The numbers of a ``ReplicationRNG`` are numpy's, drawn on the CPU; they are put on a
device as a block (one copy per ``block`` steps, not one per draw): the RNG's own ``device``
(``ReplicationRNG(seeds, device="cuda")``, ``ReplicationRNG.from_seed(s, R, device=...)``;
default the CPU; ``simulate`` should make its RNG on the problem's device). A draw that names
another device (``standard_normal(..., device=)``, what every model passes: the device of its
prior) is copied there, one copy per draw: correct, but give the RNG the models' device to avoid
it. The same seed therefore gives the same numbers on every device. ``standard_normal`` / ``standard_uniform``
with a ``torch.Generator`` draw on the generator's device (a CPU generator feeding a CUDA model
draws on the CPU and copies: the CPU's numbers) and with ``None`` on ``device`` (torch's default
generator of that device). A ``DrawBatch`` draws with its ``torch.Generator`` (made on its
``device``) and puts the draws on the device asked for.

Example:
    >>> rng = ReplicationRNG.from_seed(0, replications=3)
    >>> rng.normal((4,), key="weights").shape
    torch.Size([3, 4])
"""

from __future__ import annotations

import math
import numbers
import zlib
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from numpy.random.bit_generator import ISeedSequence

from ._validation import check_positive_int

__all__ = ["CounterRNG", "DrawBatch", "Generator", "ReplicationRNG", "counter_normal", "counter_uniform", "replication_seeds", "standard_normal", "standard_uniform"]


def replication_seeds(seed: int | Sequence[int], replications: int | None = None) -> list[int]:
    """Per-replication integer seeds.

    Args:
        seed: an int (expanded into ``replications`` independent seeds with
            ``numpy.random.SeedSequence``) or a sequence of per-replication seeds, used as is.
        replications: the number of replications when ``seed`` is an int.

    Returns:
        A list of ``replications`` non-negative ints. Replication ``r`` of a batched run with
        ``seed=s`` equals a single run with ``seed=[replication_seeds(s, R)[r]]``.
    """
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        if replications is None or int(replications) < 1:
            raise ValueError(f"replications must be a positive int, got {replications!r}")
        if int(seed) < 0:
            raise ValueError(f"seed: expected a non-negative int, got {seed!r}")
        # numpy.random.SeedSequence(seed).spawn(R)[i].generate_state(1, uint64) >> 1, for all i at once
        run = _seed_words(int(seed))
        run += [0] * (_POOL_SIZE - len(run))  # numpy pads the run entropy of spawned children
        out = np.empty(int(replications), dtype=np.uint64)
        for lo, hi in _word_count_ranges(int(replications)):
            keys = np.arange(lo, hi, dtype=np.uint64)
            width = len(_seed_words(hi - 1))
            entropy = np.empty((hi - lo, len(run) + width), dtype=np.uint32)
            entropy[:, : len(run)] = np.asarray(run, dtype=np.uint32)
            for w in range(width):
                entropy[:, len(run) + w] = ((keys >> np.uint64(32 * w)) & np.uint64(_MASK32)).astype(np.uint32)
            words = _generate_state(_mix_entropy(entropy), 2).astype(np.uint64)
            out[lo:hi] = (words[:, 0] | (words[:, 1] << np.uint64(32))) >> np.uint64(1)
        return out.tolist()
    try:
        seeds = [int(s) for s in seed]
        if any(isinstance(s, (bool, float)) for s in seed) or isinstance(seed, (str, bytes)):
            raise TypeError
    except (TypeError, ValueError):
        raise TypeError(f"seed: expected an int or a sequence of ints (one per replication), got {seed!r}") from None
    if not seeds:
        raise ValueError("seed: expected an int or a non-empty sequence of ints, got an empty sequence")
    if replications is not None and len(seeds) != int(replications):
        raise ValueError(
            f"seed: got {len(seeds)} per-replication seeds but replications={replications}"
        )
    return seeds


#: the most numbers one stream draws per refill (8 MiB of float64)
_BLOCK_NUMBERS = 1 << 20

# numpy.random.SeedSequence's constants (numpy/random/bit_generator.pyx)
_MASK32 = 0xFFFFFFFF
_POOL_SIZE = 4
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R = 0xCA01F9DD, 0x4973F715


def _seed_words(value: int) -> list[int]:
    """A non-negative int as numpy's SeedSequence reads it: 32-bit words, least significant first."""
    words = [value & _MASK32]
    value >>= 32
    while value:
        words.append(value & _MASK32)
        value >>= 32
    return words


def _word_count_ranges(n: int) -> list[tuple[int, int]]:
    """``[0, n)`` split where the ints change their number of 32-bit words (``[0, 2^32)``, ...)."""
    out, lo, width = [], 0, 1
    while lo < n:
        hi = min(n, 1 << (32 * width))
        if hi > lo:
            out.append((lo, hi))
        lo, width = hi, width + 1
    return out


def _mix_entropy(entropy: np.ndarray) -> np.ndarray:
    """``SeedSequence``'s entropy pool of every row of ``entropy [n, L]`` (uint32) -> ``[n, 4]`` uint32.

    numpy's ``mix_entropy`` vectorised over rows: the hash constants do not depend on the
    data, so every row follows the same sequence of uint32 operations (wrapping arithmetic).
    """
    n, length = entropy.shape
    u32 = np.uint32
    const = _INIT_A

    def hashmix(value):
        nonlocal const
        value = value ^ u32(const)
        const = (const * _MULT_A) & _MASK32
        value = value * u32(const)
        return value ^ (value >> u32(16))

    def mix(x, y):
        out = u32(_MIX_MULT_L) * x - u32(_MIX_MULT_R) * y
        return out ^ (out >> u32(16))

    with np.errstate(over="ignore"):
        pool = [hashmix(entropy[:, i] if i < length else np.zeros(n, dtype=u32)) for i in range(_POOL_SIZE)]
        for src in range(_POOL_SIZE):
            for dst in range(_POOL_SIZE):
                if src != dst:
                    pool[dst] = mix(pool[dst], hashmix(pool[src]))
        for src in range(_POOL_SIZE, length):
            for dst in range(_POOL_SIZE):
                pool[dst] = mix(pool[dst], hashmix(entropy[:, src]))
    return np.stack(pool, 1)


def _generate_state(pool: np.ndarray, n_words: int) -> np.ndarray:
    """``SeedSequence.generate_state(n_words)`` (uint32) of every pool row: ``[n, n_words]``."""
    u32 = np.uint32
    const = _INIT_B
    out = np.empty((pool.shape[0], n_words), dtype=u32)
    with np.errstate(over="ignore"):
        for i in range(n_words):
            value = pool[:, i % _POOL_SIZE] ^ u32(const)
            const = (const * _MULT_B) & _MASK32
            value = value * u32(const)
            out[:, i] = value ^ (value >> u32(16))
    return out


def _pcg64_states(seeds: list[int], salt: int) -> np.ndarray:
    """The seed words ``np.random.PCG64([s, salt])`` draws from its SeedSequence, per seed: ``[n, 4]`` uint64."""
    n = len(seeds)
    salt_words = np.asarray(_seed_words(salt), dtype=np.uint32)
    out = np.empty((n, 4), dtype=np.uint64)
    big = [r for r, s in enumerate(seeds) if s >= 1 << 64]
    small = np.asarray(seeds if not big else [0 if s >= 1 << 64 else s for s in seeds], dtype=np.uint64)
    low = (small & np.uint64(_MASK32)).astype(np.uint32)
    high = (small >> np.uint64(32)).astype(np.uint32)
    two = high != 0
    groups = [(np.flatnonzero(~two), [low]), (np.flatnonzero(two), [low, high])]
    for r in big:  # seeds of more than 64 bits (given by the caller): one row each
        groups.append((np.asarray([r]), [np.asarray([w], dtype=np.uint32) for w in _seed_words(seeds[r])]))
    if big:
        keep = np.ones(n, dtype=bool)
        keep[big] = False
        groups[0], groups[1] = ((rows[keep[rows]], cols) for rows, cols in groups[:2])
    for rows, cols in groups:
        if rows.size == 0:
            continue
        width = len(cols)
        entropy = np.empty((rows.size, width + salt_words.size), dtype=np.uint32)
        for w, col in enumerate(cols):
            entropy[:, w] = col[rows] if col.size == n else col
        entropy[:, width:] = salt_words
        state = _generate_state(_mix_entropy(entropy), 8).astype(np.uint64)
        out[rows] = state[:, 0::2] | (state[:, 1::2] << np.uint64(32))  # little-endian pairs, as numpy
    return out


class _ReadySeed(ISeedSequence):
    """A seed sequence whose state words are already computed (what PCG64 asks of it)."""

    __slots__ = ("words",)

    def __init__(self, words: np.ndarray):
        self.words = words

    def generate_state(self, n_words, dtype=np.uint32):
        return self.words


class _Stream:
    """One named stream: a numpy ``Generator`` (PCG64) per replication, drawn ``block`` steps at a time.

    ``buffer`` is ``[R, block, *shape]`` (each generator writes its row in place); ``next``
    returns the step's ``[R, *shape]`` view of it.

    numpy's ziggurat draws float64 normals about 3x faster than torch's float64 ``randn``
    (measured: 11 us vs 31 us for 1,024 numbers), and the stream refill is the only loop over
    replications in a simulation.
    """

    __slots__ = ("block", "buffer", "device", "dtype", "gens", "kind", "pos", "shape", "steps")

    def __init__(self, seeds: list[int], key: str, shape: tuple[int, ...], kind: str, block: int, dtype,
                 device: torch.device | None = None):
        salt = zlib.crc32(key.encode())
        # np.random.Generator(np.random.PCG64([s, salt])) for every seed, seeded in one vectorised pass
        states = _pcg64_states(seeds, salt)
        self.gens = [np.random.Generator(np.random.PCG64(_ReadySeed(w))) for w in states]
        # at most _BLOCK_NUMBERS numbers per refill: the buffer (and the start-up stall of the first
        # refill) no longer grows with R x d beyond one step's draws. numpy fills a request in
        # order, so the numbers drawn do not depend on the block size (tested)
        per_step = len(seeds) * max(1, math.prod(shape))
        block = max(1, min(int(block), _BLOCK_NUMBERS // per_step))
        self.shape, self.kind, self.block, self.dtype = shape, kind, block, dtype
        # the device the blocks are put on (one copy per refill); None: the CPU (numpy's own memory)
        self.device = None if device is None or torch.device(device).type == "cpu" else torch.device(device)
        self.buffer: torch.Tensor | None = None
        self.steps: tuple[torch.Tensor, ...] = ()
        self.pos = block

    def next(self) -> torch.Tensor:
        if self.pos >= self.block:
            # [R, block, *shape]: each generator fills its own contiguous row in place (no stacking copy);
            # the spent block is let go first, so that two blocks are not held at once
            self.buffer, self.steps = None, ()
            rows = np.empty((len(self.gens), self.block, *self.shape))
            if self.kind == "normal":
                for g, row in zip(self.gens, rows):
                    g.standard_normal(out=row)
            else:
                for g, row in zip(self.gens, rows):
                    g.random(out=row)
            self.buffer = torch.from_numpy(rows).to(self.dtype)
            if self.device is not None:
                self.buffer = self.buffer.to(self.device)
            self.steps = self.buffer.unbind(1)  # the block's [R, *shape] views, made in one call
            self.pos = 0
        out = self.steps[self.pos]
        self.pos += 1
        return out


def _check_seeds(seeds) -> list[int]:
    """``seeds`` as a list of Python ints, or a ``TypeError`` / ``ValueError`` naming the argument: a
    sequence of integers (Python, numpy or 0-d integer tensors), at least one; a float is refused rather
    than truncated (``1.5`` would silently be seed 1)."""
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Iterable):
        raise TypeError(f"seeds: expected a sequence of ints (one per replication), got {seeds!r}")
    out = []
    for i, s in enumerate(seeds):
        if isinstance(s, torch.Tensor) and s.numel() == 1 and not s.is_floating_point() and s.dtype != torch.bool:
            s = s.item()
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise TypeError(f"seeds: expected a sequence of ints (one per replication); item {i} is {s!r}")
        out.append(int(s))
    if not out:
        raise ValueError("seeds: expected at least one seed")
    return out


class ReplicationRNG:
    """Independent, named random streams for each of ``R`` replications.

    Args:
        seeds: one integer seed per replication.
        block: how many draws each stream prepares at once (a memory/speed trade-off; the
            numbers drawn do not depend on it, nor on the number of replications).
        device: where the draws are put when a draw names no device (default: the CPU). The
            numbers are numpy's (drawn on the CPU) whatever the device; a stream's block is
            copied to its device once per refill.
    """

    def __init__(self, seeds: Sequence[int], block: int = 256, device: torch.device | str | None = None):
        self.seeds = _check_seeds(seeds)
        self.block = check_positive_int(block, "block")
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._streams: dict[tuple, _Stream] = {}

    @classmethod
    def from_seed(cls, seed: int | Sequence[int], replications: int | None = None, **kwargs) -> ReplicationRNG:
        return cls(replication_seeds(seed, replications), **kwargs)

    @property
    def replications(self) -> int:
        return len(self.seeds)

    def __repr__(self) -> str:
        shown = self.seeds[:3] + (["..."] if len(self.seeds) > 3 else [])
        return f"{type(self).__name__}(replications={self.replications}, seeds={shown}, streams={len(self._streams)})"

    #: where the blocks are put (an instance attribute when given; subclasses that bypass ``__init__`` get the CPU)
    device = torch.device("cpu")

    def _stream(self, kind: str, shape: Sequence[int], key: str, dtype) -> _Stream:
        """The stream of ``kind`` draws of ``[R, *shape]`` named ``key`` (made on first use, its
        blocks put on the RNG's ``device``)."""
        sid = (kind, key, shape, dtype)
        stream = self._streams.get(sid)
        if stream is None:
            shape = tuple(int(s) for s in shape)
            stream = self._streams[sid] = _Stream(self.seeds, f"{kind}/{key}/{shape}", shape, kind, self.block, dtype,
                                                  self.device)
        return stream

    def _draw(self, kind: str, shape: Sequence[int], key: str, dtype) -> torch.Tensor:
        """The next ``[R, *shape]`` draws of a stream, on the RNG's device (subclasses override this)."""
        return self._stream(kind, shape, key, dtype).next()

    def normal(self, shape: Sequence[int] = (), key: str = "default", dtype=torch.float64,
               device: torch.device | str | None = None) -> torch.Tensor:
        """Standard normal draws of shape ``[R, *shape]`` from the stream named ``key`` (on ``device``,
        default the RNG's)."""
        return _on(self._draw("normal", shape, key, dtype), device)

    def uniform(self, shape: Sequence[int] = (), key: str = "default", dtype=torch.float64,
                device: torch.device | str | None = None) -> torch.Tensor:
        """Uniform [0, 1) draws of shape ``[R, *shape]`` from the stream named ``key`` (on ``device``,
        default the RNG's)."""
        return _on(self._draw("uniform", shape, key, dtype), device)


# --- counter-based streams (issue 46): numbers computed where they are used --------------------------------

_U64 = (1 << 64) - 1
#: SplitMix64's increment (the golden ratio) and its finaliser's multipliers (Steele, Lea & Flood 2014)
_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _signed(value: int) -> int:
    """An unsigned 64-bit word as the int64 with the same bits (what a torch int64 tensor holds)."""
    value &= _U64
    return value - (1 << 64) if value >= 1 << 63 else value


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """The logical right shift of int64 ``x`` read as unsigned (torch's ``>>`` is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _finalize(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's output function, a bijection of 64-bit words with full avalanche (int64 in, int64
    out; torch's int64 products wrap modulo 2^64 on every device, as the unsigned arithmetic needs)."""
    x = (x ^ _shr(x, 30)) * _signed(_MIX1)
    x = (x ^ _shr(x, 27)) * _signed(_MIX2)
    return x ^ _shr(x, 31)


def _hash_words(keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """64 random bits per (key, counter): ``keys [R, 1]`` and ``counters [1, n]`` (int64) -> ``[R, n]``.

    SplitMix64's state of counter ``c`` under key ``k`` is ``k + (c + 1) golden``; its output is
    finalised once more with the key mixed in, so that keys differing by a multiple of the increment
    (related seeds) give unrelated streams."""
    return _finalize(_finalize(keys + counters) ^ keys)


def _stream_keys(seeds: torch.Tensor, name: str) -> torch.Tensor:
    """The key of stream ``name`` for every seed ``[R]`` (int64): both finalised, then combined."""
    salt = _signed(zlib.crc32(name.encode()) * _GOLDEN + _MIX2)
    salted = _finalize(torch.full_like(seeds, salt))
    return _finalize(seeds * _signed(_GOLDEN) + salted)


def _to_unit(words: torch.Tensor, open_zero: bool) -> torch.Tensor:
    """Uniform float64 numbers from 64-bit words: the top 53 bits, ``k / 2^53`` in ``[0, 1)`` (or
    ``(k + 1) / 2^53`` in ``(0, 1]`` with ``open_zero``: what a logarithm needs)."""
    top = _shr(words, 11)
    if open_zero:
        top = top + 1
    return top.to(torch.float64) * (1.0 / (1 << 53))


def _counter_block(keys: torch.Tensor, start: int, n: int, kind: str) -> torch.Tensor:
    """``[R, n]`` float64 numbers of counters ``start .. start + n`` (normal: two words each, Box-Muller)."""
    device = keys.device
    if kind == "normal":
        c = torch.arange(2 * n, dtype=torch.int64, device=device)
        c = (c + (2 * start + 1)) * _signed(_GOLDEN)
        words = _hash_words(keys[:, None], c[None, :])
        radius = torch.sqrt(-2.0 * torch.log(_to_unit(words[:, :n], True)))
        return radius * torch.cos((2.0 * math.pi) * _to_unit(words[:, n:], False))
    c = (torch.arange(n, dtype=torch.int64, device=device) + (start + 1)) * _signed(_GOLDEN)
    return _to_unit(_hash_words(keys[:, None], c[None, :]), False)


def _seed_tensor(seeds: Sequence[int], device) -> torch.Tensor:
    return torch.tensor([_signed(int(s)) for s in seeds], dtype=torch.int64, device=device)


def _counter_numbers(seeds, name: str, start: int, n: int, device, kind: str) -> torch.Tensor:
    """``counter_uniform`` / ``counter_normal`` (``kind``): seeds as ints or their int64 words."""
    seeds = seeds if isinstance(seeds, torch.Tensor) else _seed_tensor(seeds, device)
    return _counter_block(_stream_keys(seeds.to(device) if device is not None else seeds, name), int(start), int(n),
                          kind)


def counter_uniform(seeds: Sequence[int] | torch.Tensor, name: str, start: int, n: int,
                    device: torch.device | str | None = None) -> torch.Tensor:
    """``U[0, 1)`` numbers ``start .. start + n`` of the counter stream ``name`` of each seed: ``[R, n]``
    float64 on ``device`` (see ``CounterRNG``; a seed's numbers do not depend on the other seeds)."""
    return _counter_numbers(seeds, name, start, n, device, "uniform")


def counter_normal(seeds: Sequence[int] | torch.Tensor, name: str, start: int, n: int,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """``N(0, 1)`` numbers ``start .. start + n`` of the counter stream ``name`` of each seed: ``[R, n]``
    float64 on ``device`` (Box-Muller on two counter words each; see ``CounterRNG``)."""
    return _counter_numbers(seeds, name, start, n, device, "normal")


class CounterRNG(ReplicationRNG):
    """Independent, named random streams for each of ``R`` replications, computed on the device.

    The counter-based twin of ``ReplicationRNG`` (Salmon et al. 2011, "Parallel random numbers: as
    easy as 1, 2, 3"): number ``i`` of stream ``key`` of replication ``r`` is a hash of
    ``(seed_r, key, i)`` (SplitMix64's finaliser, twice, on 64-bit integer tensors), so every
    replication's numbers are computed at once, in a few elementwise kernels on the device where they
    are used, with no per-replication loop and no copy from the host. What a ``ReplicationRNG``
    promises holds: replication ``r`` of a batch draws exactly the numbers a one-replication
    ``CounterRNG([seed_r])`` draws, whatever ``R``; each stream (named by its kind, key and shape, as
    ``ReplicationRNG``'s) is independent of the others.

    The numbers are not numpy's: a ``CounterRNG`` and a ``ReplicationRNG`` of the same seeds draw
    different numbers with the same law. Uniforms are ``k / 2^53`` from the top 53 bits of a word;
    normals are Box-Muller on two words (so the largest ``|z|`` is about 8.6). On the CPU and on a
    GPU the integer words are equal bit for bit; the normals agree to the last bits of ``log``, ``sqrt``
    and ``cos`` on each device.

    When to use it: ``simulate`` on a GPU (its default there): a ``ReplicationRNG`` refills its
    blocks with one numpy generator per replication, a Python loop that costs about 1 s per million
    replications; a ``CounterRNG`` costs a few kernels per draw. On the CPU the numpy streams stay
    the default (their numbers are the ones every earlier result was computed with).

    Args:
        seeds: one integer seed per replication (any int; read modulo 2^64).
        device: where the numbers are computed (default: the CPU).

    Example:
        >>> rng = CounterRNG.from_seed(0, replications=3)
        >>> z = rng.normal((4,), key="weights")  # [3, 4]
        >>> alone = CounterRNG([rng.seeds[1]]).normal((4,), key="weights")  # replication 1 by itself
        >>> torch.equal(alone[0], z[1])
        True
    """

    def __init__(self, seeds: Sequence[int], device: torch.device | str | None = None):
        super().__init__(seeds, block=1, device=device)
        self._seed_words = _seed_tensor(self.seeds, self.device)
        self._counters: dict[tuple, list] = {}

    def _draw(self, kind: str, shape: Sequence[int], key: str, dtype) -> torch.Tensor:
        shape = tuple(int(s) for s in shape)
        sid = (kind, key, shape)
        state = self._counters.get(sid)
        if state is None:  # [keys [R], numbers drawn so far]
            state = self._counters[sid] = [_stream_keys(self._seed_words, f"{kind}/{key}/{shape}"), 0]
        n = max(1, math.prod(shape))
        out = _counter_block(state[0], state[1], n, kind)
        state[1] += n
        out = out.reshape(self.replications, *shape)
        return out if dtype == torch.float64 else out.to(dtype)

    def __repr__(self) -> str:
        shown = self.seeds[:3] + (["..."] if len(self.seeds) > 3 else [])
        return f"CounterRNG(replications={self.replications}, seeds={shown}, device={str(self.device)!r})"


class DrawBatch(ReplicationRNG):
    """``S`` independent posterior draws in one call: every draw gets a leading sample dimension.

    A model asked for its ``[R, *shape]`` random numbers under a ``DrawBatch`` receives
    ``[S, R, *shape]`` instead, and because models and policies broadcast over leading
    dimensions, one ``policy.select(features [R, K, d], generator=DrawBatch(S))`` returns the
    actions of ``S`` independent Thompson draws, ``[S, R]``: what ``Policy.action_probabilities``
    counts. The numbers come from one ``torch.Generator`` (seeded, or the caller's), drawn in
    one vectorised call per model.

    ``standard_normal(shape, draws)`` / ``standard_uniform`` return ``[S, *shape]`` whatever
    ``shape`` is, so a model without a batch shape (the one-stream case) draws ``[S, d]``; a
    model aligns its ``S`` draws with features that carry a replication axis its batch shape
    lacks (``BayesianLinear.sample_at``: ``[S, 1, K]`` at features ``[1, K, d]``).

    **Model state.** Propensity draws never change a model's state beyond what one ordinary
    draw does. Models whose draw is a function of fixed posterior parameters (conjugate,
    NUTS / SVI draws, the probit GP's ``q(w)``, per-arm) keep nothing. Chain engines (Gibbs,
    Langevin), whose ordinary draw advances the chain, make the ``S`` draws from a copy of the
    current state (see their ``draw``); with ``played=True`` (the ``Decider``: the first draw is
    the action played) the model's chain then continues from the first draw's state, exactly as
    after one ordinary ``select``; with ``played=False`` (``Policy.action_probabilities``, a
    query) the chain is left as it was.

    **Independent rows** (``independent_rows=True``; ``Policy.row_probabilities``, the propensities
    of a decision log's rows): the features' rows ``[n, K, d]`` are ``n`` separate decisions of one
    stream, each with its own ``S`` draws, independent of the other rows' (as ``n`` calls of one
    row each would make them). A model without a batch shape that can draw so says
    ``row_draws`` (``BayesianLinear`` of a conjugate or stored-draws engine) and returns
    ``[S, n, K]`` draws independent across rows; without the flag such a model's ``S`` draws are
    shared by the rows (``[S, d]`` weights at every row). Chain engines (Gibbs, Langevin) do not draw
    so: ``Policy.row_probabilities`` asks them one row at a time.

    Args:
        num_draws: ``S`` (>= 1).
        replications: ``R``, the batch the models keep.
        generator: a ``torch.Generator`` (None: a fresh one seeded with ``seed``, on ``device``).
        seed: the seed of that fresh generator.
        device: the device of that fresh generator (default: the CPU). Draws are made on the
            generator's device and put on the device a model asks for.
        played: whether the first draw is played (see above).
        independent_rows: the features' rows are separate decisions (see above).
    """

    def __init__(self, num_draws: int, replications: int = 1, generator: torch.Generator | None = None, seed: int = 0,
                 *, played: bool = False, independent_rows: bool = False, device: torch.device | str | None = None):
        if isinstance(num_draws, bool) or not isinstance(num_draws, (int, np.integer)) or num_draws < 1:
            raise ValueError(f"num_draws: expected an int >= 1, got {num_draws!r}")
        super().__init__([0] * int(replications), block=1,
                         device=device if generator is None else getattr(generator, "device", None))
        self.num_draws = int(num_draws)
        self.played = bool(played)
        self.independent_rows = bool(independent_rows)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator: expected a torch.Generator or None, got {type(generator).__name__}")
        if generator is None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
            raise TypeError(f"seed: expected an int, got {seed!r}")
        self.generator = generator if generator is not None else torch.Generator(device=self.device).manual_seed(int(seed))

    def __repr__(self) -> str:
        rows = ", independent_rows=True" if self.independent_rows else ""
        return f"DrawBatch(num_draws={self.num_draws}, replications={self.replications}, played={self.played}{rows})"

    def _draw(self, kind: str, shape, key: str, dtype) -> torch.Tensor:
        return self._full(kind, (self.replications, *(int(s) for s in shape)), dtype)

    def _normal32(self, shape: tuple, device=None) -> torch.Tensor:
        """``[S, *shape]`` float32 normals: the numbers ``_full("normal", shape, torch.float64)`` returns
        widened, from the same draw of the generator (a model that widens them in its own next
        operation, e.g. an addition to float64, saves the copy); on ``device`` (default the generator's)."""
        out = torch.randn((self.num_draws, *shape), generator=self.generator, dtype=torch.float32, device=self.device)
        return out if device is None or out.device == device else out.to(device)

    def _full(self, kind: str, shape: tuple, dtype, device=None) -> torch.Tensor:
        """``[S, *shape]`` numbers (``shape`` as the model asked, with or without a batch axis), drawn on the
        generator's device and put on ``device`` (None: left there)."""
        size = (self.num_draws, *shape)
        if kind == "normal":
            if dtype == torch.float64:
                # float32 normals widened: torch's float64 normal sampler is not vectorised (16 us for
                # S = 200, d = 4 against 5 us). Each draw is N(0, 1) to 2^-24 relative resolution, its
                # tail cut near 5.8 sd (probability 7e-9): far below a propensity's Monte-Carlo error
                return self._normal32(shape, device).to(dtype)
            out = torch.randn(size, generator=self.generator, dtype=dtype, device=self.device)
        else:
            out = torch.rand(size, generator=self.generator, dtype=dtype, device=self.device)
        return out if device is None or out.device == device else out.to(device)


Generator = torch.Generator | ReplicationRNG | None


def check_generator(generator, name: str = "generator") -> None:
    """``TypeError`` naming ``name`` unless ``generator`` is None, a ``torch.Generator`` or a
    ``ReplicationRNG`` (a ``DrawBatch`` included): what every stochastic call takes."""
    if generator is not None and not isinstance(generator, (torch.Generator, ReplicationRNG)):
        raise TypeError(f"{name}: expected a torch.Generator, a bayes_safe ReplicationRNG / DrawBatch or None, "
                        f"got {type(generator).__name__}")


def _check_batch(generator: ReplicationRNG, shape: tuple[int, ...]) -> None:
    if not shape or shape[0] != generator.replications:
        raise ValueError(
            f"generator: a ReplicationRNG with {generator.replications} replications cannot draw "
            f"shape {list(shape)}; the leading (replication) dimension must be {generator.replications}"
        )


def _on(out: torch.Tensor, device) -> torch.Tensor:
    return out if device is None or out.device == device else out.to(device)


def standard_normal(shape: Sequence[int], generator: Generator = None, key: str = "default", dtype=torch.float64,
                    device: torch.device | str | None = None) -> torch.Tensor:
    """``N(0, 1)`` draws of ``shape`` from any generator kind (see module docstring), on ``device``
    (None: the ``ReplicationRNG``'s device, the ``torch.Generator``'s, or torch's default)."""
    if isinstance(generator, ReplicationRNG):
        if isinstance(generator, DrawBatch):
            return generator._full("normal", tuple(int(s) for s in shape), dtype, device)
        if not shape or shape[0] != generator.replications:
            _check_batch(generator, tuple(shape))
        return _on(generator._draw("normal", tuple(shape[1:]), key, dtype), device)
    if generator is None:
        return torch.randn(shape, dtype=dtype, device=device)
    # on the generator's device (torch requires it), then put where asked
    return _on(torch.randn(shape, generator=generator, dtype=dtype, device=generator.device), device)


def standard_uniform(shape: Sequence[int], generator: Generator = None, key: str = "default", dtype=torch.float64,
                     device: torch.device | str | None = None) -> torch.Tensor:
    """``U[0, 1)`` draws of ``shape`` from any generator kind (see module docstring), on ``device``
    (as ``standard_normal``)."""
    shape = tuple(int(s) for s in shape)
    if isinstance(generator, ReplicationRNG):
        if isinstance(generator, DrawBatch):
            return generator._full("uniform", shape, dtype, device)
        _check_batch(generator, shape)
        return _on(generator._draw("uniform", shape[1:], key, dtype), device)
    if generator is None:
        return torch.rand(shape, dtype=dtype, device=device)
    return _on(torch.rand(shape, generator=generator, dtype=dtype, device=generator.device), device)


def standard_gamma(concentration: torch.Tensor, generator: Generator = None, key: str = "gamma", tries: int = 8) -> torch.Tensor:
    """Gamma(concentration, 1) draws with a fixed number of random numbers per call.

    Marsaglia & Tsang's (2000) squeeze method, vectorised: ``tries`` candidate pairs are drawn
    for every element and the first accepted one is kept, so every call consumes the same
    amount of randomness (what ``ReplicationRNG`` needs). For concentration >= 1 each try
    is accepted with probability > 0.95, so all eight fail with probability < 4e-11; in that
    event the last candidate is used. Concentrations below 1 use the boost
    ``G(a) = G(a + 1) U^(1/a)``.

    Args:
        concentration: ``[*batch]`` positive shape parameters; ``batch[0]`` is the replication
            dimension when ``generator`` is a ``ReplicationRNG``.
    """
    a = concentration.to(torch.float64)
    shape = tuple(a.shape)
    boost = a < 1
    a1 = torch.where(boost, a + 1, a)
    dd = a1 - 1.0 / 3.0
    c = 1.0 / torch.sqrt(9.0 * dd)
    z = standard_normal((*shape, tries), generator, key=key + "/z", device=a.device)
    u = standard_uniform((*shape, tries), generator, key=key + "/u", device=a.device)
    v = (1.0 + c[..., None] * z) ** 3
    ok = (v > 0) & (torch.log(u) < 0.5 * z**2 + dd[..., None] - dd[..., None] * v + dd[..., None] * torch.log(v.clamp_min(1e-300)))
    ok[..., -1] |= v[..., -1] > 0
    first = torch.argmax(ok.to(torch.int8), dim=-1, keepdim=True)
    x = dd * torch.gather(v.clamp_min(1e-12), -1, first)[..., 0]
    ub = standard_uniform(shape, generator, key=key + "/boost", device=a.device)
    return torch.where(boost, x * ub.clamp_min(1e-300) ** (1.0 / a), x)
