"""``batch``: group consecutive items into lists, optionally collated to tensors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ConfigError
from .base import Stage

__all__ = ["Batcher"]


def _default_collate(batch: list[Any]) -> Any:
    from torch.utils.data import default_collate

    return default_collate(batch)


class Batcher(Stage[Any]):
    """Groups items into lists of ``size``; the last one may be short unless ``drop_last``.

    A batch is assembled within one ``next`` call, so the state between calls is just the
    source's position: no partial batch is ever saved.

    Args:
        source: the input stage.
        size: items per batch (>= 1).
        drop_last: drop a final batch shorter than ``size``.
        collate: ``False`` for plain lists, ``True`` for ``torch.utils.data.default_collate``,
            or any callable applied to each list.
    """

    def __init__(self, source: Stage[Any], size: int, *, drop_last: bool = False,
                 collate: bool | Callable[[list[Any]], Any] = False) -> None:
        super().__init__(source)
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError(f"batch() needs a positive int size, got {size!r}")
        if collate is True:
            collate = _default_collate
        elif collate is not False and not callable(collate):
            raise ConfigError(f"batch(collate=...) must be a bool or a callable, got {collate!r}")
        self._size = size
        self._drop_last = drop_last
        self._collate: Callable[[list[Any]], Any] | None = collate or None

    def next(self) -> Any:
        batch: list[Any] = []
        source, size = self.source, self._size
        try:
            while len(batch) < size:
                batch.append(next(source))
        except StopIteration:
            if not batch or self._drop_last:
                raise
        if self._collate is not None:
            return self._collate(batch)
        return batch
