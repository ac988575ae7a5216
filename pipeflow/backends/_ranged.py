"""A body read as consecutive ranged requests of a bounded size, with bounded memory.

Some clients (the AWS CRT of s3torchconnector) download a whole response as fast as the
network allows, whatever the reader consumes: one GET of a 1 GB object holds up to 1 GB in
the client. :class:`RangedBody` bounds that by asking for the object one range at a time
and requesting the next range only once the reader has reached the current one, so at most two
ranges are ever requested and not yet delivered: one being read, one arriving. The first range
is ``range_size`` bytes and each next one doubles, up to ``max_range_size``: a small object still
costs one short GET, while a long sequential read gets large requests that a client such as the
CRT splits into several parts in flight at once (fixed 8 MiB ranges kept a single part in
flight per stream, the CRT's whole-object GET many). From the second range on, the next request
starts as soon as the reader reaches the start of the range arriving, so consecutive requests
overlap (one round trip per object is
waited for, not one per range); the first range never starts a second request, so an object
that fits in one range costs one GET. That bound is :attr:`RangedBody.peak_buffered`,
measured, not assumed.

The requests run on one background thread (a :class:`~pipeflow._pump.Pump`) that hands chunks
to the reader through a queue; the reader waits at most ``read_timeout`` seconds for the next
chunk, so a server that stalls in the middle of a body becomes a :class:`TimeoutError`
(transient: the caller resumes with a new ranged request) instead of a hang.

Versions: some clients' GET streams carry no ETag and take no ``If-Match``. A ``check``
callback (a HEAD comparing the ETag with the first one seen) then runs for every range after
the first and once after the last range of a body of several, so an object replaced between
two ranges fails the read instead of splicing two versions together. The first check runs
before the second range is requested (the size it reports bounds the ranges); each later one
just after its range is requested, while the range before it is still being handed over, so
no request waits a round trip for a HEAD and no byte of a range reaches the reader before its
check has passed.

The end of the object needs no HEAD request: a range that comes back shorter than asked is
the last one, and a range that starts exactly at the end is refused by the server (HTTP 416),
which ``is_past_end`` recognises. When a version check reports the object's size, ranges stop
at it instead, and a range that comes back short of it was cut off (a client that splits a range
into parts was seen to end a range reaching past the object early, without an error): that is an
:class:`http.client.IncompleteRead`, transient, and the caller resumes at the byte reached.
"""

from __future__ import annotations

import http.client
import io
import queue
import threading
from collections.abc import Callable, Iterable
from typing import Any

from .._pump import Pump

__all__ = ["RangedBody"]


class _Requests:
    """The background side: requests ranges and queues their chunks (unbounded: the two-range
    bound is kept here). It holds no reference to the :class:`RangedBody`, so a body dropped
    without ``close()`` is still collected (and its finaliser stops the pump)."""

    def __init__(self, fetch: Callable[[int, int], Iterable[bytes]], start: int, end: int | None,
                 sizes: tuple[int, int], is_past_end: Callable[[BaseException], bool],
                 check: Callable[[], int | None] | None = None, check_first: bool = False) -> None:
        self.fetch, self.start, self.end = fetch, start, end
        self.size, self.max_size = sizes  # the next range's size, and the largest
        self.is_past_end = is_past_end
        self.check = check
        self.check_first = check_first
        self.checked = check is None  # whether a check has run (the first one fixes the size)
        self.cond = threading.Condition()
        self.stop = False
        self.pos = start    # next byte the reader gets
        self.peak = 0       # the most bytes requested and not yet handed to the reader

    def _bounds(self, lo: int) -> int:
        return lo + self.size if self.end is None else min(lo + self.size, self.end)

    def _grow(self) -> None:
        """Called once a range is requested: the next one is twice as large, up to the cap."""
        self.size = min(2 * self.size, self.max_size)

    def _check(self, lo: int) -> None:
        """The version check before the range at ``lo`` (none before the body's first one
        unless ``check_first``: a stream resumed mid-object checks at once). A check that
        reports the object's size ends the body there: no range reaches past the object, and a
        range that comes back short of it was cut off."""
        if self.check is not None and (lo > self.start or self.check_first):
            self.checked = True
            size = self.check()
            if size is not None and (self.end is None or size < self.end):
                self.end = size

    def _send(self, lo: int) -> tuple[Iterable[bytes], int]:
        """The request of the range at ``lo`` (nothing when ``lo`` is at the known end)."""
        if self.end is not None and lo >= self.end:
            return iter(()), lo
        hi = self._bounds(lo)
        with self.cond:
            self.peak = max(self.peak, hi - self.pos)
        self._grow()
        return iter(self.fetch(lo, hi)), hi

    def _checked_send(self, lo: int) -> tuple[Iterable[bytes], int]:
        """Send the range at ``lo`` and run its version check.

        The body's first check runs before the request: the size it reports bounds the range.
        Every later check runs just after the request is sent, so the request does not wait a
        round trip for the HEAD (on a busy server, behind other requests). That checks no less:
        the range's bytes reach the reader only after those of the range before it, during
        which this runs, so an object changed before the check fails the read before any byte
        of this range is handed over, as when the check came first.
        """
        if not self.checked:
            self._check(lo)
            return self._send(lo)
        sent = self._send(lo)
        self._check(lo)
        return sent

    def request(self, lo: int, after: int) -> tuple[Iterable[bytes], int]:
        """Request the range at ``lo`` once the reader has reached ``after``, the start of the
        range before it (never more than two ranges ahead of the reader)."""
        first = not self.checked
        if first:
            self._check(lo)  # the first check bounds the range: run it while the reader gets there
        with self.cond:
            self.cond.wait_for(lambda: self.stop or self.pos >= after)
            if self.stop:
                raise _Stopped
        return self._send(lo) if first else self._checked_send(lo)

    def try_request(self, lo: int, after: int) -> tuple[Iterable[bytes], int] | None:
        """Start the request of the range at ``lo`` now if the reader has reached ``after``."""
        with self.cond:
            if self.stop or self.pos < after:
                return None
        return self._checked_send(lo)

    def _ended(self, lo: int, hi: int, got: int) -> bool:
        """Whether the range ``[lo, hi)`` that delivered ``got`` bytes was the last one: it
        reached the known end, or (the size unknown) came back short. Short of a known end,
        the response was cut off: a transient error, so the caller resumes at the byte reached.
        """
        if self.end is not None and got < hi - lo:
            raise http.client.IncompleteRead(b"", hi - lo - got)
        return got < hi - lo or (self.end is not None and hi >= self.end)

    def run(self, pump: Pump) -> None:
        """The pump's producer: every range's chunks, in order, until the end or a stop."""
        try:
            self._run(pump)
        except _Stopped:
            return
        except BaseException as exc:  # handed to the reader by the pump, raised there
            if not self.is_past_end(exc):  # a range starting at (or past) the end: nothing more
                raise

    def _run(self, pump: Pump) -> None:
        lo = self.start
        chunks: Iterable[bytes] | None = None
        ahead: tuple[Iterable[bytes], int] | None = None
        try:
            chunks, hi = self.request(lo, lo)
            while True:
                got = 0
                # From the second range on, the next range's request starts while this one
                # is still arriving (as soon as the reader has reached this range's start),
                # so the two overlap and no request waits for the previous one's last byte.
                # Not in the first range: an object shorter than a range must cost one GET.
                overlap = lo > self.start and (self.end is None or hi < self.end)
                for chunk in chunks:
                    if self.stop or not pump.put(bytes(chunk)):
                        return
                    got += len(chunk)
                    if overlap and ahead is None:
                        ahead = self.try_request(hi, lo)
                if self._ended(lo, hi, got):
                    break  # (a request started past the last range is dropped)
                lo, before = hi, lo
                if ahead is not None:
                    (chunks, hi), ahead = ahead, None
                else:
                    chunks, hi = self.request(lo, before)
            if lo > self.start or self.check_first:
                self._check(lo)  # the last range came from the version checked before it
        finally:
            # drop the requests now (the client cancels them), not when the thread is freed
            del chunks, ahead


class RangedBody(io.RawIOBase):
    """A raw, non-seekable stream of bytes ``[start, end)`` of one object.

    Args:
        fetch: ``fetch(lo, hi)`` starts a ranged request of bytes ``[lo, hi)`` and returns an
            iterable of its body chunks (the request may fail lazily, on the first chunk).
        start: first byte.
        end: one past the last byte, or None for the end of the object.
        range_size: bytes of the first request; each next one doubles, up to ``max_range_size``.
        max_range_size: the largest request (None: ``range_size``, every range the same);
            the stream never holds more than twice this.
        read_timeout: seconds to wait for the next chunk (None: forever).
        is_past_end: whether a failed request means "this range starts at the end".
        on_request_error: maps the failure of a request that delivered nothing of the body
            (the first range) to the error to raise; later failures are raised unchanged for
            the caller to resume.
        check: called (on the request thread) for each range after the first, before any of
            its bytes is handed over, and once after the last one of a body of several; raises
            when the object has changed, and returns the object's size (or None when unknown),
            which bounds the later ranges.
        check_first: run ``check`` before the first range too (a body resuming a read).
    """

    def __init__(self, fetch: Callable[[int, int], Iterable[bytes]], *, start: int, end: int | None,
                 range_size: int, max_range_size: int | None = None, read_timeout: float | None,
                 is_past_end: Callable[[BaseException], bool],
                 on_request_error: Callable[[BaseException], BaseException] | None = None,
                 check: Callable[[], int | None] | None = None, check_first: bool = False) -> None:
        super().__init__()
        self._timeout = read_timeout
        self._on_request_error = on_request_error
        sizes = (range_size, max(range_size, max_range_size or range_size))
        self._requests = _Requests(fetch, start, end, sizes, is_past_end, check, check_first)
        self._buf = memoryview(b"")
        self._done = False
        self._arrived = False  # a chunk of the body has reached the reader
        self._pump = Pump(self._requests.run, name="pipeflow-ranged-read").start()

    @property
    def peak_buffered(self) -> int:
        """The most bytes requested from the server and not yet handed to the reader."""
        return self._requests.peak

    # ---- the reader's side ------------------------------------------------------------------
    def _next_chunk(self) -> bytes:
        if self._done:
            return b""
        pump = self._pump
        try:
            chunk: bytes = pump.get(timeout=self._timeout)
        except queue.Empty:
            raise TimeoutError(f"no bytes for {self._timeout:g} s at byte {self._requests.pos}") from None
        except StopIteration:
            self._done = True
            return b""
        except BaseException as exc:
            if not pump.ended:  # raised here, in the reader's thread (an interrupt)
                raise
            self._done = True
            if not self._arrived and self._on_request_error is not None:
                err = self._on_request_error(exc)  # the request failed before any of its body
                if err is not exc:
                    raise err from exc
            raise
        self._arrived = True
        return chunk

    def wait_first(self) -> None:
        """Block until the first chunk (or the end, or the request's failure) has arrived."""
        if not self._buf and not self._done:
            self._buf = memoryview(self._next_chunk())

    def readable(self) -> bool:
        return True

    def _advance(self, n: int) -> None:
        requests = self._requests
        with requests.cond:
            requests.pos += n
            requests.cond.notify_all()

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
        parts: list[bytes] = []
        while True:
            chunk = self.read(1 << 30)
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)

    def close(self) -> None:
        requests, pump = getattr(self, "_requests", None), getattr(self, "_pump", None)
        if not self.closed and requests is not None and pump is not None:
            with requests.cond:
                requests.stop = True
                requests.cond.notify_all()
            pump.stop()  # drops the chunks queued and not read
            self._buf = memoryview(b"")
            # a pump blocked on a stalled connection ends when that connection delivers or
            # closes; it holds no more than its range, and drops it on waking
        super().close()


class _Stopped(Exception):
    pass
