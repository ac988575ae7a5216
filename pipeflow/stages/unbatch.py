"""``unbatch``: flatten lists of items."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .base import SOURCES_KEY, Stage

__all__ = ["Unbatcher"]


class Unbatcher(Stage[Any]):
    """Yields the elements of each list or tuple produced by ``source``.

    State: the source position *before* the current batch plus the number of its elements
    already yielded; resuming re-reads that one batch and skips what was delivered.
    """

    def __init__(self, source: Stage[Any]) -> None:
        super().__init__(source)
        self._batch: list[Any] = []
        self._offset = 0
        self._before: dict[str, Any] = {}

    def start(self, state: dict[str, Any] | None) -> None:
        self._batch, self._offset = [], 0
        self._before = {}
        if state:
            skip = int(state["offset"])
            if skip:
                self._load_next_batch()
                self._offset = skip

    def _load_next_batch(self) -> None:
        self._before = self.source.state_dict()
        batch = next(self.source)
        if not isinstance(batch, (list, tuple)):
            raise ConfigError(f"unbatch() expects lists or tuples, got {type(batch).__name__} in {self.name}")
        self._batch, self._offset = list(batch), 0

    def next(self) -> Any:
        while self._offset >= len(self._batch):
            self._load_next_batch()
        item = self._batch[self._offset]
        self._offset += 1
        return item

    def get_state(self) -> dict[str, Any]:
        if self._offset >= len(self._batch):
            return {SOURCES_KEY: [self.source.state_dict()], "offset": 0}
        return {SOURCES_KEY: [self._before], "offset": self._offset}
