"""A large key set held once per node: a memory-mapped file, shared by every DataLoader worker.

A Python list of a million keys costs about 85 bytes a key, and every forked worker ends up with
a private copy of it (reference counting writes to each object's page); a spawned worker gets
one by unpickling. A :class:`KeyTable` keeps the keys in one file in the pipeflow index format
(see ``docs/scale.md``): sorted or not, offsets into one UTF-8 blob, with sizes, etags and
mtimes as columns beside them. The file is memory-mapped read-only, so the page cache holds it
once per node whatever the number of workers, and a ``KeyTable`` pickles as a reference to its
file (path and checksum), never its data. Per-key Python objects are made by ``table[i]`` for
the items in flight only.

Files made by :meth:`KeyTable.build` live in the user's cache directory
(``~/.cache/pipeflow/keys``), belong to the process that made them and are removed when it
exits; a file left behind by a killed process is removed by the next build on the same host.
A table received by several processes of one host (the listing rank 0 broadcasts under
``torchrun``) is one file per host, named by its checksum (:meth:`KeyTable.on_node`): each holder
keeps a shared lock on it, the last one removes it, and the next build removes one whose holders
were all killed. An index file given by the user (``manifest=`` path) is mapped where it is and
never removed.

Costs: building is O(N) time and O(N) compact memory in the building process (about 8 bytes of
offset per key plus the key bytes); opening is O(1) and checking the checksum O(N) bytes, once
per process that opens a file by path; a worker that unpickles a table reads only the header.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import mmap
import os
import socket
import struct
import tempfile
import weakref
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, overload

from ._words import counted

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: every process keeps its own copy
    fcntl = None  # type: ignore[assignment]

from ._fs import pid_alive
from ._usercache import cache_root
from .errors import ConfigError, CorruptDataError
from .items import ObjectInfo

__all__ = ["INDEX_MAGIC", "INDEX_VERSION", "IndexMeta", "KeyTable", "is_index_file", "keys_dir",
           "new_table_file", "node_path", "shareable", "write_index"]

#: the first 8 bytes of every index file
INDEX_MAGIC = b"PFINDEX\x00"
#: the format version this code writes and reads
INDEX_VERSION = 1
#: magic, version, kind, count, meta length, reserved, body length, sha256 of the body
_HEADER = struct.Struct("<8sIIQIIQ32s")
_HEADER_SIZE = 80  # _HEADER.size (72) padded so the sections after it stay 8-byte aligned
_KIND_STRINGS, _KIND_OBJECTS = 0, 1
#: a from_items list at least this long, of str or ObjectInfo only, is held as a KeyTable
SHARE_MIN = 50_000


def keys_dir() -> str:
    """Where tables built in this process live: ``<user cache>/pipeflow/keys``."""
    return os.path.join(cache_root(), "keys")


def shareable(items: Sequence[Any]) -> bool:
    """True when ``items`` is a long list of plain strings or :class:`ObjectInfo` only, which a
    :class:`KeyTable` holds exactly (and once per node instead of once per worker)."""
    if isinstance(items, KeyTable) or not isinstance(items, (list, tuple)) or len(items) < SHARE_MIN:
        return False
    kind = type(items[0])
    return kind in (str, ObjectInfo) and all(type(i) is kind for i in items)


@dataclass(frozen=True)
class IndexMeta:
    """What an index file says about itself: the listing it was made for and its shape.

    Attributes:
        url: the URL listed (None for a table built from items).
        pattern: the glob filter used with it.
        base: the prefix every key starts with; the blob holds the rest.
        objects: True when entries are :class:`ObjectInfo` (with columns), False for strings.
        count: number of entries.
        digest: sha256 (hex) of everything after the fixed header.
    """

    url: str | None
    pattern: str | None
    base: str
    objects: bool
    count: int
    digest: str


# ---- writing ----------------------------------------------------------------------------------
class _Columns:
    """The columns of a table being built, in compact arrays (never a list of objects)."""

    def __init__(self) -> None:
        self.offsets = array("Q", [0])
        self.blob = bytearray()
        self.sizes = array("q")
        self.etag_offsets = array("Q", [0])
        self.etags = bytearray()
        self.mtimes = array("d")
        self.kind: int | None = None

    def add(self, item: Any, base_len: int) -> None:
        kind = _KIND_OBJECTS if isinstance(item, ObjectInfo) else _KIND_STRINGS
        if self.kind is None:
            self.kind = kind
        elif kind != self.kind:
            raise ConfigError("a key table holds either strings or ObjectInfo, not both")
        text = item.url if kind == _KIND_OBJECTS else item
        if not isinstance(text, str):
            raise ConfigError(f"a key table holds strings or ObjectInfo, got {type(item).__name__}")
        self.blob += text[base_len:].encode("utf-8", "surrogatepass")
        self.offsets.append(len(self.blob))
        if kind == _KIND_OBJECTS:
            self.sizes.append(-1 if item.size is None else int(item.size))
            self.etags += (item.etag or "").encode("utf-8", "surrogatepass")
            self.etag_offsets.append(len(self.etags))
            self.mtimes.append(math.nan if item.mtime is None else float(item.mtime))

    def sections(self) -> list[tuple[str, bytes | bytearray | array[Any]]]:
        parts: list[tuple[str, Any]] = [("key_offsets", self.offsets), ("key_blob", self.blob)]
        if self.kind == _KIND_OBJECTS:
            parts += [("sizes", self.sizes), ("etag_offsets", self.etag_offsets),
                      ("etag_blob", self.etags), ("mtimes", self.mtimes)]
        return parts


def _pad(n: int) -> int:
    return -n % 8


def _layout(columns: _Columns, meta: dict[str, Any]) -> tuple[bytes, list[tuple[int, Any]]]:
    """The meta JSON (with the section table) and each section's file offset."""
    sections = columns.sections()
    # the section table is part of the meta, whose length moves the sections: fix it by padding
    # every offset field to a fixed width
    table = {name: [0, 0] for name, _ in sections}
    meta = {**meta, "sections": table}
    probe = json.dumps(meta, sort_keys=True).encode()
    meta_len = len(probe) + 2 * 2 * 20 * len(sections)  # room for two 20-digit numbers each
    meta_len += _pad(meta_len)
    pos = _HEADER_SIZE + meta_len
    placed = []
    for name, data in sections:
        nbytes = len(memoryview(data).cast("B"))
        table[name] = [pos, nbytes]
        placed.append((pos, data))
        pos += nbytes + _pad(nbytes)
    text = json.dumps(meta, sort_keys=True).encode()
    return text + b" " * (meta_len - len(text)), placed


def write_index(fh: BinaryIO, items: Iterable[Any], *, url: str | None = None,
                pattern: str | None = None, base: str = "") -> IndexMeta:
    """Write ``items`` (all str or all :class:`ObjectInfo`, each starting with ``base``) to the
    binary file ``fh`` in the index format, in the given order. Returns what was written."""
    columns = _Columns()
    for item in items:
        text = item.url if isinstance(item, ObjectInfo) else item
        if isinstance(text, str) and not text.startswith(base):
            raise ConfigError(f"key {text!r} does not start with the index base {base!r}")
        columns.add(item, len(base))
    count = len(columns.offsets) - 1
    objects = columns.kind == _KIND_OBJECTS
    meta_text, placed = _layout(columns, {"url": url, "pattern": pattern, "base": base,
                                          "objects": objects, "count": count})
    digest = hashlib.sha256(meta_text)
    chunks: list[bytes | memoryview] = [meta_text]
    pos = _HEADER_SIZE + len(meta_text)
    for offset, data in placed:
        gap = b"\0" * (offset - pos)
        view = memoryview(data).cast("B")
        chunks += [gap, view]
        digest.update(gap)
        digest.update(view)
        pos = offset + len(view)
    header = _HEADER.pack(INDEX_MAGIC, INDEX_VERSION, _KIND_OBJECTS if objects else _KIND_STRINGS,
                          count, len(meta_text), 0, pos - _HEADER_SIZE, digest.digest())
    fh.write(header + b"\0" * (_HEADER_SIZE - _HEADER.size))
    for chunk in chunks:
        fh.write(chunk)
    return IndexMeta(url, pattern, base, objects, count, digest.hexdigest())


def is_index_file(head: bytes) -> bool:
    """True when ``head`` (the first bytes of a file) starts like a pipeflow index."""
    return head[:len(INDEX_MAGIC)] == INDEX_MAGIC


# ---- reading ----------------------------------------------------------------------------------
def _parse_header(buf: Any, size: int, where: str) -> tuple[int, int, int, int, bytes]:
    """(kind, count, meta length, body length, digest) of a mapped file, checked against its size."""
    if size < _HEADER_SIZE or not is_index_file(bytes(buf[:8])):
        raise CorruptDataError("not a pipeflow index file (bad magic or too short)", key=where)
    magic, version, kind, count, meta_len, _, body_len, digest = _HEADER.unpack_from(buf, 0)
    if version != INDEX_VERSION:
        raise CorruptDataError(f"index format version {version}, this pipeflow reads version "
                               f"{INDEX_VERSION}: rebuild it with 'pipeflow index'", key=where)
    if kind not in (_KIND_STRINGS, _KIND_OBJECTS) or _HEADER_SIZE + body_len != size \
            or meta_len > body_len:
        raise CorruptDataError(f"index header does not match the file ({size} bytes): truncated?",
                               key=where)
    return kind, count, meta_len, body_len, digest


def _sha256(buf: Any, start: int, stop: int) -> bytes:
    digest = hashlib.sha256()
    view = memoryview(buf)
    try:
        for pos in range(start, stop, 16 << 20):
            digest.update(view[pos:min(stop, pos + (16 << 20))])
    finally:
        view.release()
    return digest.digest()


def _cleanup(path: str, owner_pid: int) -> None:
    # forked children inherit the finalizer; only the process that made the file removes it
    if os.getpid() == owner_pid:
        with contextlib.suppress(OSError):
            os.unlink(path)


class KeyTable(Sequence[Any]):
    """A read-only sequence of strings or :class:`ObjectInfo` over a memory-mapped index file.

    Make one with :meth:`build` (from any iterable) or :meth:`open` (an index file). ``len``
    and ``table[i]`` are O(1); slicing returns a list. Pickling sends the path and checksum only.

    Raises:
        CorruptDataError: the file is not an index, is truncated, or its checksum is wrong.
        ConfigError: the index was made for another URL or pattern than the one asked for.
    """

    def __init__(self, path: str, *, verify: bool = True, expect_digest: str | None = None,
                 owned: bool = False) -> None:
        self.path = os.fspath(path)
        try:
            with open(self.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        except OSError as exc:
            raise CorruptDataError(f"cannot open index: {exc}", key=self.path) from exc
        if owned:  # made by this process (new_table_file): removed when it exits
            weakref.finalize(self, _cleanup, self.path, os.getpid())
        self._map(size, verify, expect_digest)

    def _map(self, size: int, verify: bool, expect_digest: str | None) -> None:
        buf = self._mm if self._mm is not None else b""
        kind, count, meta_len, body_len, digest = _parse_header(buf, size, self.path)
        if expect_digest is not None and digest.hex() != expect_digest:
            raise CorruptDataError("index file changed since this table was made", key=self.path)
        if verify and _sha256(buf, _HEADER_SIZE, _HEADER_SIZE + body_len) != digest:
            raise CorruptDataError("index checksum mismatch: the file is corrupt", key=self.path)
        try:
            raw = json.loads(bytes(buf[_HEADER_SIZE:_HEADER_SIZE + meta_len]))
            sections = {name: (int(at), int(n)) for name, (at, n) in raw["sections"].items()}
            self.meta = IndexMeta(raw["url"], raw["pattern"], str(raw["base"]),
                                  kind == _KIND_OBJECTS, count, digest.hex())
            self._views(sections, size)
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptDataError(f"unreadable index meta: {exc}", key=self.path) from exc

    def _views(self, sections: dict[str, tuple[int, int]], size: int) -> None:
        view = memoryview(self._mm if self._mm is not None else b"")

        def part(name: str, fmt: str) -> memoryview:
            at, n = sections[name]
            if at < _HEADER_SIZE or at + n > size or (fmt != "B" and at % 8):
                raise ValueError(f"section {name} lies outside the file")
            return view[at:at + n].cast(fmt)  # type: ignore[call-overload]

        count = self.meta.count
        self._offsets, self._blob = part("key_offsets", "Q"), part("key_blob", "B")
        if len(self._offsets) != count + 1:
            raise ValueError("key offsets do not match the count")
        self._base = self.meta.base
        if self.meta.objects:
            self._sizes, self._mtimes = part("sizes", "q"), part("mtimes", "d")
            self._etag_offsets, self._etags = part("etag_offsets", "Q"), part("etag_blob", "B")
            if not len(self._sizes) == len(self._mtimes) == len(self._etag_offsets) - 1 == count:
                raise ValueError("columns do not match the count")
        self._views_held = view

    # ---- making ---------------------------------------------------------------------------
    @classmethod
    def build(cls, items: Iterable[Any], *, url: str | None = None, pattern: str | None = None,
              base: str | None = None) -> KeyTable:
        """Write ``items`` to a new file in :func:`keys_dir` (owned by this process) and map it.

        ``base`` defaults to the common prefix of the keys of a sequence (so the blob holds the
        part after it), else ``""``.
        """
        if base is None:
            base = _common_prefix(items) if isinstance(items, Sequence) else ""
        path = ""
        try:
            fd, path = new_table_file()
            with os.fdopen(fd, "wb") as fh:
                write_index(fh, items, url=url, pattern=pattern, base=base)
            return cls(path, verify=False, owned=True)
        except BaseException:
            if path:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise

    @classmethod
    def from_bytes(cls, data: bytes) -> KeyTable:
        """A table (owned by this process) from the bytes of an index file, checked."""
        fd, path = new_table_file()
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            return cls(path, owned=True)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise

    @classmethod
    def on_node(cls, data: bytes) -> KeyTable:
        """A table from the bytes of an index file, held once per host however many processes
        of the host ask for the same bytes: the file is named by its checksum (:func:`node_path`).

        The first process writes it; the others map the same file. Every holder keeps a shared
        ``flock`` on it, which the kernel drops when the process ends, even by ``SIGKILL``; the
        last holder to let go removes the file, and one left by killed holders is removed by the
        next build on the host (:func:`new_table_file`).
        """
        digest = _header_digest(data)
        path = node_path(digest)
        # each round can lose only to a last holder removing the file meanwhile
        for _ in range(16 if fcntl is not None else 0):
            fd = _held_fd(path)
            if fd is None:
                _publish(path, data)
                continue
            try:
                return cls._held(path, fd, digest)
            except CorruptDataError:  # not ours to repair: this process keeps its own copy
                return cls.from_bytes(data)
        return cls.from_bytes(data)

    @classmethod
    def at_node(cls, digest: str) -> KeyTable:
        """The table another process of this host published with :meth:`on_node` (its checksum
        ``digest``), held the same way; for the processes of a node that were not sent the bytes.

        Raises:
            ConfigError: there is no such file on this host (the processes of a node must share
                the cache directory, ``$XDG_CACHE_HOME``).
        """
        path = node_path(digest)
        fd = _held_fd(path) if fcntl is not None else None
        if fd is None:
            raise ConfigError(f"the key table {path!r} that this node's local rank 0 writes is not "
                              "there: the ranks of a node must share the cache directory "
                              "($XDG_CACHE_HOME)")
        return cls._held(path, fd, digest)

    @classmethod
    def _held(cls, path: str, fd: int, digest: str) -> KeyTable:
        """Map ``path``, whose shared lock ``fd`` holds, until the table is collected."""
        try:
            table = cls(path, expect_digest=digest)
        except BaseException:
            os.close(fd)
            raise
        weakref.finalize(table, _let_go, fd, path, os.getpid())
        return table

    @staticmethod
    def digest_of(data: bytes) -> str:
        """The checksum in the header of the index file ``data`` (hex), which names its node file."""
        return _header_digest(data)

    @classmethod
    def open(cls, path: str, *, url: str | None = None, pattern: str | None = None,
             check_source: bool = False) -> KeyTable:
        """Map an index file at ``path`` (checked against its checksum). With ``check_source``,
        refuse one made for another ``url``/``pattern`` (:class:`ConfigError`)."""
        table = cls(path)
        if check_source:
            table.check_source(url, pattern)
        return table

    def check_source(self, url: str | None, pattern: str | None) -> None:
        """Refuse an index made for another listing than ``url`` with ``pattern``.

        Raises:
            ConfigError: the index lists another URL or pattern.
        """
        if (self.meta.url, self.meta.pattern) != (url, pattern):
            raise ConfigError(
                f"index {self.path!r} lists {self.meta.url!r} (pattern {self.meta.pattern!r}), not "
                f"{url!r} (pattern {pattern!r}); delete it (or pass another manifest) to list again")

    def save(self, fh: BinaryIO) -> None:
        """Copy the index file to the binary file ``fh``."""
        buf = self._mm if self._mm is not None else b""
        view = memoryview(buf)
        try:
            for pos in range(0, len(view), 16 << 20):
                fh.write(view[pos:pos + (16 << 20)])
        finally:
            view.release()

    # ---- the sequence ---------------------------------------------------------------------
    def __len__(self) -> int:
        return self.meta.count

    @overload
    def __getitem__(self, i: int) -> Any: ...

    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self._entry(j) for j in range(*i.indices(self.meta.count))]
        n = self.meta.count
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"key table index {i} out of range ({counted(n, 'key')})")
        return self._entry(i)

    def _entry(self, i: int) -> Any:
        key = self._base + str(self._blob[self._offsets[i]:self._offsets[i + 1]], "utf-8", "surrogatepass")
        if not self.meta.objects:
            return key
        size, mtime = self._sizes[i], self._mtimes[i]
        etag = str(self._etags[self._etag_offsets[i]:self._etag_offsets[i + 1]], "utf-8", "surrogatepass")
        return ObjectInfo(url=key, size=None if size < 0 else size, etag=etag or None,
                          mtime=None if math.isnan(mtime) else mtime)

    def __iter__(self) -> Iterator[Any]:
        return (self._entry(i) for i in range(self.meta.count))

    def nbytes(self) -> int:
        """Size of the index file in bytes."""
        return len(self._mm) if self._mm is not None else 0

    # ---- pickling: a reference, never the data ---------------------------------------------
    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen, (self.path, self.meta.digest))

    def __repr__(self) -> str:
        what = "ObjectInfo" if self.meta.objects else "str"
        return f"KeyTable({counted(self.meta.count, what + ' key')}, {self.path!r})"


def _reopen(path: str, digest: str) -> KeyTable:
    # the process that made or opened the table checked the whole file; a worker checks the
    # header's checksum is the same one, which costs one page instead of the whole file
    return KeyTable(path, verify=False, expect_digest=digest)


def _common_prefix(items: Sequence[Any]) -> str:
    """The prefix every key of ``items`` shares (the smallest and largest key share it)."""
    texts = [x.url if isinstance(x, ObjectInfo) else x for x in items]
    if not texts or not all(isinstance(t, str) for t in texts):
        return ""
    return os.path.commonprefix([min(texts), max(texts)])


def _header_digest(data: bytes) -> str:
    return _parse_header(data, len(data), "<received index>")[4].hex()


def node_path(digest: str) -> str:
    """Where the table of this host with checksum ``digest`` lives (see :meth:`KeyTable.on_node`)."""
    return os.path.join(keys_dir(), f"{_host()}-node-{digest}.pfi")


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.fstat(fd)
        return st.st_nlink > 0 and os.stat(path).st_ino == st.st_ino
    except OSError:
        return False


def _held_fd(path: str) -> int | None:
    """A descriptor of ``path`` with a shared lock on it, or None when there is no such file
    (or it was removed while this process waited for the lock)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a last holder removes the file
    if _same_file(fd, path):
        return fd
    os.close(fd)
    return None


def _publish(path: str, data: bytes) -> None:
    """Write ``data`` to a private file and link it to ``path``, unless another process did first."""
    fd, tmp = new_table_file()
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _remove_if_unheld(fd: int, path: str) -> None:
    """Remove ``path`` when no other process holds it (an exclusive lock is granted)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return
    try:
        if _same_file(fd, path):  # only the holder of the exclusive lock removes this file
            with contextlib.suppress(OSError):
                os.unlink(path)
    finally:
        # a forked child shares this descriptor's lock: drop it, or it would keep others waiting
        fcntl.flock(fd, fcntl.LOCK_UN)


def _let_go(fd: int, path: str, owner_pid: int) -> None:
    # a forked child shares the parent's lock; only the process that took it lets it go
    if os.getpid() != owner_pid:
        return
    try:
        _remove_if_unheld(fd, path)
    finally:
        os.close(fd)


def _host() -> str:
    return "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:40] or "host"


def new_table_file() -> tuple[int, str]:
    """A new file (descriptor, path) in :func:`keys_dir`, named after this host and process so
    that the next build removes it if this process is killed before it can."""
    directory = keys_dir()
    os.makedirs(directory, mode=0o700, exist_ok=True)
    _sweep(directory)
    return tempfile.mkstemp(prefix=f"{_host()}-{os.getpid()}-", suffix=".pfi", dir=directory)


def _sweep(directory: str) -> None:
    """Remove tables left by processes of this host that no longer run (killed ones), and the
    host's shared tables that no process holds any more."""
    host = _host() + "-"
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            if not name.startswith(host):
                continue
            if name.startswith(host + "node-"):
                _sweep_node_file(os.path.join(directory, name))
                continue
            pid_text = name[len(host):].split("-", 1)[0]
            if pid_text.isdigit() and not pid_alive(int(pid_text)):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(directory, name))


def _sweep_node_file(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        _remove_if_unheld(fd, path)
    finally:
        os.close(fd)

