"""``filter``: keep the items a predicate accepts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import ConfigError
from .base import Stage, describe_item

__all__ = ["Filterer"]

T = TypeVar("T")


class Filterer(Stage[T]):
    """Yields the items of ``source`` for which ``predicate(item)`` is true.

    Args:
        source: the input stage.
        predicate: a plain callable; exceptions propagate with a note naming the stage and item.
    """

    def __init__(self, source: Stage[T], predicate: Callable[[T], Any]) -> None:
        super().__init__(source)
        if not callable(predicate):
            raise ConfigError(f"filter() needs a callable, got {type(predicate).__name__}")
        self._predicate = predicate

    def next(self) -> T:
        source, predicate = self.source, self._predicate
        while True:
            item = next(source)
            try:
                keep = predicate(item)
            except Exception as exc:
                exc.add_note(f"pipeflow: raised by the predicate of {self.name} on {describe_item(item)}")
                raise
            if keep:
                return item
