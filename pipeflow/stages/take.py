"""``take``: stop after a number of items, per shard or for the whole epoch."""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from .._checks import check_choice, check_int
from ._walks import find_sharder
from .base import SOURCES_KEY, Stage

__all__ = ["Taker", "share"]

T = TypeVar("T")


def share(n: int, index: int, count: int) -> int:
    """Shard ``index``'s part when ``n`` items are split over ``count`` shards as evenly as
    possible (the first ``n % count`` shards get one more): the parts add up to ``n``."""
    return n // count + (1 if index < n % count else 0)


class Taker(Stage[T]):
    """Yields at most ``n`` items of ``source``.

    Args:
        source: the input stage.
        n: how many items to yield (>= 0).
        across: ``"each"``: ``n`` items in every process that iterates (every rank x DataLoader
            worker), so ``n x shards`` in all; ``"all"``: ``n`` items for the whole epoch, each
            shard taking its part (``n // shards``, plus one for the first ``n % shards``). Exact
            when every shard has its part: always with item-level sharding of at least ``n``
            items (a ``from_items`` or ``list_objects`` source), after ``equalize()`` or
            ``with_epoch()``; a shard that runs short yields what it has.
    """

    passes_items = True

    def __init__(self, source: Stage[T], n: int, *, across: Literal["each", "all"] = "each") -> None:
        super().__init__(source)
        check_int(n, "take(n=...)", low=0)
        check_choice(across, "take(across=...)", ("each", "all"))
        self._n = n
        self._across = across
        self._limit = n
        self._taken = 0

    def _part(self) -> int:
        if self._across == "each" or not self.sharded_upstream:
            # unsplit stream: the sharding downstream keeps each shard's part of these n
            return self._n
        sharder = find_sharder(self.source)
        index, count = sharder.shard if sharder is not None else (self.context.shard_index,
                                                                   self.context.num_shards)
        return share(self._n, index, count)

    def start(self, state: dict[str, Any] | None) -> None:
        self._limit = self._part()
        self._taken = int(state["taken"]) if state else 0

    def next(self) -> T:
        if self._taken >= self._limit:
            raise StopIteration
        item = next(self.source)
        self._taken += 1
        return item

    def get_state(self) -> dict[str, Any]:
        return {"taken": self._taken, SOURCES_KEY: [self.source.state_dict()]}
