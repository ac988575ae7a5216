"""``read_tfrecord()`` and ``tfrecord_stream()``: TFRecord files and pipe-mode streams."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from typing import IO, Any

from .._checks import check_bool, check_choice
from ..errors import ConfigError, CorruptDataError, ObjectNotFoundError
from ..formats.example import ExampleFormatError, decode_example
from ..formats.tfrecord import COMPRESSIONS, iter_records
from ..items import Record
from ._expand import ExpandingStage, OnError
from .base import Stage

__all__ = ["PerProcessTFRecordStream", "TFRecordReader", "TFRecordStream"]


def _item(url: str, index: int, offset: int, payload: bytes, parse_example: bool) -> Any:
    key = f"{url}#{index}"
    if not parse_example:
        return Record(key, payload, url)
    try:
        features = decode_example(payload)
    except ExampleFormatError as exc:
        raise CorruptDataError(f"not a tf.train.Example: {exc} (record {index}, offset {offset})",
                               stage="tfrecord", key=url) from exc
    return {"__key__": key, "__url__": url, **features}


def _check_options(verb: str, check_crc: Any, parse_example: Any, compression: Any) -> None:
    check_bool(check_crc, f"{verb}(check_crc=...)")
    check_bool(parse_example, f"{verb}(parse_example=...)")
    check_choice(compression, f"{verb}(compression=...)", COMPRESSIONS)


class TFRecordReader(ExpandingStage):
    """Reads each opened TFRecord file and yields its records.

    With ``parse_example=True`` each record is parsed as a ``tf.train.Example`` into a dict
    ``{"__key__": "<url>#<index>", "__url__": url, feature: values}`` where values are
    ``list[bytes]``, ``float32`` or ``int64`` numpy arrays. With ``parse_example=False`` it
    yields ``Record("<url>#<index>", payload, url)``.

    Args:
        source: the input stage (``Opened`` streams, whole-object Records or local paths).
        check_crc: verify the CRC-32C of every length and payload (on by default).
        parse_example: parse payloads as ``tf.train.Example``.
        on_error: ``"raise"`` :class:`~pipeflow.errors.CorruptDataError` (CRC mismatch,
            truncation, a payload that is not an Example) naming URL, record index and
            offset, or ``"skip"`` the rest of that file and count it as ``skipped_objects``.
        compression: ``"auto"`` reads plain, gzip- and zlib-compressed files (TensorFlow's
            ``GZIP``/``ZLIB``; TFX writes gzip), told apart by content; ``"none"``,
            ``"gzip"`` or ``"zlib"`` insist on one kind.

    State: the upstream position of the current file and the records read from it.
    """

    verb = "read_tfrecord"

    def __init__(self, source: Stage[Any], *, check_crc: bool = True, parse_example: bool = True,
                 on_error: OnError = "raise", compression: str = "auto") -> None:
        super().__init__(source, on_error=on_error)
        _check_options("read_tfrecord", check_crc, parse_example, compression)
        self.check_crc = check_crc
        self.parse_example = parse_example
        self.compression = compression

    def expand(self, url: str, stream: IO[bytes], skip: int) -> Iterator[Any]:
        for index, offset, payload in iter_records(stream, url, check_crc=self.check_crc,
                                                   skip=skip, compression=self.compression):
            yield _item(url, index, offset, payload, self.parse_example)


class TFRecordStream(Stage[Any]):
    """A source reading one continuous stream of TFRecords from a FIFO, pipe or file.

    This is how SageMaker Pipe mode delivers a channel: the records of all files
    concatenated into one FIFO per epoch (``/opt/ml/input/data/<channel>_<epoch>``).
    ``path`` may contain ``{epoch}``, ``{rank}`` and ``{worker}``; they are filled in from the
    run context when the stream is opened. A FIFO can be read by one reader only, so with
    several ranks or DataLoader workers ``path`` must contain ``{rank}``/``{worker}`` (each
    process then reads its own stream and no automatic sharding is added), or be a regular
    file (read by every process and sharded by record).

    Args:
        path: the FIFO or file path (a template, see above).
        check_crc: verify CRCs (on by default).
        parse_example: parse payloads as ``tf.train.Example``.
        compression: ``"auto"`` (plain, gzip or zlib, by content), ``"none"``, ``"gzip"`` or
            ``"zlib"``.

    State: the number of records consumed; resuming reopens the stream and passes over them
    (for a FIFO the writer must replay the stream from its start).
    """

    def __init__(self, path: str | os.PathLike[str], *, check_crc: bool = True,
                 parse_example: bool = True, compression: str = "auto") -> None:
        super().__init__()
        if not isinstance(path, (str, os.PathLike)):
            raise ConfigError(f"tfrecord_stream() needs a path, got {type(path).__name__}")
        _check_options("tfrecord_stream", check_crc, parse_example, compression)
        self.path = os.fspath(path)
        self.check_crc = check_crc
        self.parse_example = parse_example
        self.compression = compression
        self._file: IO[bytes] | None = None
        self._iter: Iterator[tuple[int, int, bytes]] | None = None
        self._count = 0
        self._url = self.path

    def start(self, state: dict[str, Any] | None) -> None:
        self._count = int(state.get("records", 0)) if state else 0
        ctx = self.context
        try:
            self._url = self.path.format(epoch=ctx.epoch, rank=ctx.rank, worker=ctx.worker_id)
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"tfrecord_stream() path {self.path!r} has an unknown placeholder "
                              "(use {epoch}, {rank}, {worker})") from exc
        try:
            is_fifo = stat.S_ISFIFO(os.stat(self._url).st_mode)
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"no such FIFO or file: {exc}", url=self._url,
                                      backend="local", op="open") from exc
        if is_fifo and ctx.num_shards > 1 and not self.is_sharder:
            raise ConfigError(
                f"{self._url} is a FIFO, which only one process can read, but this pipeline "
                f"runs as {ctx.num_shards} ranks x workers; put {{rank}}/{{worker}} in the path "
                "(one stream each) or use num_workers=0")
        self._file = open(self._url, "rb")  # noqa: SIM115 - closed in close()
        self._iter = iter_records(self._file, self._url, check_crc=self.check_crc,
                                  skip=self._count, compression=self.compression)

    def next(self) -> Any:
        if self._iter is None:
            raise StopIteration
        index, offset, payload = next(self._iter)
        item = _item(self._url, index, offset, payload, self.parse_example)
        self._count += 1
        return item

    def get_state(self) -> dict[str, Any]:
        return {"records": self._count}

    def stop(self) -> None:
        if self._iter is not None:
            self._iter.close()  # type: ignore[attr-defined]
            self._iter = None
        if self._file is not None:
            self._file.close()
            self._file = None


class PerProcessTFRecordStream(TFRecordStream):
    """A :class:`TFRecordStream` whose path names one stream per rank/worker.

    It is its own shard (``is_sharder``), so no automatic sharding is added after it.
    """

    is_sharder = True
