"""``shard_by_rank``: split items across distributed ranks and DataLoader workers."""

from __future__ import annotations

from typing import Any

from .base import SOURCES_KEY, Stage

__all__ = ["Sharder"]


class Sharder(Stage[Any]):
    """Keeps item ``i`` when ``i % num_shards == shard_index``.

    ``num_shards`` is world size x DataLoader workers (either factor can be switched off) and
    ``shard_index`` is ``rank * num_workers + worker_id``; rank and world size come from
    ``torch.distributed`` when initialised, else from ``RANK``/``WORLD_SIZE``.

    Args:
        source: the input stage.
        ranks: split across distributed ranks.
        workers: split across DataLoader workers.
        auto: set by the builder for the automatic sharding it inserts (shown in explain()).
    """

    is_sharder = True

    def __init__(self, source: Stage[Any], *, ranks: bool = True, workers: bool = True,
                 auto: bool = False) -> None:
        super().__init__(source)
        self._ranks = ranks
        self._workers = workers
        self.auto = auto
        self._pos = 0

    @property
    def shard(self) -> tuple[int, int]:
        """``(index, count)`` of this process's shard."""
        ctx = self.context
        rank, world = (ctx.rank, ctx.world_size) if self._ranks else (0, 1)
        wid, nw = (ctx.worker_id, ctx.num_workers) if self._workers else (0, 1)
        return rank * nw + wid, world * nw

    def start(self, state: dict[str, Any] | None) -> None:
        self._pos = int(state["pos"]) if state else 0
        self._index, self._count = self.shard

    def next(self) -> Any:
        source, index, count = self.source, self._index, self._count
        while True:
            item = next(source)
            pos = self._pos
            self._pos = pos + 1
            if pos % count == index:
                return item

    def get_state(self) -> dict[str, Any]:
        return {"pos": self._pos, SOURCES_KEY: [self.source.state_dict()]}
