"""``take``: stop after a number of items."""

from __future__ import annotations

from typing import Any, TypeVar

from .._checks import check_int
from .base import SOURCES_KEY, Stage

__all__ = ["Taker"]

T = TypeVar("T")


class Taker(Stage[T]):
    """Yields at most ``n`` items of ``source``.

    Args:
        source: the input stage.
        n: how many items to yield (>= 0).
    """

    def __init__(self, source: Stage[T], n: int) -> None:
        super().__init__(source)
        check_int(n, "take(n=...)", low=0)
        self._n = n
        self._taken = 0

    def start(self, state: dict[str, Any] | None) -> None:
        self._taken = int(state["taken"]) if state else 0

    def next(self) -> T:
        if self._taken >= self._n:
            raise StopIteration
        item = next(self.source)
        self._taken += 1
        return item

    def get_state(self) -> dict[str, Any]:
        return {"taken": self._taken, SOURCES_KEY: [self.source.state_dict()]}
