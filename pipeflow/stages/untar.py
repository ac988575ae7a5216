"""``untar()``: expand tar shards into their members."""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any

from ..formats.tar import iter_tar
from ..items import Record
from ._expand import ExpandingStage, OnError
from .base import Stage

__all__ = ["Untarrer"]


class Untarrer(ExpandingStage):
    """Reads each opened tar shard and yields one :class:`~pipeflow.items.Record` per member.

    Input items are :class:`~pipeflow.items.Opened` ``(url, stream)`` (from ``open()``),
    whole-object :class:`~pipeflow.items.Record` s (``open(read=True)``), ``(url, stream)``
    tuples or local paths. Output: ``Record(name=member path, data=bytes, url=shard URL)``.
    Plain, gzip, bzip2 and xz tars are detected by magic bytes; only regular files are
    yielded (zero-length ones too); each stream is closed once read.

    Args:
        source: the input stage.
        on_error: ``"raise"`` a :class:`~pipeflow.errors.CorruptDataError` naming the shard
            URL and member/offset, or ``"skip"``: abandon the rest of the damaged shard and
            count it under ``skipped_objects`` in ``Pipeline.stats()`` (members already
            yielded from it stay yielded).

    State: the upstream position of the current shard and the number of members yielded
    from it; resuming re-opens that shard and passes over those members.
    """

    verb = "untar"

    splits_objects = True

    def __init__(self, source: Stage[Any], *, on_error: OnError = "raise") -> None:
        super().__init__(source, on_error=on_error)

    def expand(self, url: str, stream: IO[bytes], skip: int) -> Iterator[Record]:
        for member in iter_tar(stream, url, skip=skip):
            yield Record(member[0], member[1], url)
