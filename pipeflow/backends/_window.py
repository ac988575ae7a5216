"""A body read as consecutive ranged requests of a fixed window, with bounded memory.

Some clients (the AWS CRT of s3torchconnector) download a whole response as fast as the
network allows, whatever the reader consumes: one GET of a 1 GB object holds up to 1 GB in
the client. :class:`WindowedBody` bounds that by asking for the object one window at a time
(``[lo, lo + window)``) and requesting the next window only once the reader has reached the
current one, so at most two windows are ever requested and not yet delivered: one being read,
one arriving. From the second window on, the next request starts as soon as the reader reaches the
start of the window arriving, so consecutive requests overlap (one round trip per object is
waited for, not one per window); the first window never starts a second request, so an object
that fits in one window costs one GET. That bound is :attr:`WindowedBody.peak_buffered`,
measured, not assumed.

The requests run on one background thread that hands chunks to the reader through a queue;
the reader waits at most ``read_timeout`` seconds for the next chunk, so a server that stalls
in the middle of a body becomes a :class:`TimeoutError` (transient: the caller resumes with a
new ranged request) instead of a hang.

Versions: some clients' GET streams carry no ETag and take no ``If-Match``. A ``check``
callback (a HEAD comparing the ETag with the first one seen) then runs before every window after
the first and once after the last window of a body of several, so an object replaced between
two windows fails the read instead of splicing two versions together.

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


class _Pump:
    """The background side: requests windows and queues their chunks. It holds no reference to
    the :class:`WindowedBody`, so a body dropped without ``close()`` is still collected (and its
    finaliser stops the pump)."""

    def __init__(self, fetch: Callable[[int, int], Iterable[bytes]], start: int, end: int | None,
                 window: int, is_past_end: Callable[[BaseException], bool],
                 check: Callable[[], None] | None = None, check_first: bool = False) -> None:
        self.fetch, self.start, self.end, self.window = fetch, start, end, window
        self.is_past_end = is_past_end
        self.check = check
        self.check_first = check_first
        self.queue: queue.Queue[Any] = queue.Queue()
        self.cond = threading.Condition()
        self.stop = False
        self.pos = start    # next byte the reader gets
        self.peak = 0       # the most bytes requested and not yet handed to the reader

    def _bounds(self, lo: int) -> int:
        return lo + self.window if self.end is None else min(lo + self.window, self.end)

    def _check(self, lo: int) -> None:
        """The version check before the window at ``lo`` (none before the body's first one
        unless ``check_first``: a stream resumed mid-object checks at once)."""
        if self.check is not None and (lo > self.start or self.check_first):
            self.check()

    def request(self, lo: int) -> tuple[Iterable[bytes], int]:
        self._check(lo)
        hi = self._bounds(lo)
        with self.cond:
            # never more than two windows ahead of the reader: wait until it reaches `lo - window`
            self.cond.wait_for(lambda: self.stop or self.pos >= lo - self.window)
            if self.stop:
                raise _Stopped
            self.peak = max(self.peak, hi - self.pos)
        return iter(self.fetch(lo, hi)), hi

    def try_request(self, lo: int) -> tuple[Iterable[bytes], int] | None:
        """Start the request of the window at ``lo`` now if the bound allows it, else None."""
        hi = self._bounds(lo)
        with self.cond:
            if self.stop or self.pos < lo - self.window:
                return None
            self.peak = max(self.peak, hi - self.pos)
        self._check(lo)
        return iter(self.fetch(lo, hi)), hi

    def run(self) -> None:
        lo, first, chunks, ahead = self.start, True, None, None
        try:
            chunks, hi = self.request(lo)
            while True:
                got = 0
                # From the second window on, the next window's request starts while this one
                # is still arriving (as soon as the reader has reached this window's start),
                # so the two overlap and no request waits for the previous one's last byte.
                # Not in the first window: an object shorter than a window must cost one GET.
                overlap = lo > self.start and (self.end is None or hi < self.end)
                for chunk in chunks:
                    if self.stop:
                        return
                    got += len(chunk)
                    first = False
                    self.queue.put(bytes(chunk))
                    if overlap and ahead is None:
                        ahead = self.try_request(hi)
                if got < hi - lo or (self.end is not None and hi >= self.end):
                    break  # a short window is the last one (a request started past it is dropped)
                lo = hi
                if ahead is not None:
                    (chunks, hi), ahead = ahead, None
                else:
                    chunks, hi = self.request(lo)
            if lo > self.start or self.check_first:
                self._check(lo)  # the last window came from the version checked before it
            self.queue.put(_END)
        except _Stopped:
            return
        except BaseException as exc:  # handed to the reader, raised there
            if self.is_past_end(exc):  # a window starting at (or past) the end: nothing more
                self.queue.put(_END)
            else:
                self.queue.put(_Failure(exc, first))
        finally:
            # drop the requests now (the client cancels them), not when the thread is freed
            del chunks, ahead


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
        check: called (on the request thread) before each window after the first and once
            after the last one of a body of several; raises when the object has changed.
        check_first: run ``check`` before the first window too (a body resuming a read).
    """

    def __init__(self, fetch: Callable[[int, int], Iterable[bytes]], *, start: int, end: int | None,
                 window: int, read_timeout: float | None,
                 is_past_end: Callable[[BaseException], bool],
                 on_request_error: Callable[[BaseException], BaseException] | None = None,
                 check: Callable[[], None] | None = None, check_first: bool = False) -> None:
        super().__init__()
        self._timeout = read_timeout
        self._on_request_error = on_request_error
        self._pump = _Pump(fetch, start, end, window, is_past_end, check, check_first)
        self._buf = memoryview(b"")
        self._done = False
        threading.Thread(target=self._pump.run, name="pipeflow-window", daemon=True).start()

    @property
    def peak_buffered(self) -> int:
        """The most bytes requested from the server and not yet handed to the reader."""
        return self._pump.peak

    # ---- the reader's side ------------------------------------------------------------------
    def _next_chunk(self) -> bytes:
        if self._done:
            return b""
        try:
            item = self._pump.queue.get(timeout=self._timeout)
        except queue.Empty:
            raise TimeoutError(f"no bytes for {self._timeout:g} s at byte {self._pump.pos}") from None
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
        pump = self._pump
        with pump.cond:
            pump.pos += n
            pump.cond.notify_all()

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
        pump = getattr(self, "_pump", None)
        if not self.closed and pump is not None:
            with pump.cond:
                pump.stop = True
                pump.cond.notify_all()
            self._buf = memoryview(b"")
            # a pump blocked on a stalled connection ends when that connection delivers or
            # closes; it holds no more than its window, and drops it on waking
        super().close()


class _Stopped(Exception):
    pass
