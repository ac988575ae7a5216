"""``resample``: draw items with replacement, for endless streams over a list of shards."""

from __future__ import annotations

from typing import Any

from .._checks import check_int
from .._rng import derive_seed, draw
from ..errors import EmptyShardError
from .base import Stage

__all__ = ["Resampler"]


class Resampler(Stage[Any]):
    """Yields items drawn uniformly with replacement from everything ``source`` yields, as
    WebDataset's ``ResampledShards`` does: put it on a list of shards (``from_items(urls)`` or
    ``list_objects(...)``) and every rank x DataLoader worker reads an endless stream of shards
    of its own, with no epoch boundary to wait on.

    Each process draws its own sequence: the stream is seeded from ``(seed, epoch, round)`` and
    the process's shard index (rank x workers + worker id), so ranks and workers do not read
    the same shards in lockstep. The stage is its own sharding (``is_sharder``): no automatic
    ``shard_by_rank`` is added after it, and shuffles downstream mix in the shard index.

    The source is read once per run into memory (``O(N)`` per process for ``N`` shards: meant
    for shard lists, not for samples). Bound the stream with ``n`` or ``with_epoch``.

    Args:
        source: the input stage (read to the end at every start).
        n: draws per rank x worker and epoch; None draws forever.
        seed: base seed.

    State: the number of draws and the round, nothing else; a resumed run re-reads the source
    and continues the same sequence exactly.
    """

    passes_items = True

    is_sharder = True

    def __init__(self, source: Stage[Any], n: int | None = None, *, seed: int = 0) -> None:
        super().__init__(source)
        check_int(n, "resample(n=...)", low=0, optional=True)
        check_int(seed, "resample(seed=...)")
        self._n = n
        self._seed = seed
        self._round = -1  # incremented by every fresh start (repeat() restarts draw anew)
        self._items: list[Any] = []
        self._draws = 0
        self._stream = 0

    @property
    def shard(self) -> tuple[int, int]:
        """``(index, count)`` of this process's stream among ranks x DataLoader workers."""
        return self.context.shard_index, self.context.num_shards

    def start(self, state: dict[str, Any] | None) -> None:
        self._round = int(state["round"]) if state else self._round + 1
        self._draws = int(state["draws"]) if state else 0
        self._items = list(self.source)
        if not self._items:
            raise EmptyShardError(f"{self.name}: the source yielded nothing to draw from")
        index, count = self.shard
        self._stream = derive_seed("resample", self._seed, self.context.epoch, self._round,
                                   index, count)

    def stop(self) -> None:
        self._items = []

    def next(self) -> Any:
        if self._n is not None and self._draws >= self._n:
            raise StopIteration
        j = draw(self._stream, self._draws, len(self._items))
        self._draws += 1
        return self._items[j]

    def get_state(self) -> dict[str, Any]:
        # no source state: the source is read from its beginning at every start
        return {"round": self._round, "draws": self._draws}
