"""Streaming decompression for the tar and TFRecord readers, detected by content.

:class:`Decompressor` is a ``read(n)`` view of a gzip, zlib, bzip2 or xz stream; it never
seeks, bounds how much it inflates ahead of the reader, and reports damage through an error
factory the caller supplies, so each format names its own stage, URL and offset.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable
from typing import IO, Any

from .._io import read_exact
from ..errors import CorruptDataError

__all__ = ["MAGICS", "Decompressor", "Prefixed", "sniff"]

CHUNK = 1 << 20           # read size for decompression
READAHEAD = 1 << 18       # plain streams are read at least this much at a time

#: leading bytes of each compressed kind (zlib has no fixed magic: see :func:`is_zlib_header`)
MAGICS = {"gzip": b"\x1f\x8b", "bz2": b"BZh", "xz": b"\xfd7zXZ\x00"}

#: ``error(message, offset)``: build the caller's exception for damage at a compressed offset
ErrorFactory = Callable[[str, int], CorruptDataError]


def is_zlib_header(head: bytes) -> bool:
    """True when ``head`` starts with a valid zlib (RFC 1950) header using deflate."""
    if len(head) < 2:
        return False
    cmf, flg = head[0], head[1]
    return cmf & 0x0F == 8 and cmf >> 4 <= 7 and (cmf << 8 | flg) % 31 == 0


def sniff(head: bytes) -> str | None:
    """The compressed kind ``head`` starts with (``"gzip"``, ``"bz2"``, ``"xz"``), else None.

    zlib is not sniffed here: its two-byte header is too easily matched by chance, so only a
    reader that can rule out its own plain format first (TFRecord, by its header CRC) asks
    :func:`is_zlib_header`.
    """
    for kind, magic in MAGICS.items():
        if head.startswith(magic):
            return kind
    return None


class Decompressor:
    """A ``read(n)`` view of a compressed stream, decompressed on the fly.

    Output is produced at most ``CHUNK`` bytes beyond what was asked for, so a small
    compressed stream that inflates to gigabytes (a "bomb") cannot exhaust memory by itself.
    Concatenated gzip/bz2/xz members (``cat a.gz b.gz``) are decoded one after another.
    """

    def __init__(self, raw: IO[bytes], head: bytes, kind: str, error: ErrorFactory) -> None:
        self._raw = raw
        self._kind = kind
        self._zlib = kind in ("gzip", "zlib")
        self._make_error = error
        self._dec: Any = self._new()
        self._input = head            # compressed bytes read but not yet fed
        self._need_input = True
        self._buf = bytearray()
        self._pos = 0                 # compressed bytes read from the raw stream

    def _new(self) -> Any:
        if self._zlib:
            return zlib.decompressobj(wbits=31 if self._kind == "gzip" else 15)
        if self._kind == "bz2":
            return bz2.BZ2Decompressor()
        return lzma.LZMADecompressor()

    def _error(self, message: str) -> CorruptDataError:
        return self._make_error(f"{self._kind} stream {message}", self._pos)

    def _raw_read(self) -> bytes:
        data = self._raw.read(CHUNK) or b""
        self._pos += len(data)
        return data

    def _next_member(self) -> bool:
        """Between members: start the next one; False at the clean end of the stream."""
        while True:
            data = self._input or self._raw_read()
            self._input = b""
            if not data:
                return False
            if data.count(0) == len(data):
                continue  # zero padding after the last member (as gzip(1) allows)
            magic = MAGICS.get(self._kind)
            if magic is None or not data.startswith(magic[: len(data)]):
                raise self._error("has trailing garbage after a complete member")
            self._dec = self._new()
            self._input = data
            self._need_input = True
            return True

    def _feed(self, want: int) -> None:
        if self._need_input:
            data = self._input or self._raw_read()
            self._input = b""
            if not data:
                if self._zlib:
                    self._buf += self._dec.flush()
                    if self._dec.eof:
                        self._dec = None
                        return
                raise self._error("is truncated")
        else:
            data = getattr(self._dec, "unconsumed_tail", b"")
        try:
            self._buf += self._dec.decompress(data, max(want - len(self._buf), CHUNK))
        except (zlib.error, OSError, lzma.LZMAError, EOFError, ValueError) as exc:
            raise self._error(f"is corrupt: {exc}") from exc
        if self._dec.eof:
            self._input = self._dec.unused_data
            self._dec = None
        elif self._zlib:
            self._need_input = not self._dec.unconsumed_tail
        else:
            self._need_input = self._dec.needs_input

    def _fill(self, want: int) -> None:
        while len(self._buf) < want:
            if self._dec is None and not self._next_member():
                return  # clean end of stream
            self._feed(want)

    def read(self, n: int) -> bytes:
        if len(self._buf) < n:
            self._fill(n)
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def finish(self) -> None:
        """Decode to the end of the stream so the trailing checksums are verified."""
        while True:
            self._buf.clear()
            self._fill(CHUNK)
            if not self._buf:
                return


class Prefixed:
    """A plain stream read in large blocks, with already-read bytes pushed back in front.

    Tar members are read as header, data and padding: three small reads per member. On a
    network stream each read is a trip through the SDK and the retry layer, so reads smaller
    than ``READAHEAD`` are served from one large block instead.

    Every byte is copied once on its way out (the block is kept as read, never re-sliced into
    a new buffer): on shards of 300 KB JPEGs the copies were most of the reader's CPU.
    """

    def __init__(self, raw: IO[bytes], head: bytes) -> None:
        self._raw = raw
        self._buf = bytes(head)
        self._pos = 0

    def read(self, n: int) -> bytes:
        buf, pos = self._buf, self._pos
        available = len(buf) - pos
        if available >= n:
            self._pos = pos + n
            return buf[pos:pos + n]
        want = n - available
        with memoryview(buf) as view:
            if want >= READAHEAD:  # large reads go straight through
                self._buf, self._pos = b"", 0
                data = read_exact(self._raw, want)
                return b"".join((view[pos:], data)) if available else data
            block = read_exact(self._raw, READAHEAD)
            self._buf, self._pos = block, min(want, len(block))
            with memoryview(block) as fresh:
                return b"".join((view[pos:], fresh[:want]))
