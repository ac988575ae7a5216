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

    replays_input = True

    elastic_roles = frozenset({"to_drop_point"})

    @classmethod
    def elastic_expansion(cls, state: dict[str, Any], after: bool) -> tuple[int, Any, bool] | None:
        offset = int(state.get("offset", 0))
        return offset, state[SOURCES_KEY][0], bool(offset) or not after

    def __init__(self, source: Stage[Any]) -> None:
        super().__init__(source)
        self._batch: list[Any] = []
        self._offset = 0
        self._before: dict[str, Any] = {}
        # the offset at which next() leaves its fast path: the batch's end, or an earlier one
        # where a timing sample is due (one comparison per item for both)
        self._end = 0
        self._loaded = 0  # elements of every batch loaded, less those never delivered
        self._sample_at = 0  # the item count at which the next timing sample is due

    def start(self, state: dict[str, Any] | None) -> None:
        self._loaded -= len(self._batch) - self._offset
        self._batch, self._offset, self._end = [], 0, 0
        self._before = {}
        if state:
            skip = int(state["offset"])
            if skip:
                self._turn(0)
                self._offset = skip
                self._loaded -= skip  # delivered by an earlier run
                self._end = skip  # the next call looks at where it stands

    def delivered(self) -> int:
        return self._loaded - len(self._batch) + self._offset

    def next(self) -> Any:
        offset = self._offset
        if offset >= self._end:
            offset = self._turn(offset)
        self._offset = offset + 1
        return self._batch[offset]

    def _turn(self, offset: int) -> int:
        """The offset to deliver next, at the end of the batch (loading the next one) or where
        a timing sample is due (asking for it)."""
        batch = self._batch
        if offset < len(batch):
            done = self._loaded - len(batch) + offset  # items delivered so far
            self._sample_at = done + self._sample_soon()
            self._end = min(len(batch), offset + self._sample_at - done)
            return offset
        source = self.source
        while True:  # inline, not a method: this runs once per batch
            self._before = source.state_dict()
            got = next(source)
            if not isinstance(got, (list, tuple)):
                raise ConfigError(f"unbatch() expects lists or tuples, got {type(got).__name__} "
                                  f"in {self.name}")
            if got:
                break
        self._batch = batch = list(got)
        size = len(batch)
        self._loaded = loaded = self._loaded + size
        ahead = self._sample_at - loaded + size  # where in this batch the next sample is due
        self._end = ahead if ahead < size else size
        return 0

    def get_state(self) -> dict[str, Any]:
        if self._offset >= len(self._batch):
            return {SOURCES_KEY: [self.source.state_dict()], "offset": 0}
        return {SOURCES_KEY: [self._before], "offset": self._offset}
