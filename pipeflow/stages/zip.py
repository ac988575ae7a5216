"""``zip``: tuples of one item from each of several pipelines."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .base import Stage

__all__ = ["Zipper"]


class Zipper(Stage[tuple[Any, ...]]):
    """Yields ``(a, b, ...)`` with one item from every source; stops at the shortest."""

    def __init__(self, *sources: Stage[Any]) -> None:
        super().__init__(*sources)
        if len(sources) < 2:
            raise ConfigError("zip() needs at least two pipelines")

    def next(self) -> tuple[Any, ...]:
        return tuple([next(s) for s in self.sources])
