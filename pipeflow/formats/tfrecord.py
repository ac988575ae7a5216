"""TFRecord framing, read and write, without TensorFlow.

A TFRecord file is a concatenation of records, each::

    uint64 length            (little endian)
    uint32 masked_crc32c(length bytes)
    byte   data[length]
    uint32 masked_crc32c(data)

:func:`iter_tfrecords` reads them from any forward-only stream (a file, an S3 body, a FIFO);
CRCs are checked unless ``check_crc=False``. Damage raises
:class:`~pipeflow.errors.CorruptDataError` naming the URL, record index and byte offset; a
stream that ends exactly between two records is a clean end.

Files written with TensorFlow's ``GZIP`` or ``ZLIB`` compression (TFX writes gzip by default)
are recognised by their content and decompressed on the fly: a plain file starts with a
record header whose CRC matches, which a compressed one does not, so detection never mistakes
one for the other. ``compression=`` names the kind explicitly instead. Offsets in errors count
uncompressed bytes.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from typing import IO, Any

from .._checks import check_choice
from .._io import read_exact
from ..errors import CorruptDataError
from ._compression import MAGICS, Decompressor, Prefixed, is_zlib_header
from .crc32c import masked_crc32c

__all__ = ["COMPRESSIONS", "TFRecordWriter", "detect_compression", "iter_records",
           "iter_tfrecords", "open_tfrecord", "write_tfrecords"]

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
_MAX_RECORD = 1 << 40

#: values of ``compression=``: detect by content, or the stored kind (TensorFlow's names)
COMPRESSIONS = ("auto", "none", "gzip", "zlib")


def _corrupt(message: str, url: str, index: int, offset: int) -> CorruptDataError:
    return CorruptDataError(f"{message} (record {index}, offset {offset})", stage="tfrecord",
                            key=url)


def detect_compression(head: bytes) -> str:
    """``"none"``, ``"gzip"`` or ``"zlib"`` for the first 12 bytes of a TFRecord file.

    A plain file's first 12 bytes are a length and its masked CRC; when they check out the
    file is plain whatever its first bytes look like (a length can start with gzip's magic).
    """
    if len(head) >= _HEADER.size:
        if masked_crc32c(head[:8]) == _HEADER.unpack(head[:_HEADER.size])[1]:
            return "none"
    if head.startswith(MAGICS["gzip"]):
        return "gzip"
    if is_zlib_header(head):
        return "zlib"
    return "none"


def open_tfrecord(stream: IO[bytes], url: str = "", compression: str = "auto") -> Any:
    """A ``read(n)`` view of the uncompressed records in ``stream`` (see the module docstring)."""
    check_choice(compression, "compression", COMPRESSIONS)
    head = read_exact(stream, _HEADER.size)
    kind = detect_compression(head) if compression == "auto" else compression
    if kind == "none":
        return Prefixed(stream, head)

    def error(message: str, offset: int) -> CorruptDataError:
        return CorruptDataError(f"{message} (compressed offset {offset})", stage="tfrecord",
                                key=url)

    return Decompressor(stream, head, kind, error)


def iter_records(stream: IO[bytes], url: str = "", *, check_crc: bool = True, skip: int = 0,
                 compression: str = "auto") -> Iterator[tuple[int, int, bytes]]:
    """Yield ``(index, offset, payload)`` for every record; arguments as :func:`iter_tfrecords`.

    ``offset`` is the record's byte offset in the uncompressed stream.
    """
    reader = open_tfrecord(stream, url, compression)
    index = 0
    offset = 0
    while True:
        header = read_exact(reader, _HEADER.size)
        if not header:
            return
        if len(header) < _HEADER.size:
            raise _corrupt(f"truncated record header ({len(header)} of 12 bytes)", url, index,
                           offset)
        length, length_crc = _HEADER.unpack(header)
        checking = check_crc and index >= skip
        if checking and masked_crc32c(header[:8]) != length_crc:
            raise _corrupt("length CRC mismatch", url, index, offset)
        if length > _MAX_RECORD:
            raise _corrupt(f"impossible record length {length}", url, index, offset)
        payload = read_exact(reader, length)
        footer = read_exact(reader, 4)
        if len(payload) < length or len(footer) < 4:
            raise _corrupt(f"truncated record ({len(payload)} of {length} payload bytes)", url,
                           index, offset)
        if checking and masked_crc32c(payload) != _FOOTER.unpack(footer)[0]:
            raise _corrupt("data CRC mismatch", url, index, offset)
        if index >= skip:
            yield index, offset, payload
        index += 1
        offset += _HEADER.size + length + 4


def iter_tfrecords(stream: IO[bytes], url: str = "", *, check_crc: bool = True,
                   skip: int = 0, compression: str = "auto") -> Iterator[bytes]:
    """Yield the payload of every record in ``stream``.

    Args:
        stream: a binary object with ``read(n)``; read forward only, not closed.
        url: where the stream came from, for error messages.
        check_crc: verify both CRCs of every record (on by default).
        skip: records to pass over without yielding (to resume); their CRCs are not checked.
        compression: ``"auto"`` (detect gzip/zlib by content), ``"none"``, ``"gzip"`` or
            ``"zlib"``.

    Raises:
        CorruptDataError: a truncated record, a CRC mismatch or a broken compressed stream.
        ConfigError: an unknown ``compression``.
    """
    for _index, _offset, payload in iter_records(stream, url, check_crc=check_crc, skip=skip,
                                                 compression=compression):
        yield payload


class TFRecordWriter:
    """Writes records to a binary file object or a path.

    Example::

        with TFRecordWriter("train-0.tfrecord") as w:
            w.write(encode_example({"image": png_bytes, "label": 3}))
    """

    def __init__(self, target: str | os.PathLike[str] | IO[bytes]) -> None:
        if isinstance(target, (str, os.PathLike)):
            self._file: IO[bytes] = open(target, "wb")  # noqa: SIM115 - closed in close()
            self._owned = True
        else:
            self._file = target
            self._owned = False
        self.count = 0

    def write(self, payload: bytes) -> None:
        """Append one record."""
        length = struct.pack("<Q", len(payload))
        self._file.write(length + struct.pack("<I", masked_crc32c(length)))
        self._file.write(payload)
        self._file.write(struct.pack("<I", masked_crc32c(payload)))
        self.count += 1

    def close(self) -> None:
        if self._owned:
            self._file.close()
        else:
            self._file.flush()

    def __enter__(self) -> TFRecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_tfrecords(target: str | os.PathLike[str] | IO[bytes], payloads: Iterable[bytes]) -> int:
    """Write every payload as one record; returns how many were written."""
    with TFRecordWriter(target) as writer:
        for payload in payloads:
            writer.write(payload)
        return writer.count
