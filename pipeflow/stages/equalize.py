"""``equalize``: every rank and DataLoader worker yields the same number of items.

Distributed data parallel training runs one collective per step; a rank that runs out of
batches one step early leaves the others waiting in that collective forever. ``equalize`` makes
the count per shard (one shard = one rank x DataLoader worker) a number every process computes
on its own, with no communication, which is the only option inside DataLoader workers (they
cannot run collectives):

* ``per_shard=n``: exactly ``n`` items per shard;
* ``total=N``: ``N`` is the number of items before sharding, split over ranks x workers:
  ``floor(N / shards)`` with ``mode="drop"``, ``ceil(N / shards)`` with ``mode="pad"``;
* neither: ``N`` is read from the source when it is known without reading data (a
  ``from_items`` source followed only by one-to-one stages: shuffle, shard_by_rank, map,
  prefetch).

A shard that runs short wraps around to the beginning of its own stream (reshuffled, as
``repeat`` does) and repeats items; the repeats are counted as ``padded`` in ``pipe.stats()``.
A shard that receives no item at all cannot be padded: it raises :class:`ConfigError` naming
the rank and worker instead of ending early and hanging the other ranks.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from .._checks import check_choice, check_int
from ..errors import ConfigError, EmptyShardError
from ._walks import find_sharder, known_total
from .base import SOURCES_KEY, Stage

__all__ = ["Equalizer"]


class Equalizer(Stage[Any]):
    """Yields exactly the same number of items in every shard (rank x DataLoader worker).

    Args:
        source: the input stage (downstream of the sharding).
        total: number of items before sharding; each shard yields ``floor(total / shards)``
            (``mode="drop"``) or ``ceil(total / shards)`` (``mode="pad"``).
        per_shard: the exact count per shard (overrides ``total``).
        mode: ``"drop"`` rounds the share down (at most ``shards - 1`` items of the epoch are
            not delivered), ``"pad"`` rounds it up (at most ``shards - 1`` items are repeated).

    State: items yielded, wrap-arounds, and the source's position.
    """

    passes_items = True

    def __init__(self, source: Stage[Any], *, total: int | None = None, per_shard: int | None = None,
                 mode: Literal["drop", "pad"] = "drop") -> None:
        super().__init__(source)
        check_int(total, "equalize(total=...)", low=0, optional=True)
        check_int(per_shard, "equalize(per_shard=...)", low=0, optional=True)
        check_choice(mode, "equalize(mode=...)", ("drop", "pad"))
        self._total = total
        self._per_shard = per_shard
        self._mode = mode
        self._count = 0
        self._emitted = 0
        self._wraps = 0
        self._pass_items = 0

    # ---- the count ------------------------------------------------------------------------
    def _shards(self) -> int:
        sharder = find_sharder(self.source)
        return sharder.shard[1] if sharder is not None else self.context.num_shards

    def target(self) -> int:
        """The number of items this shard yields in an epoch."""
        if self._per_shard is not None:
            return self._per_shard
        total = self._total if self._total is not None else known_total(self.source)
        if total is None:
            raise ConfigError(
                f"{self.name}: the number of items is not known up front; pass equalize(total=N) "
                "(items before sharding) or equalize(per_shard=n)")
        shards = self._shards()
        return total // shards if self._mode == "drop" else math.ceil(total / shards)

    # ---- contract -------------------------------------------------------------------------
    def start(self, state: dict[str, Any] | None) -> None:
        self._count = self.target()
        self._emitted = int(state["emitted"]) if state else 0
        self._wraps = int(state["wraps"]) if state else 0
        self._pass_items = int(state["pass_items"]) if state else 0

    def next(self) -> Any:
        if self._emitted >= self._count:
            raise StopIteration
        while True:
            try:
                item = next(self.source)
            except StopIteration:
                if self._pass_items == 0:
                    ctx = self.context
                    raise EmptyShardError(
                        f"{self.name}: shard {ctx.shard_index} of {ctx.num_shards} (rank {ctx.rank} of "
                        f"{ctx.world_size}, DataLoader worker {ctx.worker_id} of {ctx.num_workers}) "
                        f"received no items, so it cannot yield its share of {self._count}; there are "
                        "fewer shards than ranks x workers: shard after expanding them (sample-level), "
                        "or use fewer DataLoader workers") from None
                self._wraps += 1
                self._pass_items = 0
                self.source.reset(None)
                continue
            break
        self._pass_items += 1
        self._emitted += 1
        if self._wraps:
            self.context.stats.incr(self.name, "padded")
        return item

    def get_state(self) -> dict[str, Any]:
        return {"emitted": self._emitted, "wraps": self._wraps, "pass_items": self._pass_items,
                SOURCES_KEY: [self.source.state_dict()]}

