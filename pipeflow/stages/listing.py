"""``list_objects``: a source of :class:`~pipeflow.items.ObjectInfo` items under a prefix.

Listing happens **once per job**, where the pipeline is written, never in every rank or
DataLoader worker:

* under ``torchrun`` with an initialised process group, rank 0 lists and every other rank
  receives the listing from it (:mod:`pipeflow.stages._onejob`); without a process group each
  process lists on its own;
* the store is listed as several chains of pages at once where the backend allows it
  (:mod:`pipeflow.backends.parallel_list`);
* a large listing (:data:`pipeflow.keytable.SHARE_MIN` objects or more) is held in a
  :class:`~pipeflow.keytable.KeyTable`, a memory-mapped file every worker of the node shares and
  that pickles as a reference; a small one travels inside the pipeline description;
* with ``manifest=`` (a local path or an ``s3://`` URL), the first job writes the listing there
  in the pipeflow index format (``docs/scale.md``), written once (a conditional write), and later
  jobs read it instead of the store; a reader checks the format version, the URL and pattern it
  was made for, and its checksum. A manifest whose name ends in ``.jsonl`` is written and read in
  the older JSON-lines format (slower to read, kept for existing files). Delete it to list again.

The order is deterministic (sorted by URL), so every rank sees the same list and shards agree.
The state is the index of the next object. ``len(lister)`` and ``lister[i]`` give random access.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any

from .._braces import expand_braces, has_braces, literal_prefix
from .._words import counted
from ..backends._optional import installed
from ..backends.base import Backend, Publisher, local_path, scheme_of
from ..backends.parallel_list import list_parallel
from ..backends.registry import backend_for_url, get_backend
from ..errors import ConfigError, CorruptDataError, ObjectNotFoundError
from ..items import ObjectInfo
from ..keytable import SHARE_MIN, KeyTable, is_index_file, keys_dir, new_table_file, write_index
from ._backends import check_backend_options
from ._onejob import on_lead
from .base import Stage

__all__ = ["LIST_THREADS", "ObjectLister", "default_backend", "list_now", "obtain_listing",
           "read_manifest", "write_manifest"]

MANIFEST_VERSION = 1
_OWN_OPTIONS = ("pattern", "backend", "manifest", "threads")
#: list requests in flight when the backend can list ranges concurrently
LIST_THREADS = 8

Objects = Sequence[ObjectInfo]


def _relative(url: str, prefix: str) -> str:
    return url[len(prefix):] if url.startswith(prefix) else url


def default_backend(url: str) -> str:
    """The backend that lists ``url`` when none is named: the scheme's default (``boto3`` for
    ``s3://``), or obstore when that is the S3 client installed and boto3 is not."""
    name = backend_for_url(url)
    if name == "boto3" and not installed("boto3") and installed("obstore"):
        return "obstore"
    return name


def _listed(be: Backend, url: str, base: str) -> list[ObjectInfo]:
    """The listing of ``url``; with brace notation, the objects it names (and everything under
    the ones that end in ``/``), found with one listing of the part before the first brace.

    Cost: one listing of that part (O(objects under it)) and a set of the E names.

    Raises:
        ObjectNotFoundError: a name the braces denote matched nothing.
    """
    if base == url:
        return list(be.list_before_fork(url))
    names = expand_braces(url)
    exact = set(names)
    prefixes = {n for n in names if n.endswith("/")}
    found: set[str] = set()
    kept = []
    for info in be.list_before_fork(base):
        hit = info.url if info.url in exact else next(
            (info.url[:k + 1] for k in range(max(len(base) - 1, 0), len(info.url))
             if info.url[k] == "/" and info.url[:k + 1] in prefixes), None)
        if hit is not None:
            found.add(hit)
            kept.append(info)
    missing = [n for n in names if n not in found]
    if missing:
        shown = ", ".join(repr(m) for m in missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise ObjectNotFoundError(f"{len(missing)} of the {len(names)} names the braces denote "
                                  f"do not exist: {shown}", url=url, backend=be.name, op="list")
    return kept


def list_now(url: str, *, pattern: str | None = None, backend: str | Backend | None = None,
             threads: int = LIST_THREADS, **options: Any) -> list[ObjectInfo]:
    """List ``url`` with a backend and filter by ``pattern`` (a glob on the part after ``url``).

    Raises:
        ObjectNotFoundError: nothing under ``url`` (matches ``pattern``).
    """
    be = get_backend(backend if backend is not None else default_backend(url), **options)
    base = literal_prefix(url) if has_braces(url) else url
    listed: Iterable[ObjectInfo]
    if base == url and be.pages_from_any_key and url.endswith("/"):
        listed = list_parallel(be, url, concurrency=threads).objects
    else:
        listed = _listed(be, url, base)
    infos, seen, names = _matching(listed, base, pattern)
    infos.sort(key=lambda i: i.url)  # backends list sorted already; make it a guarantee
    if not infos:
        said = (None if seen else _nothing_there(url)) or _nothing_matched(pattern, seen, names)
        raise ObjectNotFoundError(said + _glob_hint(url, pattern), url=url, backend=be.name, op="list")
    return infos


def _nothing_there(url: str) -> str | None:
    """For a local path that names no file or directory (a typo, a mount not made): say that,
    with the absolute path, rather than "no objects", which reads as an empty directory."""
    if has_braces(url) or scheme_of(url) not in ("", "file"):
        return None
    path = local_path(url)
    if os.path.lexists(path):
        return None
    return f"no such file or directory: {os.path.abspath(path)} (and no file's path starts with it)"


def _glob_hint(url: str, pattern: str | None) -> str:
    """For a glob written into the URL (``s3://bucket/train/*.tar``, as fsspec and shell users
    write it), where list_objects takes a prefix: how to write it instead."""
    at = min((i for i in (url.find(c) for c in "*?[") if i >= 0), default=-1)
    if at < 0 or pattern is not None:
        return ""
    base = url[:url.rfind("/", 0, at) + 1]
    return (f"; the URL is a prefix, not a glob: list_objects({base!r}, "
            f"pattern={url[len(base):]!r})")


def _matching(listed: Iterable[ObjectInfo], base: str, pattern: str | None
              ) -> tuple[list[ObjectInfo], int, list[str]]:
    """The objects whose name after ``base`` matches ``pattern``; how many were listed, and the
    first few names (for an error that shows what the pattern was matched against)."""
    infos: list[ObjectInfo] = []
    names: list[str] = []
    seen = 0
    for info in listed:
        seen += 1
        name = _relative(info.url, base)
        if len(names) < 3:
            names.append(name)
        if pattern is None or _matches(name, pattern, base):
            infos.append(info)
    return infos, seen, names


def _matches(name: str, pattern: str, base: str) -> bool:
    """``pattern`` against the name after ``base``. Under a prefix written without its trailing
    slash (``s3://bucket/train``) the names below ``train/`` start with ``/``: ``shard-*.tar``
    matches them as it does under ``s3://bucket/train/``, and ``/shard-*.tar`` still does.

    The other names of that S3 prefix (``ing/...`` from ``training/``) are matched as they are,
    not dropped: the URL is a prefix by the documented S3 semantics (``s3://bucket/train/part-``
    with ``*.tar`` relies on it), and ``*`` must list what no pattern lists."""
    if fnmatch.fnmatchcase(name, pattern):
        return True
    return name[:1] == "/" and base[-1:] != "/" and fnmatch.fnmatchcase(name[1:], pattern)


def _nothing_matched(pattern: str | None, seen: int, names: list[str]) -> str:
    if not pattern or not seen:
        return f"no objects matching {pattern!r}" if pattern else "no objects"
    # the usual slips: a regex for a glob, or the prefix repeated in the pattern
    return (f"no objects matching {pattern!r} among the {counted(seen, 'object')} listed; the pattern "
            f"is a glob (fnmatch) on the name after the URL, such as {', '.join(map(repr, names))}")


def _held(infos: list[ObjectInfo], url: str, pattern: str | None) -> Objects:
    """A listing as the pipeline description holds it: a shared table when it is large."""
    if len(infos) >= SHARE_MIN:
        return KeyTable.build(infos, url=url, pattern=pattern,
                              base=url if all(i.url.startswith(url) for i in infos) else None)
    return tuple(infos)


# ---- the JSON-lines manifest (the older format) --------------------------------------------------
def write_manifest(path: str, url: str, pattern: str | None, infos: Sequence[ObjectInfo]) -> None:
    """Write a listing as JSON lines, atomically (a temporary file renamed into place)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".manifest-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            _write_jsonl(fh, url, pattern, infos)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_jsonl(fh: Any, url: str, pattern: str | None, infos: Iterable[ObjectInfo]) -> None:
    header = {"pipeflow_manifest": MANIFEST_VERSION, "url": url, "pattern": pattern}
    fh.write(json.dumps(header) + "\n")
    for info in infos:
        fh.write(json.dumps({"url": info.url, "size": info.size, "etag": info.etag,
                             "mtime": info.mtime}, ensure_ascii=False) + "\n")


def read_manifest(path: str, url: str | None = None, pattern: str | None = None) -> list[ObjectInfo]:
    """Read a JSON-lines manifest written by :func:`write_manifest`.

    Raises:
        ConfigError: the manifest was written for a different ``url``/``pattern``.
        CorruptDataError: the file is not a pipeflow manifest.
    """
    infos: list[ObjectInfo] = []
    with open(path, encoding="utf-8") as fh:
        try:
            header = json.loads(fh.readline())
            if header.get("pipeflow_manifest") != MANIFEST_VERSION:
                raise ValueError("not a pipeflow manifest")
            if url is not None and (header.get("url"), header.get("pattern")) != (url, pattern):
                raise ConfigError(
                    f"manifest {path!r} lists {header.get('url')!r} (pattern {header.get('pattern')!r}), "
                    f"not {url!r} (pattern {pattern!r}); delete it to list again")
            for line in fh:
                if line.strip():
                    row = json.loads(line)
                    infos.append(ObjectInfo(url=row["url"], size=row.get("size"), etag=row.get("etag"),
                                            mtime=row.get("mtime")))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise CorruptDataError(f"unreadable manifest (rebuild it with 'pipeflow index'): {exc}",
                                   key=path) from exc
    return infos


# ---- manifests in either format, local or in the store ------------------------------------------
def _manifest_backend(manifest: str, url: str, backend: str | Backend | None,
                      options: dict[str, Any]) -> Backend:
    """The backend that reads and writes ``manifest``: the listing's own when the schemes match."""
    if scheme_of(manifest) == scheme_of(url):
        return get_backend(backend, url=manifest, **options)
    return get_backend(None, url=manifest)


def _is_remote(manifest: str) -> bool:
    return scheme_of(manifest) not in ("", "file")


def _local(manifest: str) -> str:
    return local_path(manifest)


def manifest_exists(manifest: str, be: Backend) -> bool:
    if not _is_remote(manifest):
        return os.path.exists(_local(manifest))
    try:
        be.info(manifest)
    except ObjectNotFoundError:
        return False
    return True


def read_listing(manifest: str, be: Backend, url: str, pattern: str | None) -> Objects:
    """The listing in ``manifest`` (either format), checked against ``url`` and ``pattern``.

    A local index is mapped where it is; one in the store is downloaded once per process into
    a file of this process (removed at exit) and mapped there.
    """
    if not _is_remote(manifest):
        return _open_local(_local(manifest), url, pattern, owned=False)
    tmp = _download(manifest, be)
    try:
        return _open_local(tmp, url, pattern, owned=True)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _open_local(path: str, url: str, pattern: str | None, *, owned: bool) -> Objects:
    with open(path, "rb") as fh:
        head = fh.read(8)
    if is_index_file(head):
        table = KeyTable(path, owned=owned)
        table.check_source(url, pattern)
        return table
    if head[:1] == b"{":
        held = _held(read_manifest(path, url, pattern), url, pattern)
        if owned:
            os.unlink(path)
        return held
    raise CorruptDataError("not a pipeflow manifest or index (rebuild it with 'pipeflow index')",
                           key=path)


def _download(manifest: str, be: Backend) -> str:
    fd, tmp = new_table_file()
    try:
        with os.fdopen(fd, "wb") as out, be.open(manifest) as body:
            while chunk := body.read(1 << 20):
                out.write(chunk)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def publish(manifest: str, be: Backend, url: str, pattern: str | None, infos: Sequence[ObjectInfo],
            *, replace: bool = False) -> bool:
    """Write the listing to ``manifest`` unless one is there already (or over it, with
    ``replace``): True when this call wrote it.

    A name ending in ``.jsonl`` gets JSON lines, anything else the index format.
    """
    os.makedirs(keys_dir(), mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".publish-", dir=keys_dir())
    try:
        if manifest.endswith(".jsonl"):
            with os.fdopen(fd, "w", encoding="utf-8") as text:
                _write_jsonl(text, url, pattern, infos)
        else:
            with os.fdopen(fd, "wb") as fh:
                base = url if all(i.url.startswith(url) for i in infos) else ""
                write_index(fh, infos, url=url, pattern=pattern, base=base)
        if not isinstance(be, Publisher):
            raise ConfigError(f"backend {be.name!r} cannot write the manifest {manifest!r}; use a "
                              "local path or an s3:// URL with the boto3 backend")
        if replace:
            be.upload(tmp, manifest)
            return True
        return be.upload_new(tmp, manifest)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def obtain_listing(url: str, *, pattern: str | None = None, backend: str | Backend | None = None,
                   manifest: str | None = None, threads: int = LIST_THREADS,
                   options: dict[str, Any] | None = None) -> Objects:
    """The listing of ``url``, made once per job: from ``manifest`` when it exists, else listed
    by rank 0 (written to ``manifest`` when given) and handed to every rank."""
    opts = dict(options or {})
    if manifest is None:
        return on_lead(lambda: _held(list_now(url, pattern=pattern, backend=backend,
                                               threads=threads, **opts), url, pattern))
    be = _manifest_backend(manifest, url, backend, opts)

    def lead() -> Objects | None:
        if not manifest_exists(manifest, be):
            infos = list_now(url, pattern=pattern, backend=backend, threads=threads, **opts)
            publish(manifest, be, url, pattern, infos)  # or another job's, published first
        # one in the store is downloaded once per job and sent on like a listing
        return read_listing(manifest, be, url, pattern) if _is_remote(manifest) else None

    held = on_lead(lead)  # rank 0 writes; the others wait here for it
    if held is not None:
        return held
    try:
        return read_listing(manifest, be, url, pattern)
    except FileNotFoundError as exc:
        raise ConfigError(f"manifest {manifest!r} was written by rank 0 but this rank cannot read "
                          "it: use a path every node shares, or an s3:// URL") from exc


class ObjectLister(Stage[ObjectInfo]):
    """Yields the objects under ``url`` in sorted order.

    Args:
        url: a prefix (``s3://bucket/train/``), a directory or a single object.
        pattern: a glob matched against the part of each URL after ``url`` (``"*.tar"``).
        backend: backend name or instance (default: chosen by the URL scheme).
        manifest: a local path or ``s3://`` URL to read the listing from, written on first use.
        objects: an already made listing (what :func:`pipeflow.list_objects` passes): a
            sequence or a :class:`~pipeflow.keytable.KeyTable`.
        threads: list requests in flight (where the backend can list ranges concurrently).
        options: backend options.
    """

    def __init__(self, url: str, *, pattern: str | None = None, backend: str | Backend | None = None,
                 manifest: str | os.PathLike[str] | None = None,
                 objects: Sequence[ObjectInfo] | None = None, threads: int = LIST_THREADS,
                 options: dict[str, Any] | None = None) -> None:
        super().__init__()
        if not isinstance(url, str) or not url:
            raise ConfigError(f"list_objects() needs a URL string, got {url!r}")
        if pattern is not None and not isinstance(pattern, str):
            raise ConfigError(f"pattern must be a glob string, got {pattern!r}")
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ConfigError(f"list_objects(threads=...) must be an int >= 1, got {threads!r}")
        if options and not isinstance(backend, Backend):
            # a misspelled option (patern=) lands among the backend options: name it as a slip
            check_backend_options("list_objects", backend, options, stage_options=_OWN_OPTIONS)
        self.url = url
        self.pattern = pattern
        self.backend = backend
        self.manifest = os.fspath(manifest) if manifest is not None else None
        self.threads = threads
        self.options = dict(options or {})
        self._objects: Objects | None = None
        if objects is not None:
            self._objects = objects if isinstance(objects, (KeyTable, tuple)) else tuple(objects)
        self._index = self._first = 0
        self._earlier = 0  # objects delivered by the runs before this one, and read by at()
        self._sample_at = 0  # the index at which next() asks for a timing sample

    def objects(self) -> Objects:
        """The listing: from ``objects``, else the manifest, else the store (once)."""
        if self._objects is None:
            self._objects = obtain_listing(self.url, pattern=self.pattern, backend=self.backend,
                                           manifest=self.manifest, threads=self.threads,
                                           options=self.options)
        return self._objects

    def start(self, state: dict[str, Any] | None) -> None:
        self.objects()
        self._earlier += self._index - self._first
        self._index = self._first = int(state["index"]) if state else 0
        self._sample_at = self._index

    def delivered(self) -> int:
        # counted here, not by the meter: read by assignment (a sharded or shuffled listing,
        # in every DataLoader worker) the objects leave through at(), which the meter never sees
        return self._earlier + self._index - self._first

    def next(self) -> ObjectInfo:
        objects = self.objects()
        i = self._index
        if i >= len(objects):
            raise StopIteration
        if i >= self._sample_at:
            self._sample_at = i + self._sample_soon()
        self._index = i + 1
        return objects[i]

    #: the listing gives object ``i`` directly: the builder reads it by assignment
    random_access = True
    elastic_roles = frozenset({"before_shard"})

    def at(self, i: int) -> ObjectInfo:
        """Object ``i`` of the sorted listing (for reading by assignment; counted as delivered
        by this stage)."""
        self._earlier += 1
        return self.objects()[i]

    def get_state(self) -> dict[str, Any]:
        return {"index": self._index}

    def __len__(self) -> int:
        return len(self.objects())

    def __getitem__(self, i: int) -> ObjectInfo:
        """The ``i``-th object of the listing (random access for block-wise assignment)."""
        return self.objects()[i]

    def known_length(self) -> int | None:
        """The number of objects once listed (here or from the manifest), without listing."""
        return len(self._objects) if self._objects is not None else None
