"""One background producer handing items to one consumer: the pump behind ``prefetch``, the
ranged-request reader of the CRT backend and obstore's read-ahead.

A :class:`Pump` runs ``produce(pump)`` on a daemon thread. ``pump.put`` queues an item (waiting
while a bounded queue is full) and returns False once the pump is stopped, so a producer never
blocks past :meth:`Pump.stop`. When ``produce`` returns, the consumer gets the end; when it raises, the
consumer gets that exception, raised in its own thread with its original type and traceback
(carried by :class:`Failure`). Both are final: every later :meth:`Pump.get` sees them again.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Failure", "Pump"]

#: seconds between two looks at the stop flag while a put or a get waits
POLL = 0.05

_END = object()


class Failure:
    """The exception that ended a producer, on its way to the consumer."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Pump:
    """``produce(pump)`` on a thread of its own, its items queued for one consumer.

    Args:
        produce: pulls items and hands each to ``pump.put``; returns at the end (or as soon
            as ``put`` returns False: stopped). An exception it raises reaches the consumer.
        maxsize: queue bound (0: unbounded, when the producer bounds itself).
        name: the thread's name.
    """

    def __init__(self, produce: Callable[[Pump], None], *, maxsize: int = 0,
                 name: str = "pipeflow-pump") -> None:
        self.queue: queue.Queue[Any] = queue.Queue(maxsize)
        self.stopped = threading.Event()
        self._produce = produce
        self._final: Any = None  # the end or the Failure, once the consumer got it
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Pump:
        self._thread.start()
        return self

    # ---- the producer's side --------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._produce(self)
        except BaseException as exc:  # handed to the consumer, never lost
            self.put(Failure(exc))
        else:
            self.put(_END)
        finally:
            self._produce = _finished  # drops what the producer's closure holds (a response)

    def put(self, item: Any) -> bool:
        """Queue ``item`` (waiting for room); False, and nothing queued, once stopped."""
        stopped, out = self.stopped, self.queue
        while not stopped.is_set():
            try:
                out.put(item, timeout=POLL)
                return True
            except queue.Full:
                continue
        return False

    def full(self) -> bool:
        """True when a bounded queue has no room (the consumer is behind)."""
        return self.queue.full()

    # ---- the consumer's side --------------------------------------------------------------
    def get(self, timeout: float | None = None) -> Any:
        """The next item, waiting at most ``timeout`` seconds (None: as long as the thread lives).

        Raises:
            StopIteration: the producer has ended (and on every later call).
            BaseException: what the producer raised (and on every later call).
            queue.Empty: nothing within ``timeout``.
            RuntimeError: the thread is gone without saying why (stopped while waiting).
        """
        item = self._final
        if item is None:
            item = self._take(timeout)
        if item is _END:
            self._final = item
            raise StopIteration
        if isinstance(item, Failure):
            self._final = item
            raise item.exc
        return item

    def _take(self, timeout: float | None) -> Any:
        if timeout is not None:
            return self.queue.get(timeout=timeout)
        while True:
            try:
                return self.queue.get(timeout=POLL)
            except queue.Empty:
                if not self._thread.is_alive() and self.queue.empty():
                    raise RuntimeError(f"{self._thread.name}: the background thread stopped "
                                       "unexpectedly") from None

    def resize(self, maxsize: int) -> None:
        """A new bound for the queue, taking effect at once (a waiting put sees the room)."""
        out = self.queue
        with out.mutex:
            out.maxsize = maxsize
            out.not_full.notify_all()

    def stop(self, join: float = 0.0) -> bool:
        """Stop the producer and drop what it queued; wait up to ``join`` seconds for the
        thread to end (it ends when its current pull returns). True when it has ended."""
        self.stopped.set()
        thread = self._thread
        deadline = time.monotonic() + join
        while True:
            self._drain()  # a put blocked on a full queue returns at once
            if not thread.is_alive() or thread is threading.current_thread():
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            thread.join(min(POLL, remaining))
        self._drain()
        return not thread.is_alive()

    def _drain(self) -> None:
        try:
            while True:
                self.queue.get_nowait()
        except queue.Empty:
            pass

    @property
    def ended(self) -> bool:
        """True once :meth:`get` has delivered the end or the producer's exception."""
        return self._final is not None

    @property
    def alive(self) -> bool:
        """True while the producer's thread runs."""
        return self._thread.is_alive()


def _finished(pump: Pump) -> None:
    """What a pump's producer is once it has run (holds nothing)."""
