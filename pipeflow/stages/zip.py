"""``zip``: tuples of one item from each of several pipelines."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .base import SOURCES_KEY, Stage

__all__ = ["Zipper"]


class Zipper(Stage[tuple[Any, ...]]):
    """Yields ``(a, b, ...)`` with one item from every source; stops at the shortest."""

    def __init__(self, *sources: Stage[Any]) -> None:
        super().__init__(*sources)
        if len(sources) < 2:
            raise ConfigError("zip() needs at least two pipelines")

    def start(self, state: dict[str, Any] | None) -> None:
        self._before: list[dict[str, Any]] = []

    def next(self) -> tuple[Any, ...]:
        # the inputs already read when a later one fails must not lose their item
        before = self._before = []
        items = []
        for src in self.sources:
            before.append(src.state_dict())
            items.append(next(src))
        self._before = []
        return tuple(items)

    def get_state(self) -> dict[str, Any]:
        before = self._before
        states = [before[i] if i < len(before) - 1 else s.state_dict() for i, s in enumerate(self.sources)]
        return {SOURCES_KEY: states}
