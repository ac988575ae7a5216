"""``fetch_batch``: download objects in batches in the background, deliver them from local disk.

This is the "s5cmd sampler" of the seed article as one stage. Items are cut into batches of
``batch_size`` samples; one ``s5cmd run`` command file downloads a whole batch (s5cmd runs many
requests in parallel), and batch k+1 downloads while batch k is consumed (double buffering).
Each file is deleted as soon as it has been delivered, and the private staging directory is
removed on ``close()``, on an exception, on ``break`` (when the iterator is dropped) and at
garbage collection, so nothing is left in ``/tmp`` or ``/dev/shm``.

How a batch is downloaded is the backend's business (:meth:`pipeflow.backends.Backend.start_batch`,
the :class:`~pipeflow.backends.batch.BatchDownloader` capability): by default a thread pool
(``workers`` threads) over the backend's ordinary ``open``; s5cmd overrides it with
``s5cmd run``.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
import weakref
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .._checks import check_bool, check_choice, check_int
from ..backends.base import Backend
from ..backends.batch import BatchHandle
from ..backends.registry import backend_class, get_backend, known_backends
from ..errors import BackendError, ConfigError, StageError
from ..items import ObjectInfo, Record
from .base import SOURCES_KEY, Stage, describe_item

__all__ = ["BatchFetcher"]

#: extensions (the last one of the key's basename) kept on local file names, so tools that look
#: at suffixes still work; anything else is dropped: a key never decides a local path
_SAFE_EXT = re.compile(r"\.[A-Za-z0-9_-]{1,16}")

#: s5cmd's own default ``--numworkers``: requests one ``s5cmd run`` keeps in flight
S5CMD_NUMWORKERS = 256


@dataclass
class _Batch:
    """One batch: its samples, where it starts in the source, and its download."""

    start_state: dict[str, Any]
    skip: int                               # samples of the batch dropped before download (resume)
    samples: list[tuple[tuple[str, ...], bool, tuple[str, ...]]]  # (urls, grouped, local paths)
    directory: str
    handle: BatchHandle | None = None
    error: BaseException | None = None      # the download could not even start
    results: dict[str, BaseException | None] | None = None
    pos: int = 0                            # samples delivered (or skipped) so far
    delivered: list[str] = field(default_factory=list)  # paths of the last delivered sample


class _Resources:
    """Everything that must be released: downloads in flight and the staging directory.

    Kept apart from the stage so a ``weakref.finalize`` can release it without keeping the
    stage alive.
    """

    def __init__(self, staging: str) -> None:
        self.staging = staging
        self.handles: list[BatchHandle] = []
        self.lock = threading.Lock()

    def release(self) -> None:
        with self.lock:
            handles, self.handles = self.handles, []
        for handle in handles:
            try:
                handle.cancel()
            except Exception:  # releasing must go on: the directory still has to go
                pass
        shutil.rmtree(self.staging, ignore_errors=True)


def _normalise(item: Any, stage: str) -> tuple[tuple[str, ...], bool]:
    """``(urls, grouped)`` for one input item."""
    def one(value: Any) -> str:
        if isinstance(value, ObjectInfo):
            return value.url
        if isinstance(value, str) and value:
            return value
        raise ConfigError(f"{stage}: items must be URLs, ObjectInfo or tuples/lists of them, got "
                          f"{describe_item(item)}")

    if isinstance(item, (tuple, list)):
        if not item:
            raise ConfigError(f"{stage}: an empty sample (no URLs)")
        return tuple(one(v) for v in item), True
    return (one(item),), False


def _local_name(url: str, index: int, member: int) -> str:
    base = url.rstrip("/").rsplit("/", 1)[-1]
    ext = os.path.splitext(base)[1]
    return f"{index:06d}-{member}" + (ext if _SAFE_EXT.fullmatch(ext) else "")


class BatchFetcher(Stage[Any]):
    """Downloads items in batches, one batch ahead, and delivers them from local files.

    Input items are URLs (``str``), :class:`~pipeflow.items.ObjectInfo`, or tuples/lists of
    those forming one sample (e.g. ``(image_url, label_url)``); a batch holds ``batch_size``
    samples, whatever their number of files.

    Output (``output=``):

    * ``"bytes"`` (default): a :class:`~pipeflow.items.Record` ``(url, data, url)`` per URL
      item, or a tuple of Records for a tuple/list item. The files are read and deleted before
      the item is returned, so items may be held or passed to parallel stages freely.
    * ``"path"``: the local path (or a tuple of paths). With ``delete=True`` a path is valid
      until the next item is requested from this stage; read it before that (parallel stages
      downstream must get ``"bytes"``). With ``delete=False`` files stay until ``close()``.

    State: where the current batch starts in the source plus how many of its samples were
    delivered; resuming re-forms that batch and downloads only the rest.

    Args:
        source: the input stage.
        backend: a backend name or object; ``"s5cmd"`` (default) uses ``s5cmd run``, others
            use a thread pool over ``backend.open``.
        batch_size: samples per batch (>= 1).
        to: the directory for the staging area (a private subdirectory is created in it), e.g.
            ``"/dev/shm"`` for tmpfs; default: the system temp dir.
        delete: delete each file once delivered (otherwise at ``close()``).
        output: ``"bytes"`` or ``"path"``.
        workers: threads per batch for backends without batched downloads.
        on_error: ``"raise"`` (a failed download raises when its sample is reached) or
            ``"skip"`` (the sample is dropped and counted as ``skipped`` in the stats).
        timeout: seconds to wait for one batch (None: no limit).
        options: backend options when ``backend`` is a name.
    """

    replays_input = True

    def __init__(self, source: Stage[Any], backend: str | Backend = "s5cmd", *, batch_size: int = 1000,
                 to: str | os.PathLike[str] | None = None, delete: bool = True,
                 output: Literal["bytes", "path"] = "bytes", workers: int = 16,
                 on_error: Literal["raise", "skip"] = "raise", timeout: float | None = None,
                 options: Mapping[str, Any] | None = None) -> None:
        super().__init__(source)
        if not isinstance(backend, (str, Backend)):
            raise ConfigError(f"fetch_batch(): backend must be a name or a Backend, got {backend!r}")
        if isinstance(backend, str) and backend not in known_backends():
            backend_class(backend)  # raises UnknownBackendError listing the known ones
        if isinstance(backend, Backend) and options:
            raise ConfigError("fetch_batch(): pass options when creating the backend object")
        check_int(batch_size, "fetch_batch(batch_size=...)", low=1)
        check_int(workers, "fetch_batch(workers=...)", low=1)
        check_choice(output, "fetch_batch(output=...)", ("bytes", "path"))
        check_choice(on_error, "fetch_batch(on_error=...)", ("raise", "skip"))
        check_bool(delete, "fetch_batch(delete=...)")
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ConfigError(f"fetch_batch(): timeout must be a positive number, got {timeout!r}")
        if to is not None and not isinstance(to, (str, os.PathLike)):
            raise ConfigError(f"fetch_batch(): to must be a directory path, got {to!r}")
        self._backend_spec = backend
        self._options = dict(options or {})
        self._batch_size = batch_size
        self._to = os.fspath(to) if to is not None else None
        self._delete = delete
        self._output = output
        self._workers = workers
        self._on_error = on_error
        self._timeout = timeout
        self._backend: Backend | None = None
        self._res: _Resources | None = None
        self._finalizer: weakref.finalize | None = None
        self._batches: deque[_Batch] = deque()
        self._batch_no = 0
        self._exhausted = False
        self._state: dict[str, Any] = {}

    # ---- setup and teardown -------------------------------------------------------------
    @property
    def staging_dir(self) -> str | None:
        """The private directory files are downloaded into (None before the first item)."""
        return self._res.staging if self._res else None

    def _release(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # runs _Resources.release once, then detaches
            self._finalizer = None
        self._res = None
        self._batches.clear()

    def _backend_options(self) -> dict[str, Any]:
        """The backend's options. s5cmd runs ``numworkers`` requests at once per ``s5cmd run``
        (256 by default); in each of W DataLoader workers the default becomes 256 / W, so a
        job keeps the requests in flight of one process (as the article's sampler, which runs
        s5cmd from the main process) instead of W times as many: with 2 workers on a local S3
        server, 2 x 256 concurrent requests made a batch slower than 256 did."""
        options = dict(self._options)
        workers = self.context.num_workers
        if self._backend_spec == "s5cmd" and "numworkers" not in options and workers > 1:
            options["numworkers"] = max(1, S5CMD_NUMWORKERS // workers)
        return options

    def start(self, state: dict[str, Any] | None) -> None:
        if self._backend is None:
            self._backend = get_backend(self._backend_spec, **self._backend_options())
        parent = self._to or tempfile.gettempdir()
        try:
            # inside a directory that exists: made here, a typo ('/dev/shmm' for tmpfs) would
            # stage on another filesystem unnoticed, and stay behind as an empty directory
            staging = tempfile.mkdtemp(prefix="pipeflow-fetch-", dir=parent)
        except FileNotFoundError as exc:
            raise ConfigError(f"fetch_batch(to={parent!r}): no such directory; the staging "
                              "directory is made inside an existing one") from exc
        except OSError as exc:
            raise ConfigError(f"fetch_batch(): cannot create a staging directory in {parent!r}: "
                              f"{exc}") from exc
        self._res = _Resources(staging)
        self._finalizer = weakref.finalize(self, _Resources.release, self._res)
        self._batch_no = 0
        self._exhausted = False
        skip = int(state.get("offset", 0)) if state else 0
        self._state = {SOURCES_KEY: [self.source.state_dict()], "offset": skip}
        self._fill(skip)

    def stop(self) -> None:
        self._release()

    # ---- batches ------------------------------------------------------------------------
    def _fill(self, skip: int = 0) -> None:
        """Keep two batches in the pipeline: the one being consumed and the next downloading."""
        while len(self._batches) < 2 and not self._exhausted:
            batch = self._start_batch(skip)
            skip = 0
            if batch is not None:
                self._batches.append(batch)

    def _start_batch(self, skip: int) -> _Batch | None:
        assert self._res is not None and self._backend is not None
        start_state = self.source.state_dict()
        items = []
        for _ in range(self._batch_size):
            try:
                items.append(next(self.source))
            except StopIteration:
                self._exhausted = True
                break
        if not items:
            return None
        number = self._batch_no
        self._batch_no += 1
        directory = os.path.join(self._res.staging, f"batch-{number:06d}")
        os.mkdir(directory)
        samples = []
        pairs: list[tuple[str, str]] = []
        for index, item in enumerate(items):
            if index < skip:
                continue  # delivered before the state was saved
            urls, grouped = _normalise(item, self.name)
            paths = tuple(os.path.join(directory, _local_name(u, index, j)) for j, u in enumerate(urls))
            samples.append((urls, grouped, paths))
            pairs.extend(zip(urls, paths))
        batch = _Batch(start_state=start_state, skip=min(skip, len(items)), samples=samples,
                       directory=directory)
        if pairs:
            try:
                batch.handle = self._start_download(pairs, directory)
            except Exception as exc:  # surfaced when the consumer reaches this batch
                batch.error = exc.with_traceback(None)
            else:
                with self._res.lock:
                    self._res.handles.append(batch.handle)
        return batch

    def _start_download(self, pairs: list[tuple[str, str]], directory: str) -> BatchHandle:
        assert self._backend is not None
        return self._backend.start_batch(pairs, workdir=directory, workers=self._workers)

    def _forget(self, batch: _Batch) -> None:
        """Stop tracking a finished download; the finalizer must not keep its results alive."""
        if batch.handle is not None and self._res is not None:
            with self._res.lock:
                if batch.handle in self._res.handles:
                    self._res.handles.remove(batch.handle)

    def _finish_batch(self, batch: _Batch) -> None:
        self._forget(batch)
        if batch.handle is not None:
            batch.handle.cancel()
        if self._delete:
            shutil.rmtree(batch.directory, ignore_errors=True)

    # ---- iteration ----------------------------------------------------------------------
    def _drop_delivered(self, batch: _Batch) -> None:
        if self._delete:
            for path in batch.delivered:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        batch.delivered = []

    def next(self) -> Any:
        while self._batches:
            batch = self._batches[0]
            self._drop_delivered(batch)
            if batch.results is None:
                if batch.error is not None:
                    raise batch.error
                with self.context.stats.counting(self.name):  # retries made while waiting count here
                    batch.results = batch.handle.wait(self._timeout) if batch.handle is not None else {}
                self._forget(batch)
                self._fill()  # batch k is ready: start k+1 while it is consumed
            if batch.pos >= len(batch.samples):
                self._finish_batch(self._batches.popleft())
                self._fill()
                continue
            urls, grouped, paths = batch.samples[batch.pos]
            batch.pos += 1
            self._state = {SOURCES_KEY: [batch.start_state], "offset": batch.skip + batch.pos}
            failure = next(((u, batch.results.get(p)) for u, p in zip(urls, paths)
                            if batch.results.get(p) is not None), None)
            if failure is not None:
                batch.delivered = list(paths)
                self._drop_delivered(batch)
                url, exc = failure
                if self._on_error == "skip":
                    self.context.stats.incr(self.name, "skipped")
                    continue
                if isinstance(exc, (BackendError, ConfigError)):
                    raise exc
                raise StageError(f"download failed: {exc!r}", stage=self.name, key=url) from exc
            return self._deliver(batch, urls, grouped, paths)
        self._release()  # exhausted: the staging directory goes now, not at close()
        raise StopIteration

    def _deliver(self, batch: _Batch, urls: tuple[str, ...], grouped: bool, paths: tuple[str, ...]) -> Any:
        if self._output == "path":
            batch.delivered = list(paths)
            return paths if grouped else paths[0]
        records = []
        for url, path in zip(urls, paths):
            with open(path, "rb") as f:
                records.append(Record(url, f.read(), url))
        batch.delivered = list(paths)
        self._drop_delivered(batch)
        return tuple(records) if grouped else records[0]

    def get_state(self) -> dict[str, Any]:
        return dict(self._state)

