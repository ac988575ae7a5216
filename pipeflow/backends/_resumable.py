"""A stream that resumes where its body broke off, instead of starting over.

:class:`ResumableStream` is a non-seekable binary stream over an ``opener(offset)`` (a ranged
GET, or a command started again). When the body breaks off mid-way with a transient failure, it
reopens from the byte already delivered, under the backend's
:class:`~pipeflow.backends._retry.RetryPolicy`: each stretch without progress gets the policy's
whole budget, and any delivered byte starts a fresh one.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, BinaryIO

from ._retry import RetryPolicy, RetryTimer, exhausted, is_transient, note_retry

__all__ = ["ResumableStream", "TruncatedBodyError"]

#: read size used by ``read()`` without a size
_READ_ALL_CHUNK = 4 << 20


class TruncatedBodyError(ConnectionError):
    """A response body ended before the announced length (a transient failure)."""

if TYPE_CHECKING:
    # what the type checker is told: a binary file object (``Backend.open`` returns
    # ``IO[bytes]``), as typeshed declares io.BufferedReader; at run time the io base class
    # alone, so no abstract ``name``/``mode`` attribute of typing.IO shadows a caller's fallback
    class _BinaryFile(io.BufferedIOBase, BinaryIO):
        pass
else:
    _BinaryFile = io.BufferedIOBase


class ResumableStream(_BinaryFile):
    """A readable, non-seekable stream that survives broken connections.

    Args:
        opener: ``opener(offset)`` returns a fresh binary stream positioned at ``offset`` (a
            ranged GET). It is called lazily, on the first read, and again after each failure.
        start: the offset of the first byte this stream delivers.
        size: the object's total size when known; a body that ends before it counts as a
            transient failure and is resumed.
        policy: the retry budget.
        url, backend, endpoint: for error messages.
        classify: which failures are transient.
        sleep, clock: injectable for tests.
        first: an already opened body for ``start`` (so open errors surface at open time).
        translate: maps a permanent (non-transient) read failure to a typed error.

    The number of resumptions is available as :attr:`resumes`.
    """

    def __init__(self, opener: Callable[[int], IO[bytes]], *, start: int = 0, size: int | None = None,
                 policy: RetryPolicy | None = None, url: str = "", backend: str = "",
                 endpoint: str | None = None,
                 classify: Callable[[BaseException], bool] = is_transient,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic,
                 first: IO[bytes] | None = None,
                 translate: Callable[[BaseException], BaseException] | None = None) -> None:
        super().__init__()
        self._opener = opener
        self._pos = start
        self._size = size
        self._policy = policy or RetryPolicy()
        self._url = url
        self._backend = backend
        self._endpoint = endpoint
        self._classify = classify
        self._sleep = sleep
        self._clock = clock
        self._raw: IO[bytes] | None = first
        self._translate = translate
        self._timer: RetryTimer | None = None  # the current stretch without progress
        self.resumes = 0

    # ---- io protocol ----------------------------------------------------------------------
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._pos

    @property
    def url(self) -> str:
        return self._url

    def close(self) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            try:
                raw.close()
            except Exception:  # a broken connection may fail to close; nothing to recover
                pass
        super().close()

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self._read_all()
        chunks: list[bytes] = []
        remaining = size
        while remaining > 0:
            chunk = self.read1(remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def read1(self, size: int = -1) -> bytes:
        if size == 0:  # the body's answer, b"", would look like a connection cut short
            return b""
        if size is None or size < 0:
            size = 1 << 20
        return self._attempt(lambda raw: raw.read(size))

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def readinto1(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read1(len(view))
        view[: len(data)] = data
        return len(data)

    # ---- machinery ------------------------------------------------------------------------
    def _read_all(self) -> bytes:
        # bounded reads, so a failure loses at most one chunk and the resume starts from
        # the bytes already delivered (a single read() would return nothing on failure)
        chunks: list[bytes] = []
        while True:
            chunk = self._attempt(lambda raw: raw.read(_READ_ALL_CHUNK))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)

    def _attempt(self, op: Callable[[IO[bytes]], bytes]) -> bytes:
        if self.closed:
            raise ValueError("I/O operation on closed stream")
        while True:
            try:
                if self._raw is None:
                    if self._size is not None and self._pos >= self._size:
                        return b""
                    self._raw = self._opener(self._pos)
                data = op(self._raw)
                if not data and self._size is not None and self._pos < self._size:
                    raise TruncatedBodyError(
                        f"body ended at byte {self._pos} of {self._size}")
            except Exception as exc:
                if not self._classify(exc):
                    err = self._translate(exc) if self._translate is not None else exc
                    if err is exc:
                        raise
                    raise err from exc
                self._recover(exc)
                continue
            if data:
                self._pos += len(data)
                self._timer = None
            return data

    def _recover(self, exc: BaseException) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            try:
                raw.close()
            except Exception:  # the connection is already broken
                pass
        if self._timer is None:
            self._timer = self._policy.timer(self._clock)
        delay = self._timer.failed()
        self.resumes += 1
        limit = self._policy.max_resumes
        if delay is None or (limit is not None and self.resumes > limit):
            raise exhausted(self._timer, exc, what=f"stream broken off at byte {self._pos}",
                            url=self._url, backend=self._backend, op="read",
                            endpoint=self._endpoint) from exc
        note_retry(delay)
        self._sleep(delay)
