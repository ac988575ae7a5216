"""Which item of a random-access source comes at each place of an epoch, and who reads it.

Pure functions of integers: no I/O, no torch, nothing that grows with the number of items.
Two questions, answered separately:

* **The order** (:class:`Order`): position ``p`` of the epoch's global order holds source index
  ``Order(...)[p]``, a function of the seed (which mixes in the epoch) only, never of the number
  of ranks or workers. The keys are cut into blocks of consecutive indices; the blocks are put in
  a seeded random order; the resulting stream is cut into windows of about ``window`` items, and
  each window is shuffled. Both permutations are computed per position (a small Feistel network
  with cycle walking), so looking up one position costs the same whatever the number of items,
  and nothing of size ``window`` or ``n`` is ever built.
* **The split** (:class:`Split`): position ``p`` belongs to global step ``p // (unit * ranks)``;
  rank ``r`` takes the ``unit`` positions ``[r * unit, (r + 1) * unit)`` of every step, and
  DataLoader worker ``w`` of that rank the steps ``s`` with ``s % workers == w``. With ``unit``
  the per-rank batch size, a DataLoader that takes batches from its workers in turn hands the
  training loop global step ``s`` on every rank at once, so global step ``s`` holds positions
  ``[s * unit * ranks, (s + 1) * unit * ranks)`` of the global order: the same samples at any
  number of ranks x workers for one global batch size ``unit * ranks``.

A shard (rank, worker) computes the place of its ``k``-th item in O(1) (:meth:`Split.position`),
its item count in O(1) (:meth:`Split.count`), and never looks at a position it does not own.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

__all__ = ["BLOCKS_PER_WINDOW", "Order", "Split", "permute", "unpermute"]

_MASK = (1 << 64) - 1
#: a window mixes this many blocks (fewer when the window is small): blocks are
#: ``window // BLOCKS_PER_WINDOW`` consecutive keys
BLOCKS_PER_WINDOW = 64
#: Feistel rounds: four make a pseudo-random permutation of the domain (Luby-Rackoff)
_ROUNDS = 4
_ODD = 0xD1B54A32D192ED03


def _mix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


@lru_cache(maxsize=256)
def _round_keys(key: int) -> tuple[int, ...]:
    return tuple(_mix(key ^ (r * 0xD1B54A32D192ED03 & _MASK)) for r in range(_ROUNDS))


def _half_bits(n: int) -> int:
    return max(1, ((n - 1).bit_length() + 1) // 2)


def _feistel(x: int, half: int, keys: tuple[int, ...]) -> int:
    mask = (1 << half) - 1
    left, right = x >> half, x & mask
    for k in keys:
        left, right = right, left ^ (_mix(k ^ right) & mask)
    return (left << half) | right


def _feistel_back(x: int, half: int, keys: tuple[int, ...]) -> int:
    mask = (1 << half) - 1
    left, right = x >> half, x & mask
    for k in reversed(keys):
        left, right = right ^ (_mix(k ^ left) & mask), left
    return (left << half) | right


def permute(i: int, n: int, key: int) -> int:
    """Place ``i`` of a seeded permutation of ``range(n)`` (a bijection; O(1) expected)."""
    if n <= 1:
        return 0
    half, keys = _half_bits(n), _round_keys(key)
    x = _feistel(i, half, keys)
    while x >= n:  # cycle walking: the domain is the next power of four, at most 4n
        x = _feistel(x, half, keys)
    return x


def unpermute(x: int, n: int, key: int) -> int:
    """The inverse of :func:`permute`: the ``i`` with ``permute(i, n, key) == x``."""
    if n <= 1:
        return 0
    half, keys = _half_bits(n), _round_keys(key)
    i = _feistel_back(x, half, keys)
    while i >= n:
        i = _feistel_back(i, half, keys)
    return i


@dataclass(frozen=True)
class Order:
    """The global order of one epoch over ``n`` items: ``order[p]`` is the source index at
    position ``p``. ``window`` 1 keeps the source order.

    Args:
        n: items in the source.
        window: items mixed together (``shuffle(buffer_size)``); 1 for no shuffle.
        seed: the epoch's seed (the caller derives it from the user's seed and the epoch).
    """

    n: int
    window: int
    seed: int

    def __post_init__(self) -> None:
        # everything a lookup needs that does not depend on the position, computed once
        block = max(1, self.window // BLOCKS_PER_WINDOW)
        blocks = max(1, -(-self.n // block))
        key = _mix(self.seed ^ 0x5851F42D4C957F2D)
        short = self.n - (blocks - 1) * block  # the size of the last block (block when it is full)
        at = unpermute(blocks - 1, blocks, key) if short != block else blocks  # where it lands
        span = max(1, self.window // block) * block
        object.__setattr__(self, "_fixed", (block, blocks, key, short, at, span))

    @property
    def block(self) -> int:
        """Consecutive source indices that travel together."""
        return self._fixed[0]  # type: ignore[attr-defined]

    @property
    def span(self) -> int:
        """Items of one shuffled window (whole blocks)."""
        return self._fixed[5]  # type: ignore[attr-defined]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, p: int) -> int:
        if not 0 <= p < self.n:
            raise IndexError(p)
        if self.window <= 1:
            return p
        block, blocks, key, short, at, span = self._fixed  # type: ignore[attr-defined]
        start = p - p % span
        s = start + permute(p - start, min(span, self.n - start), _mix(self.seed ^ (start * _ODD & _MASK)))
        # the source index at place s of the stream of permuted blocks
        if s < at * block:
            slot, offset = divmod(s, block)
        elif s < at * block + short:
            slot, offset = at, s - at * block
        else:
            slot, offset = divmod(s - short + block, block)
        return permute(slot, blocks, key) * block + offset


@dataclass(frozen=True)
class Split:
    """How the positions of a global order are dealt to ``ranks`` x ``workers`` shards.

    Args:
        ranks: distributed ranks.
        workers: DataLoader workers per rank (1 without workers).
        unit: positions a rank takes from each global step (its batch size). 0 when there is
            no batch to follow: position ``p`` then goes to shard ``p % (ranks * workers)``,
            shard ``rank * workers + worker`` (as ``shard_by_rank()`` splits), which is the
            same thing as ``unit=1`` without DataLoader workers.
    """

    ranks: int = 1
    workers: int = 1
    unit: int = 1

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.workers < 1 or self.unit < 0:
            raise ValueError(f"a split needs ranks and workers >= 1 and unit >= 0, got {self}")

    @property
    def shards(self) -> int:
        return self.ranks * self.workers

    @property
    def step(self) -> int:
        """Positions in one global step (the global batch size; one round of shards for
        ``unit=0``)."""
        return self.unit * self.ranks if self.unit else self.shards

    def owner(self, p: int) -> tuple[int, int]:
        """``(rank, worker)`` that reads position ``p``."""
        if not self.unit:
            return divmod(p % self.shards, self.workers)
        s, o = divmod(p, self.step)
        return o // self.unit, s % self.workers

    def position(self, rank: int, worker: int, k: int) -> int:
        """The position of the ``k``-th item (from 0) of shard ``(rank, worker)``."""
        if not self.unit:
            return rank * self.workers + worker + k * self.shards
        m, j = divmod(k, self.unit)
        return (worker + m * self.workers) * self.step + rank * self.unit + j

    def ordinal(self, rank: int, worker: int, p: int) -> int:
        """How many positions before ``p`` shard ``(rank, worker)`` owns (its ``k`` at ``p``)."""
        if not self.unit:
            index = rank * self.workers + worker
            return (p - index + self.shards - 1) // self.shards if p > index else 0
        s, o = divmod(p, self.step)
        full = (s - worker + self.workers - 1) // self.workers if s > worker else 0
        here = min(self.unit, max(0, o - rank * self.unit)) if s % self.workers == worker else 0
        return full * self.unit + here

    def count(self, rank: int, worker: int, n: int) -> int:
        """Items of shard ``(rank, worker)`` in an order of ``n`` positions."""
        return self.ordinal(rank, worker, n)
