"""A streaming tar reader for non-seekable streams.

:func:`iter_tar` reads ``(member name, bytes)`` pairs from any object with a ``read(n)`` method
(an S3 response body, a pipe, a local file) in one forward pass, never seeking. It understands
the formats real shard writers produce:

* plain tars and compressed ones, detected by their magic bytes: gzip (``.tar.gz``/``.tgz``,
  including multi-member gzip streams), bzip2 and xz;
* POSIX ustar (with the ``prefix`` field), PAX extended headers (``x`` per member, ``g``
  global: ``path`` and ``size`` are honoured) and GNU long names (``L``) and long link names
  (``K``), base-256 sizes;
* only regular files are yielded; directories, links, devices and FIFOs are skipped;
  zero-length members are yielded with ``b""``.

It is stricter than :mod:`tarfile` about damage, because a silently shortened shard is worse
than a loud one: a header whose checksum does not match, a member cut short, an archive that
ends without its end-of-archive block, an empty (0-byte) stream or a broken compressed stream
all raise :class:`~pipeflow.errors.CorruptDataError` naming the URL and the member or byte
offset. Corruption inside member data cannot be detected by the tar format (it has no data
checksum) and is passed through.

The module has no dependency on the rest of pipeflow's stages and can be used on its own.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Iterator
from typing import IO, Any

from ..errors import CorruptDataError

__all__ = ["BLOCK", "TarMember", "iter_tar", "open_decompressed"]

BLOCK = 512
_CHUNK = 1 << 20          # read size for decompression and large members
_MAX_READ = 1 << 26       # never ask a stream for more than this at once (file.read(n) preallocates n)
_READAHEAD = 1 << 18      # plain streams are read at least this much at a time
_MAX_SIZE = 1 << 44       # a member larger than 16 TiB is a corrupt size field

_GZIP_MAGIC = b"\x1f\x8b"
_BZ2_MAGIC = b"BZh"
_XZ_MAGIC = b"\xfd7zXZ\x00"

_REGULAR = (b"0", b"\x00", b"7")
_SKIPPED_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")   # links, devices, dirs, fifos: no data


class TarMember(tuple):
    """``(name, data, offset)``: a regular file from the archive.

    ``offset`` is the byte offset in the uncompressed tar stream of the member's first header
    (its PAX or GNU long-name header, if it has one).
    """

    __slots__ = ()

    def __new__(cls, name: str, data: bytes, offset: int) -> TarMember:
        return tuple.__new__(cls, (name, data, offset))

    @property
    def name(self) -> str:
        return self[0]

    @property
    def data(self) -> bytes:
        return self[1]

    @property
    def offset(self) -> int:
        return self[2]


def _corrupt(message: str, url: str, member: str | None = None, offset: int | None = None
             ) -> CorruptDataError:
    where = []
    if member is not None:
        where.append(f"member {member!r}")
    if offset is not None:
        where.append(f"offset {offset}")
    text = f"{message} ({', '.join(where)})" if where else message
    return CorruptDataError(text, stage="untar", key=url)


class _Decompressor:
    """A ``read(n)`` view of a compressed stream, decompressed on the fly.

    Output is produced at most ``_CHUNK`` bytes beyond what was asked for, so a small
    compressed stream that inflates to gigabytes (a "bomb") cannot exhaust memory by itself.
    Concatenated members (``cat a.gz b.gz``) are decoded one after another.
    """

    def __init__(self, raw: IO[bytes], head: bytes, kind: str, url: str) -> None:
        self._raw = raw
        self._kind = kind
        self._url = url
        self._dec: Any = self._new()
        self._input = head            # compressed bytes read but not yet fed
        self._need_input = True
        self._buf = bytearray()
        self._pos = 0                 # compressed bytes read from the raw stream

    def _new(self) -> Any:
        if self._kind == "gzip":
            return zlib.decompressobj(wbits=31)
        if self._kind == "bz2":
            return bz2.BZ2Decompressor()
        return lzma.LZMADecompressor()

    def _error(self, message: str) -> CorruptDataError:
        return _corrupt(f"{self._kind} stream {message}", self._url, offset=self._pos)

    def _raw_read(self) -> bytes:
        data = self._raw.read(_CHUNK) or b""
        self._pos += len(data)
        return data

    def _fill(self, want: int) -> None:
        while len(self._buf) < want:
            if self._dec is None:  # between members of a multi-member stream
                data = self._input or self._raw_read()
                self._input = b""
                if not data:
                    return  # clean end of stream
                if data.count(0) == len(data):
                    continue  # zero padding after the last member (as gzip(1) allows)
                if not data.startswith(_MAGICS[self._kind][: len(data)]):
                    raise self._error("has trailing garbage after a complete member")
                self._dec = self._new()
                self._input = data
                self._need_input = True
            if self._need_input:
                data = self._input or self._raw_read()
                self._input = b""
                if not data:
                    if self._kind == "gzip":
                        self._buf += self._dec.flush()
                        if self._dec.eof:
                            self._dec = None
                            continue
                    raise self._error("is truncated")
            else:
                data = getattr(self._dec, "unconsumed_tail", b"")
            try:
                self._buf += self._dec.decompress(data, max(want - len(self._buf), _CHUNK))
            except (zlib.error, OSError, lzma.LZMAError, EOFError, ValueError) as exc:
                raise self._error(f"is corrupt: {exc}") from exc
            if self._dec.eof:
                self._input = self._dec.unused_data
                self._dec = None
            elif self._kind == "gzip":
                self._need_input = not self._dec.unconsumed_tail
            else:
                self._need_input = self._dec.needs_input

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
            self._fill(_CHUNK)
            if not self._buf:
                return


_MAGICS = {"gzip": _GZIP_MAGIC, "bz2": _BZ2_MAGIC, "xz": _XZ_MAGIC}


def open_decompressed(stream: IO[bytes], url: str = "") -> tuple[Any, str]:
    """Return ``(readable, kind)`` where ``kind`` is ``"tar"``, ``"gzip"``, ``"bz2"`` or ``"xz"``.

    The compression is detected from the first bytes, so the stream need not be seekable.
    An empty stream raises :class:`CorruptDataError`.
    """
    head = _read_exact(stream, 6)
    if not head:
        raise _corrupt("empty archive (0 bytes)", url, offset=0)
    if head.startswith(_GZIP_MAGIC):
        return _Decompressor(stream, head, "gzip", url), "gzip"
    if head.startswith(_BZ2_MAGIC):
        return _Decompressor(stream, head, "bz2", url), "bz2"
    if head.startswith(_XZ_MAGIC):
        return _Decompressor(stream, head, "xz", url), "xz"
    return _Prefixed(stream, head), "tar"


class _Prefixed:
    """A plain stream read in large blocks, with already-read bytes pushed back in front.

    Tar members are read as header, data and padding: three small reads per member. On a
    network stream each read is a trip through the SDK and the retry layer, so reads smaller
    than ``_READAHEAD`` are served from one large block instead.
    """

    def __init__(self, raw: IO[bytes], head: bytes) -> None:
        self._raw = raw
        self._buf = bytearray(head)
        self._pos = 0

    def read(self, n: int) -> bytes:
        available = len(self._buf) - self._pos
        if available >= n:
            start = self._pos
            self._pos += n
            return bytes(self._buf[start:self._pos])
        parts = [bytes(self._buf[self._pos:])] if available else []
        self._buf = bytearray()
        self._pos = 0
        want = n - available
        if want >= _READAHEAD:  # large members go straight through, without a copy
            parts.append(_read_exact(self._raw, want))
            return b"".join(parts)
        block = _read_exact(self._raw, _READAHEAD)
        take = block[:want]
        parts.append(take)
        self._buf = bytearray(block[len(take):])
        return b"".join(parts)


def _read_exact(stream: Any, n: int) -> bytes:
    """Read ``n`` bytes, looping over short reads; fewer only at end of stream."""
    data = stream.read(min(n, _MAX_READ))
    if data is None:
        data = b""
    if len(data) == n or not data:
        return bytes(data)
    parts = [data]
    got = len(data)
    while got < n:
        chunk = stream.read(min(n - got, _MAX_READ))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _nts(field: bytes) -> bytes:
    end = field.find(b"\x00")
    return field if end < 0 else field[:end]


def _number(field: bytes, what: str, url: str, offset: int) -> int:
    if field[:1] in (b"\x80", b"\xff"):  # GNU base-256
        value = int.from_bytes(field[1:], "big")
        if field[0] == 0xFF:
            value -= 256 ** (len(field) - 1)
        return value
    text = _nts(field).strip(b" \x00")
    if not text:
        return 0
    try:
        return int(text, 8)
    except ValueError:
        raise _corrupt(f"bad {what} field {field!r} in tar header", url, offset=offset) from None


def _checksum_ok(header: bytes, url: str, offset: int) -> bool:
    stored = _number(header[148:156], "checksum", url, offset)
    body = header[:148] + b"        " + header[156:]
    unsigned = sum(body)
    if stored == unsigned:
        return True
    # some old writers summed the bytes as signed chars
    return stored == unsigned - 256 * sum(1 for b in body if b > 127)


def _parse_pax(data: bytes, url: str, offset: int) -> dict[str, bytes]:
    fields: dict[str, bytes] = {}
    pos = 0
    while pos < len(data):
        if data[pos] == 0:  # some writers pad with NULs
            break
        space = data.find(b" ", pos)
        if space < 0:
            raise _corrupt("malformed PAX header", url, offset=offset)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise _corrupt("malformed PAX header length", url, offset=offset) from None
        record = data[space + 1: pos + length]
        if length <= 0 or pos + length > len(data) or not record.endswith(b"\n") \
                or b"=" not in record:
            raise _corrupt("malformed PAX header record", url, offset=offset)
        key, _, value = record[:-1].partition(b"=")
        fields[key.decode("utf-8", "surrogateescape")] = value
        pos += length
    return fields


def _decode_name(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def iter_tar(stream: IO[bytes], url: str = "", *, skip: int = 0) -> Iterator[TarMember]:
    """Yield the regular files of a tar archive read from ``stream``, in archive order.

    Args:
        stream: any binary object with ``read(n)``; it is read forward only and not closed.
        url: where the stream came from, for error messages.
        skip: number of regular members to pass over without yielding (used to resume);
            their data is still read (the stream cannot seek) but not kept.

    Yields:
        :class:`TarMember` ``(name, data, offset)`` tuples.

    Raises:
        CorruptDataError: the archive is empty, truncated, has a bad header or a broken
            compressed stream. The message names ``url`` and the member or byte offset.
    """
    reader, _kind = open_decompressed(stream, url)
    offset = 0
    global_pax: dict[str, bytes] = {}
    pending_pax: dict[str, bytes] = {}
    long_name: bytes | None = None
    to_skip = skip
    entry_start: int | None = None  # first header of the current entry (extended headers too)
    while True:
        header = _read_exact(reader, BLOCK)
        if len(header) < BLOCK:
            if not header and offset > 0:
                raise _corrupt("archive ends without an end-of-archive block (truncated?)",
                               url, offset=offset)
            raise _corrupt(f"truncated tar header ({len(header)} of {BLOCK} bytes)",
                           url, offset=offset)
        if header.count(0) == BLOCK:
            # End of archive. For compressed streams, decode the rest so the gzip/bz2/xz
            # checksums are verified: the tar format itself has no data checksum.
            finish = getattr(reader, "finish", None)
            if finish is not None:
                finish()
            return
        if not _checksum_ok(header, url, offset):
            raise _corrupt("tar header checksum mismatch (corrupt or not a tar archive)",
                           url, offset=offset)
        typeflag = header[156:157]
        if entry_start is None:
            entry_start = offset
        size = _number(header[124:136], "size", url, offset)
        fields = {**global_pax, **pending_pax}
        if "size" in fields:
            try:
                size = int(fields["size"])
            except ValueError:
                raise _corrupt("bad PAX size", url, offset=offset) from None
        if size < 0 or size > _MAX_SIZE:
            raise _corrupt(f"impossible member size {size}", url, offset=offset)
        data_offset = offset + BLOCK
        padded = (size + BLOCK - 1) // BLOCK * BLOCK

        if typeflag in (b"x", b"g", b"L", b"K"):
            data = _read_exact(reader, padded)
            if len(data) < padded:
                raise _corrupt("truncated extended header", url, offset=offset)
            data = data[:size]
            if typeflag == b"x":
                pending_pax = _parse_pax(data, url, offset)
            elif typeflag == b"g":
                global_pax.update(_parse_pax(data, url, offset))
            elif typeflag == b"L":
                long_name = _nts(data)
            offset = data_offset + padded
            continue

        if "path" in fields:
            name = _decode_name(fields["path"])
        elif long_name is not None:
            name = _decode_name(long_name)
        else:
            raw = _nts(header[0:100])
            prefix = _nts(header[345:500]) if header[257:263] == b"ustar\x00" else b""
            name = _decode_name(prefix + b"/" + raw if prefix else raw)
        pending_pax = {}
        long_name = None
        member_offset, entry_start = entry_start, None

        is_regular = typeflag in _REGULAR and not (typeflag == b"\x00" and name.endswith("/"))
        if typeflag in (b"S", b"M"):
            raise _corrupt(f"unsupported GNU {'sparse' if typeflag == b'S' else 'multi-volume'}"
                           " member", url, member=name, offset=offset)
        if not is_regular and (typeflag in _SKIPPED_NO_DATA or typeflag == b"\x00"):
            offset = data_offset  # no data blocks follow these (as tarfile assumes)
            continue
        data = _read_exact(reader, size)
        if len(data) < size:
            raise _corrupt(f"member is truncated ({len(data)} of {size} bytes)",
                           url, member=name, offset=offset)
        pad = padded - size
        if pad:
            got = len(_read_exact(reader, pad))
            if got < pad:
                raise _corrupt("member padding is truncated", url, member=name, offset=offset)
        offset = data_offset + padded
        if not is_regular:
            continue  # unknown type with data (e.g. a vendor extension): skipped like tarfile
        if to_skip:
            to_skip -= 1
            continue
        yield TarMember(name, data, member_offset)
