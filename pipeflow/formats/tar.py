"""A streaming tar reader for non-seekable streams.

:func:`iter_tar` reads ``(member name, bytes)`` pairs from any object with a ``read(n)`` method
(an S3 response body, a pipe, a local file) in one forward pass, never seeking. It understands
the formats real shard writers produce:

* plain tars and compressed ones, detected by their magic bytes: gzip (``.tar.gz``/``.tgz``,
  including multi-member gzip streams), bzip2 and xz;
* POSIX ustar (with the ``prefix`` field), PAX extended headers (``x`` per member, ``g``
  global: ``path`` and ``size`` are honoured) and GNU long names (``L``) and long link names
  (``K``), base-256 sizes;
* GNU sparse members, old GNU (type ``S``) and PAX 0.0, 0.1 and 1.0 (what
  ``tar --sparse`` writes), expanded to the file's bytes with its holes as zeros, under the
  file's real name, as :mod:`tarfile` gives them;
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

import io
from collections.abc import Iterator
from typing import IO, Any, NamedTuple
from zlib import adler32

from .._io import read_exact
from ..errors import CorruptDataError
from ._compression import Decompressor, Prefixed, sniff

__all__ = ["BLOCK", "TarMember", "iter_tar", "open_decompressed"]

BLOCK = 512
_MAX_SIZE = 1 << 44       # a member larger than 16 TiB is a corrupt size field
#: a sparse member is expanded in memory; beyond this real size it is refused, not inflated
MAX_SPARSE_SIZE = 1 << 32

_REGULAR = (b"0", b"\x00", b"7", b"S")
_SKIPPED_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")   # links, devices, dirs, fifos: no data
_EXTENDED = (b"x", b"g", b"L", b"K")
_NONE: dict[str, bytes] = {}  # the PAX fields of a member without any (never modified)


class TarMember(NamedTuple):
    """A regular file from the archive.

    ``offset`` is the byte offset in the uncompressed tar stream of the member's first header
    (its PAX or GNU long-name header, if it has one).
    """

    name: str
    data: bytes
    offset: int


def _corrupt(message: str, url: str, member: str | None = None, offset: int | None = None
             ) -> CorruptDataError:
    where = []
    if member is not None:
        where.append(f"member {member!r}")
    if offset is not None:
        where.append(f"offset {offset}")
    text = f"{message} ({', '.join(where)})" if where else message
    return CorruptDataError(text, stage="untar", key=url)


#: streams whose small reads are cheap calls into C (a local file, bytes in memory): a plain tar
#: is read from them as it is. :class:`Prefixed` exists for streams whose every read is a trip
#: through an SDK; over these it only added a copy of every byte and a Python call per read
#: (about a tenth of the reader's CPU on shards of 100 KB JPEGs)
_CHEAP_READS = (io.BufferedReader, io.BytesIO)


def _look_ahead(stream: Any) -> bytes | None:
    """The first 6 bytes of a stream in :data:`_CHEAP_READS`, left unread; None when they are
    not all there yet (the caller then reads them as for any stream)."""
    if isinstance(stream, io.BufferedReader):
        head = stream.peek(6)[:6]
    else:
        start = stream.tell()
        head = stream.read(6)
        stream.seek(start)
    return head if len(head) == 6 else None


def open_decompressed(stream: IO[bytes], url: str = "") -> tuple[Any, str]:
    """Return ``(readable, kind)`` where ``kind`` is ``"tar"``, ``"gzip"``, ``"bz2"`` or ``"xz"``.

    The compression is detected from the first bytes, so the stream need not be seekable.
    An empty stream raises :class:`CorruptDataError`.
    """
    if type(stream) in _CHEAP_READS:
        head = _look_ahead(stream)
        if head is not None and sniff(head) is None:
            return stream, "tar"
    head = read_exact(stream, 6)
    if not head:
        raise _corrupt("empty archive (0 bytes)", url, offset=0)
    kind = sniff(head)
    if kind is None:
        return Prefixed(stream, head), "tar"

    def error(message: str, offset: int) -> CorruptDataError:
        return _corrupt(message, url, offset=offset)

    return Decompressor(stream, head, kind, error), kind


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


def _byte_sum(header: bytes) -> int:
    """The sum of a header block's bytes, in C: ``adler32`` started from 0 keeps the plain sum
    of its bytes modulo 65521, which 256 bytes (at most 65,280) never reach. ``sum(header)``
    walked the 512 bytes in the interpreter: 2 us a header, a visible share of the reader."""
    return (adler32(header[:256], 0) & 0xFFFF) + (adler32(header[256:BLOCK], 0) & 0xFFFF)


def _checksum_ok(header: bytes, url: str, offset: int) -> bool:
    stored = _number(header[148:156], "checksum", url, offset)
    # the checksum field itself counts as eight spaces
    unsigned = _byte_sum(header) - sum(header[148:156]) + 8 * 32
    if stored == unsigned:
        return True
    body = header[:148] + b"        " + header[156:]
    # some old writers summed the bytes as signed chars
    return stored == unsigned - 256 * sum(1 for b in body if b > 127)


def _parse_pax(data: bytes, url: str, offset: int) -> list[tuple[str, bytes]]:
    """The records of a PAX header in order (a key may repeat: GNU sparse 0.0 maps do)."""
    records: list[tuple[str, bytes]] = []
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
        records.append((key.decode("utf-8", "surrogateescape"), value))
        pos += length
    return records


def _decode_name(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


class _Sparse:
    """Where the data blocks of a sparse member go: ``[(offset, size), ...]`` in a file of
    ``real_size`` bytes. ``map_in_data`` (PAX 1.0) means the map precedes the data blocks."""

    def __init__(self, real_size: int, chunks: list[tuple[int, int]] | None,
                 map_in_data: bool = False) -> None:
        self.real_size = real_size
        self.chunks = chunks or []
        self.map_in_data = map_in_data


def _int_field(value: bytes, what: str, url: str, offset: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise _corrupt(f"bad {what} {value!r} in a sparse member's PAX header", url,
                       offset=offset) from None
    if number < 0:
        raise _corrupt(f"negative {what} in a sparse member's PAX header", url, offset=offset)
    return number


def _pax_sparse(records: list[tuple[str, bytes]], url: str, offset: int) -> _Sparse | None:
    """The sparse layout a member's PAX records describe (GNU 0.0, 0.1 or 1.0), or None."""
    fields = dict(records)
    if not any(key.startswith("GNU.sparse.") for key in fields):
        return None
    if "GNU.sparse.major" in fields:
        version = b".".join((fields["GNU.sparse.major"], fields.get("GNU.sparse.minor", b"?")))
        if version != b"1.0":
            raise _corrupt("unsupported GNU sparse format version "
                           f"{version.decode(errors='replace')}", url, offset=offset)
        real = fields.get("GNU.sparse.realsize", fields.get("GNU.sparse.size"))
        if real is None:
            raise _corrupt("sparse member without GNU.sparse.realsize", url, offset=offset)
        return _Sparse(_int_field(real, "real size", url, offset), None, map_in_data=True)
    if "GNU.sparse.size" not in fields:
        raise _corrupt("sparse member without GNU.sparse.size", url, offset=offset)
    real_size = _int_field(fields["GNU.sparse.size"], "real size", url, offset)
    if "GNU.sparse.map" in fields:  # 0.1: one comma-separated list
        numbers = [_int_field(v, "sparse map entry", url, offset)
                   for v in fields["GNU.sparse.map"].split(b",") if v]
    else:  # 0.0: repeated offset/numbytes records, in order
        numbers = [_int_field(v, "sparse map entry", url, offset) for k, v in records
                   if k in ("GNU.sparse.offset", "GNU.sparse.numbytes")]
    if len(numbers) % 2:
        raise _corrupt("sparse map has an odd number of entries", url, offset=offset)
    return _Sparse(real_size, list(zip(numbers[::2], numbers[1::2], strict=True)))


def _expand_sparse(sparse: _Sparse, stored: bytes, url: str, name: str, offset: int) -> bytes:
    """The file a sparse member describes: its data blocks placed at their offsets, zeros between."""
    if sparse.real_size > MAX_SPARSE_SIZE:
        raise _corrupt(f"sparse member expands to {sparse.real_size} bytes, more than the "
                       f"{MAX_SPARSE_SIZE} pipeflow expands in memory", url, member=name,
                       offset=offset)
    out = bytearray(sparse.real_size)
    pos = 0
    end = 0
    for start, size in sparse.chunks:
        if start < end or start + size > sparse.real_size or pos + size > len(stored):
            raise _corrupt("sparse member has an invalid sparse map", url, member=name,
                           offset=offset)
        out[start:start + size] = stored[pos:pos + size]
        pos += size
        end = start + size
    if pos != len(stored):
        raise _corrupt(f"sparse member's map covers {pos} of its {len(stored)} stored bytes",
                       url, member=name, offset=offset)
    return bytes(out)


def _split_map_block(data: bytes, url: str, name: str, offset: int
                     ) -> tuple[list[tuple[int, int]], bytes]:
    """PAX 1.0: parse the decimal sparse map at the start of the data; return (map, rest)."""
    numbers: list[int] = []
    pos = 0
    count = None
    while count is None or len(numbers) < 2 * count:
        nl = data.find(b"\n", pos)
        if nl < 0 or nl - pos > 20:
            raise _corrupt("sparse member's map is truncated or malformed", url, member=name,
                           offset=offset)
        try:
            value = int(data[pos:nl])
        except ValueError:
            raise _corrupt("sparse member's map is malformed", url, member=name,
                           offset=offset) from None
        if count is None:
            count = value
        else:
            numbers.append(value)
        pos = nl + 1
    map_end = (pos + BLOCK - 1) // BLOCK * BLOCK
    return list(zip(numbers[::2], numbers[1::2], strict=True)), data[map_end:]


class _Reader:
    """The state of one forward pass over an archive: position, pending extended headers."""

    def __init__(self, stream: IO[bytes], url: str) -> None:
        self.stream, _kind = open_decompressed(stream, url)
        self.url = url
        self.offset = 0
        self.global_pax: dict[str, bytes] = {}
        self.pending_pax: list[tuple[str, bytes]] = []
        self.long_name: bytes | None = None
        self.entry_start: int | None = None  # first header of the current entry

    def read(self, n: int, what: str, member: str | None = None) -> bytes:
        data = read_exact(self.stream, n)
        if len(data) < n:
            raise _corrupt(f"{what} is truncated ({len(data)} of {n} bytes)", self.url,
                           member=member, offset=self.offset)
        return data

    def header(self) -> bytes | None:
        """The next header block, or None at the end-of-archive block."""
        header = read_exact(self.stream, BLOCK)
        if len(header) < BLOCK:
            if not header and self.offset > 0:
                raise _corrupt("archive ends without an end-of-archive block (truncated?)",
                               self.url, offset=self.offset)
            raise _corrupt(f"truncated tar header ({len(header)} of {BLOCK} bytes)",
                           self.url, offset=self.offset)
        if not header[0] and header.count(0) == BLOCK:  # a header rarely starts with 0: no count
            # For compressed streams, decode the rest so the gzip/bz2/xz checksums are
            # verified: the tar format itself has no data checksum.
            finish = getattr(self.stream, "finish", None)
            if finish is not None:
                finish()
            return None
        if not _checksum_ok(header, self.url, self.offset):
            raise _corrupt("tar header checksum mismatch (corrupt or not a tar archive)",
                           self.url, offset=self.offset)
        if self.entry_start is None:
            self.entry_start = self.offset
        return header

    def size_of(self, header: bytes, fields: dict[str, bytes]) -> int:
        size = _number(header[124:136], "size", self.url, self.offset)
        if "size" in fields:
            try:
                size = int(fields["size"])
            except ValueError:
                raise _corrupt("bad PAX size", self.url, offset=self.offset) from None
        if size < 0 or size > _MAX_SIZE:
            raise _corrupt(f"impossible member size {size}", self.url, offset=self.offset)
        return size

    def extended(self, typeflag: bytes, size: int) -> None:
        """Read a PAX (``x``/``g``) or GNU long-name (``L``/``K``) header's data."""
        padded = (size + BLOCK - 1) // BLOCK * BLOCK
        data = self.read(padded, "extended header")[:size]
        if typeflag == b"x":
            self.pending_pax = _parse_pax(data, self.url, self.offset)
        elif typeflag == b"g":
            self.global_pax.update(_parse_pax(data, self.url, self.offset))
        elif typeflag == b"L":
            self.long_name = _nts(data)
        self.offset += BLOCK + padded

    def name_of(self, header: bytes, fields: dict[str, bytes]) -> str:
        if "GNU.sparse.name" in fields:  # the real name of a PAX 0.1/1.0 sparse member
            return _decode_name(fields["GNU.sparse.name"])
        if "path" in fields:
            return _decode_name(fields["path"])
        if self.long_name is not None:
            return _decode_name(self.long_name)
        raw = _nts(header[0:100])
        prefix = _nts(header[345:500]) if header[257:263] == b"ustar\x00" else b""
        return _decode_name(prefix + b"/" + raw if prefix else raw)

    def gnu_sparse(self, header: bytes, name: str) -> _Sparse:
        """Old GNU (type ``S``): 4 map entries in the header, 21 in each extension block
        that follows it (read here, so ``offset`` moves past them)."""
        header_offset = self.offset - BLOCK  # the caller has moved past the header
        chunks = self._sparse_entries(header[386:482], 4, header_offset)
        extended = header[482]
        real_size = _number(header[483:495], "real size", self.url, header_offset)
        while extended:
            block = self.read(BLOCK, "sparse extension header", member=name)
            chunks += self._sparse_entries(block[:504], 21, self.offset)
            extended = block[504]
            self.offset += BLOCK
        return _Sparse(real_size, chunks)

    def _sparse_entries(self, raw: bytes, count: int, offset: int) -> list[tuple[int, int]]:
        entries = []
        for i in range(count):
            field = raw[i * 24:(i + 1) * 24]
            start = _number(field[:12], "sparse offset", self.url, offset)
            size = _number(field[12:], "sparse size", self.url, offset)
            if size:
                entries.append((start, size))
        return entries


def _read_member(reader: _Reader, header: bytes, typeflag: bytes, fields: dict[str, bytes],
                 sparse: _Sparse | None, name: str) -> bytes | None:
    """Read one entry's data (and padding); None for an entry that is not a regular file."""
    size = reader.size_of(header, fields)
    header_offset = reader.offset
    if typeflag == b"M":
        raise _corrupt("unsupported GNU multi-volume member", reader.url, member=name,
                       offset=header_offset)
    is_regular = typeflag in _REGULAR and not (typeflag == b"\x00" and name.endswith("/"))
    reader.offset += BLOCK
    if not is_regular and (typeflag in _SKIPPED_NO_DATA or typeflag == b"\x00"):
        return None  # no data blocks follow these (as tarfile assumes)
    if typeflag == b"S":
        sparse = reader.gnu_sparse(header, name)
    padded = (size + BLOCK - 1) // BLOCK * BLOCK
    data = read_exact(reader.stream, size)
    if len(data) < size:
        raise _corrupt(f"member is truncated ({len(data)} of {size} bytes)", reader.url,
                       member=name, offset=header_offset)
    if padded > size:
        reader.read(padded - size, "member padding", member=name)
    reader.offset += padded
    if not is_regular:
        return None  # unknown type with data (e.g. a vendor extension): skipped like tarfile
    if sparse is None:
        return data
    if sparse.map_in_data:
        sparse.chunks, data = _split_map_block(data, reader.url, name, header_offset)
    return _expand_sparse(sparse, data, reader.url, name, header_offset)


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
        CorruptDataError: the archive is empty, truncated, has a bad header, a sparse member
            whose map does not fit its data, or a broken compressed stream. The message names
            ``url`` and the member or byte offset.
    """
    reader = _Reader(stream, url)
    to_skip = skip
    while (header := reader.header()) is not None:
        typeflag = header[156:157]
        pending = reader.pending_pax
        fields = {**reader.global_pax, **dict(pending)} if pending or reader.global_pax else _NONE
        if typeflag in _EXTENDED:
            reader.extended(typeflag, reader.size_of(header, fields))
            continue
        sparse = _pax_sparse(pending, url, reader.offset) if pending else None
        name = reader.name_of(header, fields)
        member_offset = reader.entry_start
        reader.pending_pax, reader.long_name, reader.entry_start = [], None, None
        data = _read_member(reader, header, typeflag, fields, sparse, name)
        if data is None:
            continue
        if to_skip:
            to_skip -= 1
            continue
        yield TarMember(name, data, member_offset if member_offset is not None else 0)
