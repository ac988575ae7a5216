"""A directory of cached objects keyed by URL, shared safely by worker processes.

* a copy is written to a temporary file in its final directory and renamed into place with
  ``os.replace``, so a reader sees either no file or a complete one, never a torn one; two
  processes fetching the same object at once both write and the last rename wins, with the
  same content;
* eviction removes the least recently used files (by modification time, which a hit refreshes)
  until the total is under ``max_bytes``; a file another process deleted first, or one a
  reader still has open, is harmless (POSIX keeps open files readable after unlink);
* temporary files left behind by a killed process are removed by the next eviction scan once
  they are older than ``stale_tmp_seconds``.

The size bound is enforced by each process from its own scans, so the directory can briefly
exceed ``max_bytes`` by what other processes wrote since this one last scanned. The ``cache``
stage (:mod:`pipeflow.stages.cache`) reads objects through it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from ._checks import check_int
from ._fs import atomic_write
from .errors import ConfigError

__all__ = ["DiskCache"]

_TMP_PREFIX = ".tmp-"


class DiskCache:
    """A directory of cached objects keyed by URL, with LRU eviction by total size.

    Picklable (only the directory and limits travel), so it can be used from worker processes.

    Args:
        directory: the cache directory (created if missing); share it between processes to
            share the cache.
        max_bytes: the size budget of the cached files.
        stale_tmp_seconds: temporary files older than this are leftovers of a dead writer.
    """

    def __init__(self, directory: str | os.PathLike[str], *, max_bytes: int,
                 stale_tmp_seconds: float = 600.0) -> None:
        check_int(max_bytes, "cache(max_bytes=...)", low=1)
        self.directory = os.fspath(directory)
        if not self.directory:
            raise ConfigError("cache() needs a directory")
        self.max_bytes = max_bytes
        self.stale_tmp_seconds = stale_tmp_seconds
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._estimate: int | None = None  # bytes on disk as of the last scan plus own writes

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory, "max_bytes": self.max_bytes,
                "stale_tmp_seconds": self.stale_tmp_seconds}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def path_for(self, url: str) -> str:
        """The file that holds the copy of ``url`` (whether or not it exists)."""
        digest = hashlib.sha256(url.encode("utf-8")).hexdigest()
        return os.path.join(self.directory, digest[:2], digest)

    def get(self, url: str) -> bytes | None:
        """The cached bytes of ``url``, or None on a miss. A hit marks the file recently used."""
        path = self.path_for(url)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        with contextlib.suppress(OSError):  # evicted meanwhile: the bytes we read are still whole
            os.utime(path)
        return data

    def put(self, url: str, data: bytes) -> bool:
        """Store ``data`` as the copy of ``url``; returns False when it is larger than the budget."""
        if len(data) > self.max_bytes:
            return False
        path = self.path_for(url)
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        atomic_write(path, data, tmp_prefix=_TMP_PREFIX)
        with self._lock:
            if self._estimate is None:
                self._estimate = self._scan_total()
            else:
                self._estimate += len(data)
            over = self._estimate > self.max_bytes
        if over:
            self.evict()
        return True

    def _files(self) -> Iterator[tuple[str, int, float]]:
        """``(path, size, mtime)`` of every cached file; removes stale temporary files."""
        now = time.time()
        try:
            subdirs = list(os.scandir(self.directory))
        except FileNotFoundError:
            return
        for sub in subdirs:
            if not sub.is_dir(follow_symlinks=False):
                continue
            try:
                entries = list(os.scandir(sub.path))
            except FileNotFoundError:
                continue
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # deleted by another process since the listing
                    continue
                if entry.name.startswith(_TMP_PREFIX):
                    if now - st.st_mtime > self.stale_tmp_seconds:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(entry.path)
                    continue
                yield entry.path, st.st_size, st.st_mtime

    def _scan_total(self) -> int:
        return sum(size for _, size, _ in self._files())

    def size(self) -> int:
        """Bytes of cached files on disk now (temporary files excluded)."""
        return self._scan_total()

    def evict(self) -> int:
        """Remove least recently used files until the total is within ``max_bytes``.

        Returns:
            The number of bytes removed by this call.
        """
        files = sorted(self._files(), key=lambda f: f[2])
        total = sum(size for _, size, _ in files)
        removed = 0
        for path, size, _ in files:
            if total <= self.max_bytes:
                break
            try:
                os.unlink(path)
                removed += size
            except FileNotFoundError:  # another process evicted it first
                pass
            total -= size
        with self._lock:
            self._estimate = total
        return removed

    def clear(self) -> None:
        """Remove every cached file (the directory itself stays)."""
        for path, _, _ in list(self._files()):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        with self._lock:
            self._estimate = 0
