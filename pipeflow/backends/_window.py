"""A body read as consecutive ranged requests of a fixed window, with bounded memory.

Some clients (the AWS CRT of s3torchconnector) download a whole response as fast as the
network allows, whatever the reader consumes: one GET of a 1 GB object holds up to 1 GB in
the client. :class:`WindowedBody` bounds that by asking for the object one window at a time
(``[lo, lo + window)``) and requesting the next window only once the reader has reached the
current one, so at most two windows are ever requested and not yet delivered: one being read,
one arriving. That bound is :attr:`WindowedBody.peak_buffered`, measured, not assumed.

The requests run on one background thread that hands chunks to the reader through a queue;
the reader waits at most ``read_timeout`` seconds for the next chunk, so a server that stalls
in the middle of a body becomes a :class:`TimeoutError` (transient: the caller resumes with a
new ranged request) instead of a hang.

The end of the object needs no HEAD request: a window that comes back shorter than asked is
the last one, and a window that starts exactly at the end is refused by the server (HTTP 416),
which ``is_past_end`` recognises.
"""

from __future__ import annotations

import io
import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["WindowedBody"]

_END = object()


class _Failure:
    def __init__(self, exc: BaseException, first: bool) -> None:
        self.exc = exc
        self.first = first  # nothing of the body had arrived yet


class WindowedBody(io.RawIOBase):
    """A raw, non-seekable stream of bytes ``[start, end)`` of one object.

    Args:
        fetch: ``fetch(lo, hi)`` starts a ranged request of bytes ``[lo, hi)`` and returns an
            iterable of its body chunks (the request may fail lazily, on the first chunk).
        start: first byte.
        end: one past the last byte, or None for the end of the object.
        window: bytes per request.
        read_timeout: seconds to wait for the next chunk (None: forever).
        is_past_end: whether a failed request means "this range starts at the end".
        on_request_error: maps the failure of a request that delivered nothing of the body
            (the first window) to the error to raise; later failures are raised unchanged for
            the caller to resume.
    """

    def __init__(self, fetch: Callable[[int, int], Iterable[bytes]], *, start: int, end: int | None,
                 window: int, read_timeout: float | None,
                 is_past_end: Callable[[BaseException], bool],
                 on_request_error: Callable[[BaseException], BaseException] | None = None) -> None:
        super().__init__()
        self._fetch = fetch
        self._start = start
        self._end = end
        self._window = window
        self._timeout = read_timeout
        self._is_past_end = is_past_end
        self._on_request_error = on_request_error
        self._queue: queue.Queue[Any] = queue.Queue()
        self._cond = threading.Condition()
        self._stop = False
        self._pos = start          # next byte the reader gets
        self._requested = start    # one past the last byte requested so far
        self._buf = memoryview(b"")
        self._done = False
        #: the most bytes requested from the server and not yet handed to the reader
        self.peak_buffered = 0
        self._thread = threading.Thread(target=self._pump, name="pipeflow-window", daemon=True)
        self._thread.start()

    # ---- the background side ----------------------------------------------------------------
    def _request(self, lo: int) -> tuple[Iterable[bytes], int]:
        hi = lo + self._window if self._end is None else min(lo + self._window, self._end)
        with self._cond:
            # never more than two windows ahead of the reader: wait until it reaches `lo - window`
            self._cond.wait_for(lambda: self._stop or self._pos >= lo - self._window)
            if self._stop:
                raise _Stopped
            self._requested = hi
            self.peak_buffered = max(self.peak_buffered, hi - self._pos)
        return iter(self._fetch(lo, hi)), hi

    def _pump(self) -> None:
        lo, first, chunks = self._start, True, None
        try:
            chunks, hi = self._request(lo)
            while True:
                got = 0
                for chunk in chunks:
                    if self._stop:
                        return
                    got += len(chunk)
                    first = False
                    self._queue.put(bytes(chunk))
                if got < hi - lo or (self._end is not None and hi >= self._end):
                    break  # a short window is the last one
                lo = hi
                chunks, hi = self._request(lo)
            self._queue.put(_END)
        except _Stopped:
            return
        except BaseException as exc:  # handed to the reader, raised there
            if self._is_past_end(exc):  # a window starting at (or past) the end: nothing more
                self._queue.put(_END)
            else:
                self._queue.put(_Failure(exc, first))
        finally:
            del chunks  # drop the request now (the client cancels it), not when the thread is freed

    # ---- the reader's side ------------------------------------------------------------------
    def _next_chunk(self) -> bytes:
        if self._done:
            return b""
        try:
            item = self._queue.get(timeout=self._timeout)
        except queue.Empty:
            raise TimeoutError(f"no bytes for {self._timeout:g} s at byte {self._pos}") from None
        if item is _END:
            self._done = True
            return b""
        if isinstance(item, _Failure):
            self._done = True
            if item.first and self._on_request_error is not None:
                err = self._on_request_error(item.exc)
                if err is not item.exc:
                    raise err from item.exc
            raise item.exc
        return item

    def wait_first(self) -> None:
        """Block until the first chunk (or the end, or the request's failure) has arrived."""
        if not self._buf and not self._done:
            self._buf = memoryview(self._next_chunk())

    def readable(self) -> bool:
        return True

    def _advance(self, n: int) -> None:
        with self._cond:
            self._pos += n
            self._cond.notify_all()

    def readinto(self, buffer: Any) -> int:
        if not self._buf:
            chunk = self._next_chunk()
            if not chunk:
                return 0
            self._buf = memoryview(chunk)
        n = min(len(buffer), len(self._buf))
        buffer[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        self._advance(n)
        return n

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self.readall()
        if not self._buf:
            chunk = self._next_chunk()
            if not chunk:
                return b""
            self._buf = memoryview(chunk)
        out = bytes(self._buf[:size])
        self._buf = self._buf[len(out):]
        self._advance(len(out))
        return out

    def readall(self) -> bytes:
        parts = []
        while True:
            chunk = self.read(1 << 30)
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)

    def close(self) -> None:
        if not self.closed:
            with self._cond:
                self._stop = True
                self._cond.notify_all()
            self._buf = memoryview(b"")
            # a pump blocked on a stalled connection ends when that connection delivers or
            # closes; it holds no more than its window, and drops it on waking
        super().close()


class _Stopped(Exception):
    pass
