"""``cache``: a local disk cache in front of object reads, shared safely by worker processes.

Like Mountpoint for Amazon S3 with a data cache (article 002): the first epoch reads each object
from the store and keeps a copy on local disk; later epochs are served from disk and send no
request at all. Objects are assumed immutable while the cache is in use (Mountpoint's
``--metadata-ttl indefinite``): a cached copy is never revalidated.

The copies live in a :class:`~pipeflow.disk_cache.DiskCache`, which several processes
(DataLoader workers, ranks on one host) may share.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from ..disk_cache import DiskCache
from ..items import Record
from ._backends import BackendsByScheme, url_of
from .map import WindowedOptions, WindowedStage

__all__ = ["Cacher"]


class Cacher(WindowedStage):
    """Reads every URL through a :class:`DiskCache`: from disk on a hit, else from the backend.

    Input items are URLs (``str`` or :class:`~pipeflow.items.ObjectInfo`); output items are
    ``Record(url, data, url)``, like ``open(read=True)``. Hits and misses are counted in
    ``stats()[name]["cache_hits"|"cache_misses"]``; objects larger than ``max_bytes`` are read
    but not kept (``"cache_too_large"``).

    Args:
        source: the input stage.
        directory: the cache directory; several processes may share it.
        max_bytes: the size budget (least recently used files are evicted beyond it).
        backend: a backend name or instance for misses; default: by URL scheme.
        workers: threads reading misses concurrently (0: inline); hits are read the same way.
        on_error: ``"raise"`` or ``"skip"`` (counted as ``"skipped"``).
        backend_options: options for the backend when ``backend`` is a name.
    """

    def __init__(self, source: Any, directory: str | os.PathLike[str], *, max_bytes: int,
                 backend: Any = None, workers: int = 0, on_error: Literal["raise", "skip"] = "raise",
                 backend_options: dict[str, Any] | None = None) -> None:
        self.cache = DiskCache(directory, max_bytes=max_bytes)
        self.backends = BackendsByScheme(backend, backend_options or {}, what="cache",
                                         options_need_backend=False)
        super().__init__(source, self._fetch, WindowedOptions(
            what="cache", workers=workers, method="thread", on_error=on_error, inline=self._hit))

    def _hit(self, item: Any) -> tuple[bool, Any]:
        # hits are a local file read: serve them in the consumer's thread, no pool round trip
        url = url_of(item, "cache")
        data = self.cache.get(url)
        if data is None:
            return False, None
        self.context.stats.incr(self.name, "cache_hits")
        return True, Record(url, data, url)

    def _fetch(self, item: Any) -> Record:
        url = url_of(item, "cache")
        data = self.cache.get(url)
        if data is not None:
            self.context.stats.incr(self.name, "cache_hits")
            return Record(url, data, url)
        data = self.backends.for_url(url).read(url)
        self.context.stats.incr(self.name, "cache_misses")
        if not self.cache.put(url, data):
            self.context.stats.incr(self.name, "cache_too_large")
        return Record(url, data, url)

    def close(self) -> None:
        super().close()
        self.backends.close()
