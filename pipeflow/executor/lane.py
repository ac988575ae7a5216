"""A thread window's hand-off: one queue, one lock and long-lived runners instead of a
``concurrent.futures`` task per item.

Submitting an item to a ``ThreadPoolExecutor`` costs a :class:`~concurrent.futures.Future`
(a condition with its own lock), a work item, a queue put, and often a wake-up of an idle
thread; delivering it costs a notify of the future's condition and, when the consumer waits
on it, a second wake-up. For a ~1 ms JPEG decode that is several percent of the work. A
:class:`Lane` keeps the pool's threads pulling from one deque for as long as there is work
(a put is an append while they are busy), records each result in the item's :class:`Slot`
under the lane's one lock, and wakes the consumer only when it waits, and, when it waits for
an item whose successor is already running, only once both are done: one wake-up per two
items where two calls run at once.

Items start in the order they were put; results are read in the window's order, each with its
own value or exception. Cancelling drops the items not started; the ones running finish and
their slots' callbacks run (a window's ``on_discard``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from typing import Any

__all__ = ["Lane", "Slot"]

_QUEUED, _RUNNING, _DONE, _CANCELLED = range(4)


class Slot(Future[Any]):
    """One item's outcome in a :class:`Lane`: what a window reads of a future (``done``,
    ``result``, ``exception``, ``cancel``, ``add_done_callback``) without a condition of its
    own; the lane's lock guards it. Not for ``concurrent.futures.wait`` (unordered windows keep
    real futures)."""

    def __init__(self, lane: Lane, call: Callable[[Any], Any], item: Any) -> None:  # no Condition
        self._lane, self._item = lane, item
        self._call: Callable[[Any], Any] | None = call
        self._phase = _QUEUED
        self._value: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Future[Any]], object]] = []

    def __repr__(self) -> str:
        return f"<Slot state={('queued', 'running', 'done', 'cancelled')[self._phase]}>"

    def done(self) -> bool:
        return self._phase >= _DONE

    def running(self) -> bool:
        return self._phase == _RUNNING

    def cancelled(self) -> bool:
        return self._phase == _CANCELLED

    def cancel(self) -> bool:
        return self._lane.cancel_one(self)

    def result(self, timeout: float | None = None) -> Any:
        if self._phase < _DONE:
            self._lane.wait(self, None)
        if self._phase == _CANCELLED:
            raise CancelledError()
        if self._error is not None:
            raise self._error
        return self._value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._phase < _DONE:
            self._lane.wait(self, None)
        if self._phase == _CANCELLED:
            raise CancelledError()
        return self._error

    def add_done_callback(self, fn: Callable[[Future[Any]], object]) -> None:
        with self._lane.lock:
            if self._phase < _DONE:
                self._callbacks.append(fn)
                return
        fn(self)


class Lane:
    """Runs ``Slot`` items on up to ``allowed()`` of ``submit``'s threads at once.

    Args:
        submit: starts a runner on the pool (``WorkerPool.submit``).
        allowed: how many runners may run now (the tuner's value, or the pool's size); read
            at every put and between items, so a lowered value retires runners as they finish
            an item.
        pair: wake a consumer waiting for an item only once its running successor is done too.
    """

    def __init__(self, submit: Callable[..., Any], allowed: Callable[[], int], *, pair: bool) -> None:
        self.lock = threading.Lock()
        self._ready = threading.Condition(self.lock)
        self._submit, self._allowed, self._pair = submit, allowed, pair
        self._work: deque[Slot] = deque()
        self._runners = 0
        #: what the consumer waits for: an item, and the successor it also waits for if running
        self._want: Slot | None = None
        self._then: Slot | None = None
        self._waiters = 0  # more than one (a result read from another thread): wake on every item

    def put(self, call: Callable[[Any], Any], item: Any) -> Slot:
        """Queue ``call(item)``; a runner starts if fewer than allowed run."""
        slot = Slot(self, call, item)
        with self.lock:
            self._work.append(slot)
            start = self._runners < self._allowed()
            if start:
                self._runners += 1
        if start:
            try:
                self._submit(self._run)
            except BaseException:  # the pool is shut down: the item never ran
                with self.lock:
                    self._runners -= 1
                    if slot in self._work:
                        self._work.remove(slot)
                raise
        return slot

    def wait(self, slot: Slot, then: Slot | None) -> None:
        """Block until ``slot`` is done (and ``then`` too, if it was running then and pairing
        is on); interruptible (Ctrl-C)."""
        with self.lock:
            self._want, self._then = slot, then if self._pair else None
            self._waiters += 1
            try:
                while slot._phase < _DONE:
                    self._ready.wait()
            finally:
                self._waiters -= 1
                self._want = self._then = None

    def cancel_one(self, slot: Slot) -> bool:
        """Drop ``slot`` if it has not started (True), as ``Future.cancel`` does."""
        with self.lock:
            if slot._phase == _CANCELLED:
                return True
            if slot._phase != _QUEUED:
                return False
            self._work.remove(slot)
            slot._phase = _CANCELLED
            callbacks, slot._callbacks = slot._callbacks, []
        for fn in callbacks:
            fn(slot)
        return True

    def _run(self) -> None:
        """A runner: takes items while there are any and it is allowed to run."""
        lock = self.lock
        while True:
            with lock:
                if not self._work or self._runners > self._allowed():
                    self._runners -= 1
                    return
                slot = self._work.popleft()
                slot._phase = _RUNNING
                call = slot._call
            assert call is not None  # a slot is taken once
            try:
                slot._value = call(slot._item)
            except BaseException as exc:  # delivered through the slot, as a pool's future does
                slot._error = exc
            self._finish(slot)

    def _finish(self, slot: Slot) -> None:
        with self.lock:
            slot._phase = _DONE
            slot._call = slot._item = None  # the item is released with the call
            callbacks, slot._callbacks = slot._callbacks, []
            if self._waiters and self._wakes():
                self._ready.notify_all()
        for fn in callbacks:
            fn(slot)

    def _wakes(self) -> bool:
        """Whether an item just done wakes the waiting consumer (the lock held)."""
        want, then = self._want, self._then
        if want is None or self._waiters > 1:
            return True
        return want._phase >= _DONE and (then is None or then._phase != _RUNNING)
