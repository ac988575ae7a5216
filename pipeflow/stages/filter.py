"""``filter``: keep the items a predicate accepts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import ConfigError
from .base import SOURCES_KEY, Rewind, Stage, describe_item

__all__ = ["Filterer"]

T = TypeVar("T")


class Filterer(Stage[T]):
    """Yields the items of ``source`` for which ``predicate(item)`` is true.

    Args:
        source: the input stage.
        predicate: a plain callable; exceptions propagate with a note naming the stage and item.
    """

    passes_items = True

    elastic_roles = frozenset({"before_shard", "to_drop_point", "after_drop_point"})

    def __init__(self, source: Stage[T], predicate: Callable[[T], Any]) -> None:
        super().__init__(source)
        if not callable(predicate):
            raise ConfigError(f"filter() needs a callable, got {type(predicate).__name__}")
        self._predicate = predicate
        self._rewind = Rewind(samples=True)
        self._failed = False  # the predicate raised on the last item pulled
        self._dropped = 0  # items pulled and not delivered (rejected, or the predicate raised)

    def start(self, state: dict[str, Any] | None) -> None:
        Rewind.replay(self.source, state)
        self._rewind.restart(self.source)
        self._failed = False

    def delivered(self) -> int:
        return self._rewind.pulls - self._dropped

    def next(self) -> T:
        source, predicate, rewind = self.source, self._predicate, self._rewind
        self._failed = False
        while True:
            if rewind.pulls >= rewind.due:
                rewind.event(source, self)
            item = next(source)
            rewind.pulls += 1
            try:
                keep = predicate(item)
            except BaseException as exc:
                self._dropped += 1
                self._failed = True  # the state stays before this item
                if isinstance(exc, Exception):
                    exc.add_note(f"pipeflow: raised by the predicate of {self.description} on "
                                 f"{describe_item(item)}")
                raise
            if keep:
                return item
            self._dropped += 1

    def get_state(self) -> dict[str, Any]:
        if self._failed:
            return self._rewind.before(1)
        return {SOURCES_KEY: [self._rewind.here(self.source)]}
