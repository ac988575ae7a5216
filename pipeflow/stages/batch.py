"""``batch``: group consecutive items into lists, optionally collated to tensors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import default_collate

from .._checks import check_int
from ..errors import ConfigError
from .base import SOURCES_KEY, Rewind, Stage

__all__ = ["Batcher"]


class Batcher(Stage[Any]):
    """Groups items into lists of ``size``; the last one may be short unless ``drop_last``.

    A batch is assembled within one ``next`` call, so the state between calls is just the
    source's position: no partial batch is ever saved. When an error ends a batch half
    assembled, the state is the position before its first item, so nothing in it is lost.

    Args:
        source: the input stage.
        size: items per batch (>= 1).
        drop_last: drop a final batch shorter than ``size``.
        collate: ``False`` for plain lists, ``True`` for ``torch.utils.data.default_collate``,
            or any callable applied to each list.
    """

    elastic_roles = frozenset({"drop_point", "after_drop_point"})

    @classmethod
    def step_size(cls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
        size = args[0] if args else kwargs.get("size")
        return size if isinstance(size, int) else None

    def __init__(self, source: Stage[Any], size: int, *, drop_last: bool = False,
                 collate: bool | Callable[[list[Any]], Any] = False) -> None:
        super().__init__(source)
        check_int(size, "batch(size=...)", low=1)
        if collate is True:
            collate = default_collate
        elif collate is not False and not callable(collate):
            raise ConfigError(f"batch(collate=...) must be a bool or a callable, got {collate!r}")
        self._size = size
        self._drop_last = drop_last
        self._collate: Callable[[list[Any]], Any] | None = collate or None
        self._rewind = Rewind()
        self._undelivered = 0  # items of a batch an error ended
        self._batches = 0  # delivered, over every run
        self._sample_at = 0  # the batch count at which the next timing sample is due

    def start(self, state: dict[str, Any] | None) -> None:
        Rewind.replay(self.source, state)
        self._rewind.restart(self.source)
        self._undelivered = 0

    def delivered(self) -> int:
        return self._batches

    def next(self) -> Any:
        batch: list[Any] = []
        source, size, rewind = self.source, self._size, self._rewind
        self._undelivered = 0
        rewind.boundary(source)
        if self._batches >= self._sample_at:
            self._sample_at = self._batches + self._sample_soon()
        append = batch.append
        try:
            while len(batch) < size:
                append(next(source))
        except StopIteration:
            rewind.pulls += len(batch)
            if not batch or self._drop_last:
                raise
        except BaseException:
            rewind.pulls += len(batch)
            self._undelivered = len(batch)  # pulled, never delivered: the state stays before them
            raise
        else:
            rewind.pulls += size
        if self._collate is None:
            self._batches += 1
            return batch
        self._undelivered = len(batch)
        out = self._collate(batch)
        self._undelivered = 0
        self._batches += 1
        return out

    def get_state(self) -> dict[str, Any]:
        if self._undelivered:
            return self._rewind.before(self._undelivered)
        return {SOURCES_KEY: [self._rewind.here(self.source)]}
