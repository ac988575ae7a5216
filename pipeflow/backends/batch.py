"""Batched downloads: a backend capability with a default implementation.

``fetch_batch()`` hands a backend many ``(url, local path)`` pairs at once and consumes the
files while the next batch downloads. Any backend can do that through its ordinary ``open``:
:meth:`pipeflow.backends.Backend.start_batch` runs :class:`ThreadPoolBatch`, a pool of threads
over ``open``. A backend with a better way (s5cmd runs one ``s5cmd run`` command file for the
whole batch) overrides ``start_batch``. The capability is declared as the
:class:`BatchDownloader` protocol; the handle it returns as :class:`BatchHandle`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Protocol, runtime_checkable

from ..errors import BackendError

__all__ = ["BatchDownloader", "BatchHandle", "Opens", "ThreadPoolBatch"]

#: bytes copied per read; also how often a cancelled copy notices it
_CHUNK = 1 << 20


class Opens(Protocol):
    """What :class:`ThreadPoolBatch` needs of a backend (every ``Backend`` has it); a protocol,
    so this module does not import ``base.py``, which imports it."""

    @property
    def name(self) -> str:
        """The backend's registry name (for errors)."""
        ...

    def open(self, url: str, *, start: int = 0) -> IO[bytes]:
        """A readable binary stream of the object at ``url``."""
        ...


@runtime_checkable
class BatchHandle(Protocol):
    """A running batch download (what ``start_batch`` returns)."""

    def wait(self, timeout: float | None = None) -> dict[str, BaseException | None]:
        """Block until done; ``{local path: None, or the error for that file}``.

        Raises:
            BackendError: not done within ``timeout`` seconds (the batch is cancelled).
        """
        ...

    def cancel(self) -> None:
        """Stop, release processes/threads, leave no partial file behind. Idempotent."""
        ...


@runtime_checkable
class BatchDownloader(Protocol):
    """Something that downloads many objects to local files at once (every ``Backend`` is one)."""

    def start_batch(self, pairs: Sequence[tuple[str, str]], *, workdir: str,
                    workers: int = 16) -> BatchHandle:
        """Start downloading ``(url, absolute local path)`` pairs; return at once.

        ``workdir`` is a private directory the implementation may use for scratch files (it is
        removed by the caller); ``workers`` is a hint for implementations that use threads.
        A file that cannot be downloaded is reported by ``wait()``, never raised here, so one
        bad object does not fail the whole batch.
        """
        ...


class _Cancelled(Exception):
    pass


class ThreadPoolBatch:
    """Downloads ``(url, path)`` pairs through ``backend.open`` on a pool of threads.

    Each file is written to ``path + ".part"`` and renamed when complete, so a path that exists
    is whole. ``cancel()`` stops the copies at the next chunk and joins the threads.
    """

    def __init__(self, backend: Opens, pairs: Sequence[tuple[str, str]], *, workers: int) -> None:
        self.backend = backend
        self.pairs = list(pairs)
        self._stop = threading.Event()
        # a plain executor: backends sit below pipeflow's own executor layer
        self._pool = ThreadPoolExecutor(max(1, min(workers, len(self.pairs))),
                                        thread_name_prefix="pipeflow-fetch")
        self._futures: list[tuple[str, Future[None]]] = [
            (dest, self._pool.submit(self._copy, url, dest)) for url, dest in self.pairs
        ]
        self._results: dict[str, BaseException | None] | None = None

    def _copy(self, url: str, dest: str) -> None:
        if self._stop.is_set():
            raise _Cancelled
        part = dest + ".part"
        try:
            with self.backend.open(url) as src, open(part, "wb") as out:
                self._pump(src, out)
            os.replace(part, dest)
        except BaseException:
            try:
                os.unlink(part)
            except OSError:
                pass
            raise

    def _pump(self, src: IO[bytes], out: IO[bytes]) -> None:
        while chunk := src.read(_CHUNK):
            if self._stop.is_set():
                raise _Cancelled
            out.write(chunk)

    def wait(self, timeout: float | None = None) -> dict[str, BaseException | None]:
        if self._results is None:
            results: dict[str, BaseException | None] = {}
            for dest, future in self._futures:
                try:
                    future.result(timeout=timeout)
                    results[dest] = None
                except TimeoutError:
                    self.cancel()
                    raise BackendError(f"batch download did not finish within {timeout} s",
                                       url=self.pairs[0][0], backend=self.backend.name, op="fetch") from None
                except Exception as exc:  # per file; reported when the sample is reached
                    results[dest] = exc
            self._pool.shutdown(wait=True)
            self._results = results
        return self._results

    def cancel(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
