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
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from typing import IO, Any

from ..errors import CorruptDataError
from .crc32c import masked_crc32c

__all__ = ["TFRecordWriter", "iter_tfrecords", "write_tfrecords"]

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
_MAX_READ = 1 << 26
_MAX_RECORD = 1 << 40


def _read_exact(stream: Any, n: int) -> bytes:
    parts = []
    got = 0
    while got < n:
        chunk = stream.read(min(n - got, _MAX_READ))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _corrupt(message: str, url: str, index: int, offset: int) -> CorruptDataError:
    return CorruptDataError(f"{message} (record {index}, offset {offset})", stage="tfrecord",
                            key=url)


def iter_tfrecords(stream: IO[bytes], url: str = "", *, check_crc: bool = True,
                   skip: int = 0) -> Iterator[bytes]:
    """Yield the payload of every record in ``stream``.

    Args:
        stream: a binary object with ``read(n)``; read forward only, not closed.
        url: where the stream came from, for error messages.
        check_crc: verify both CRCs of every record (on by default).
        skip: records to pass over without yielding (to resume); their CRCs are not checked.

    Raises:
        CorruptDataError: a truncated record or a CRC mismatch.
    """
    index = 0
    offset = 0
    while True:
        header = _read_exact(stream, _HEADER.size)
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
        payload = _read_exact(stream, length)
        footer = _read_exact(stream, 4)
        if len(payload) < length or len(footer) < 4:
            raise _corrupt(f"truncated record ({len(payload)} of {length} payload bytes)", url,
                           index, offset)
        if checking and masked_crc32c(payload) != _FOOTER.unpack(footer)[0]:
            raise _corrupt("data CRC mismatch", url, index, offset)
        if index >= skip:
            yield payload
        index += 1
        offset += _HEADER.size + length + 4


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
