"""``from_items``: a source over any re-iterable collection."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from ..errors import ConfigError
from .base import Stage

__all__ = ["ItemSource"]

T = TypeVar("T")


class ItemSource(Stage[T]):
    """Yields the items of a sequence in order; its state is the next index.

    It gives item ``i`` directly (``random_access``), so the builder reads it by assignment
    (:mod:`pipeflow.stages.assigned`) when it is sharded or shuffled right after.

    Non-sequence iterables (generators, sets) are materialised once at construction so every
    DataLoader worker and every epoch sees the same items in the same order.

    Args:
        items: a sequence (list, tuple, range, ...) or any finite iterable.
    """

    def __init__(self, items: Iterable[T]) -> None:
        super().__init__()
        if isinstance(items, (str, bytes)):
            raise ConfigError("from_items() needs a collection of items, not a single str/bytes")
        if not isinstance(items, Sequence):
            if not isinstance(items, Iterable):
                raise ConfigError(f"from_items() needs an iterable, got {type(items).__name__}")
            items = list(items)
        self._items: Sequence[T] = items
        self._index = self._first = 0
        self._earlier = 0  # items delivered by the runs before this one
        # the index at which next() looks up from its fast path: the end, or an earlier one
        # where a timing sample is due (one comparison per item for both)
        self._stop = 0
        self._sample_at = 0

    def start(self, state: dict[str, Any] | None) -> None:
        self._earlier += self._index - self._first
        self._index = self._first = int(state["index"]) if state else 0
        self._sample_at = self._index
        self._stop = min(len(self._items), self._sample_at)

    def delivered(self) -> int:
        return self._earlier + self._index - self._first

    def next(self) -> T:
        i = self._index
        if i >= self._stop:
            if i >= len(self._items):
                raise StopIteration
            if i >= self._sample_at:
                self._sample_at = i + self._sample_soon()
            self._stop = min(len(self._items), self._sample_at)
        self._index = i + 1
        return self._items[i]

    random_access = True
    elastic_roles = frozenset({"before_shard"})

    def at(self, i: int) -> T:
        """Item ``i`` (for reading by assignment; counted as delivered by this source)."""
        self._earlier += 1
        return self._items[i]

    def get_state(self) -> dict[str, Any]:
        return {"index": self._index}

    @property
    def items(self) -> Sequence[T]:
        return self._items

    def known_length(self) -> int | None:
        return len(self._items)

    def __len__(self) -> int:
        return len(self._items)
