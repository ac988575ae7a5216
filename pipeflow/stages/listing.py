"""``list_objects``: a source of :class:`~pipeflow.items.ObjectInfo` items under a prefix.

Listing happens **once**, where the pipeline is written, never in every DataLoader worker:

* without a manifest, :func:`pipeflow.list_objects` lists eagerly when it is called, and the
  sorted result travels inside the pipeline description to every rank and worker (pickled with
  it); automatic sharding (:func:`pipeflow.graph.build`) then gives each worker its share;
* with ``manifest="path.jsonl"``, the first call lists and writes the manifest (JSON lines:
  ``url``, ``size``, ``etag``, ``mtime`` after a header line naming the listed URL and pattern);
  later calls, and every worker, read the file instead of the store. The pipeline carries only
  the path, which is what keeps a million-object listing cheap to ship to workers. Delete the
  file to list again.

The order is deterministic (sorted by URL), so every rank sees the same list and shards agree.
The state is the index of the next object.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import tempfile
from collections.abc import Sequence
from typing import Any

from .._braces import expand_braces, has_braces, literal_prefix
from ..backends._optional import installed
from ..backends.base import Backend
from ..backends.registry import backend_for_url, get_backend
from ..errors import ConfigError, CorruptDataError, ObjectNotFoundError
from ..items import ObjectInfo
from .base import Stage

__all__ = ["ObjectLister", "default_backend", "list_now", "read_manifest", "write_manifest"]

MANIFEST_VERSION = 1


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
             **options: Any) -> list[ObjectInfo]:
    """List ``url`` with a backend and filter by ``pattern`` (a glob on the part after ``url``).

    Raises:
        ObjectNotFoundError: nothing under ``url`` (matches ``pattern``).
    """
    be = get_backend(backend if backend is not None else default_backend(url), **options)
    base = literal_prefix(url) if has_braces(url) else url
    infos = [i for i in _listed(be, url, base)
             if pattern is None or fnmatch.fnmatchcase(_relative(i.url, base), pattern)]
    infos.sort(key=lambda i: i.url)  # backends list sorted already; make it a guarantee
    if not infos:
        what = f" matching {pattern!r}" if pattern else ""
        raise ObjectNotFoundError(f"no objects{what}", url=url, backend=be.name, op="list")
    return infos


def write_manifest(path: str, url: str, pattern: str | None, infos: Sequence[ObjectInfo]) -> None:
    """Write a listing atomically (a temporary file renamed into place)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".manifest-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            header = {"pipeflow_manifest": MANIFEST_VERSION, "url": url, "pattern": pattern}
            fh.write(json.dumps(header) + "\n")
            for info in infos:
                fh.write(json.dumps({"url": info.url, "size": info.size, "etag": info.etag,
                                     "mtime": info.mtime}, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_manifest(path: str, url: str | None = None, pattern: str | None = None) -> list[ObjectInfo]:
    """Read a manifest written by :func:`write_manifest`.

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
            raise CorruptDataError(f"unreadable manifest: {exc}", key=path) from exc
    return infos


class ObjectLister(Stage[ObjectInfo]):
    """Yields the objects under ``url`` in sorted order.

    Args:
        url: a prefix (``s3://bucket/train/``), a directory or a single object.
        pattern: a glob matched against the part of each URL after ``url`` (``"*.tar"``).
        backend: backend name or instance (default: chosen by the URL scheme).
        manifest: a local JSON-lines file to read the listing from, written on first use.
        objects: an already made listing (what :func:`pipeflow.list_objects` passes).
        options: backend options.
    """

    def __init__(self, url: str, *, pattern: str | None = None, backend: str | Backend | None = None,
                 manifest: str | os.PathLike[str] | None = None,
                 objects: Sequence[ObjectInfo] | None = None, options: dict[str, Any] | None = None,
                 ) -> None:
        super().__init__()
        if not isinstance(url, str) or not url:
            raise ConfigError(f"list_objects() needs a URL string, got {url!r}")
        if pattern is not None and not isinstance(pattern, str):
            raise ConfigError(f"pattern must be a glob string, got {pattern!r}")
        self.url = url
        self.pattern = pattern
        self.backend = backend
        self.manifest = os.fspath(manifest) if manifest is not None else None
        self.options = dict(options or {})
        self._objects: list[ObjectInfo] | None = list(objects) if objects is not None else None
        self._index = 0

    def objects(self) -> list[ObjectInfo]:
        """The listing: from ``objects``, else the manifest, else the store (once)."""
        if self._objects is None:
            if self.manifest is not None and os.path.exists(self.manifest):
                self._objects = read_manifest(self.manifest, self.url, self.pattern)
            else:
                self._objects = list_now(self.url, pattern=self.pattern, backend=self.backend,
                                         **self.options)
                if self.manifest is not None:
                    write_manifest(self.manifest, self.url, self.pattern, self._objects)
        return self._objects

    def start(self, state: dict[str, Any] | None) -> None:
        self.objects()
        self._index = int(state["index"]) if state else 0

    def next(self) -> ObjectInfo:
        objects = self.objects()
        if self._index >= len(objects):
            raise StopIteration
        self._index += 1
        return objects[self._index - 1]

    #: the listing gives object ``i`` directly: the builder reads it by assignment
    random_access = True
    elastic_roles = frozenset({"before_shard"})

    def at(self, i: int) -> ObjectInfo:
        """Object ``i`` of the sorted listing (for reading by assignment)."""
        return self.objects()[i]

    def get_state(self) -> dict[str, Any]:
        return {"index": self._index}

    def __len__(self) -> int:
        return len(self.objects())

    def known_length(self) -> int | None:
        """The number of objects once listed (here or from the manifest), without listing."""
        return len(self._objects) if self._objects is not None else None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if self.manifest is not None:
            state["_objects"] = None  # workers read the manifest, not a pickled copy
        return state
