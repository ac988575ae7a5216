"""Measurement, kept out of the stage contract: how long stages and their workers take.

Two meters, one per thing measured, both hooks that the measured code calls and that decide
alone what to time:

* :class:`StageMeter`, one per stage, times the stage's ``next()`` calls. Timing every call
  would cost more than a cheap stage's work, so it times two calls in a row about every
  :data:`SAMPLE_EVERY` (the second one also measures the gap since the first returned: the
  time the output waited on its consumer) and scales the sums by the items delivered. The
  stage's ``__next__`` holds only a countdown, ``stage._left``, that the meter sets: 0, the
  stage counts its own items and no sample is due (the stage calls :meth:`StageMeter.sample_soon`
  when it reaches one); n > 1, count this call and do not time it; 1, hand the call to
  :meth:`StageMeter.call`. That countdown is the whole per-item cost of measuring.
* :class:`TaskMeter`, one per in-flight window, times the window's function on the workers:
  every process task (from submission to result), one thread task in about
  :data:`TIME_EVERY`.

:meth:`StageMeter.measure` turns the sums into the numbers ``stats()`` shows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from random import getrandbits
from time import perf_counter
from typing import Any

__all__ = ["SAMPLE_EVERY", "SAMPLE_SPAN_S", "TIME_ALL_FIRST", "TIME_EVERY", "StageMeter", "TaskMeter",
           "sample_interval"]

#: two calls in about this many (a power of two; at least) are timed, in a row, the second one
#: also measuring the gap since the first returned (the time the output waited on the consumer)
SAMPLE_EVERY = 256
#: the first calls of a stage (and the first tasks of a window) are all timed: a short run gets
#: exact figures, and one call slowed by the machine (another process got the core) is not
#: multiplied by the sampling ratio
TIME_ALL_FIRST = 64
#: a stage's calls between two samples take about this long at least: cheaper calls are
#: sampled less often (down to one pair in 32 * SAMPLE_EVERY), so that timing them stays well
#: under 1% of their cost
SAMPLE_SPAN_S = 2e-3
#: thread workers time one task in about this many (a power of two), jittered: timing costs
#: a lock and a frame per task, a visible share of a thread hand-off
TIME_EVERY = 16
_MIN_BITS = SAMPLE_EVERY.bit_length() - 1
_MAX_BITS = _MIN_BITS + 5
_TIME_BITS = TIME_EVERY.bit_length() - 1


def sample_interval(meter: StageMeter) -> int:
    """Calls until the next sample: jittered (from half to one and a half times the mean), so
    a stage with a period of its own (a batch every 8 calls) is not always sampled in the same
    phase; the mean is :data:`SAMPLE_EVERY`, or more for cheap calls (:data:`SAMPLE_SPAN_S`)."""
    bits = _MIN_BITS
    if meter.timed:
        span = meter.timed_s * SAMPLE_EVERY / meter.timed  # seconds of SAMPLE_EVERY calls
        while span < SAMPLE_SPAN_S and bits < _MAX_BITS:
            span *= 2
            bits += 1
    return (1 << (bits - 1)) + getrandbits(bits)


class StageMeter:
    """One stage's measurements: two calls in about :data:`SAMPLE_EVERY` timed, and every call
    counted unless the stage counts its items itself (``own``: its ``delivered()`` is not None).

    The methods take the stage they measure; the stage holds its meter as ``_meter`` and the
    meter's countdown as ``_left`` (see the module docstring).
    """

    # one attribute on the stage, not eleven: many instance attributes make every attribute
    # load of a stage slower (the instance dict stops sharing its keys)
    __slots__ = ("gap_s", "gaps", "issued", "lost", "once_s", "own", "returned", "second",
                 "slow_calls", "timed", "timed_s")

    def __init__(self) -> None:
        self.second = self.own = False
        self.slow_calls = self.issued = self.lost = self.timed = self.gaps = 0
        self.timed_s = self.gap_s = self.returned = 0.0
        self.once_s = 0.0  # setup and end-of-run calls, counted unscaled

    # ---- hooks the stage calls ------------------------------------------------------------
    def call(self, stage: Any) -> Any:
        """A call of ``stage.next()`` the countdown handed over: timed, restarting the stage
        first when a reset is due, and setting the countdown for the calls after it."""
        t0 = perf_counter()
        second = self.second
        if second and self.returned:
            self.gap_s += t0 - self.returned
            self.gaps += 1
        self.returned = 0.0
        self.slow_calls += 1
        # the next call is timed too (measuring the gap), then about SAMPLE_EVERY - 2 are not
        self.second = not second
        if not second or self.slow_calls < TIME_ALL_FIRST:
            left = 1
        elif self.own:
            left = 0  # until the stage asks for the next sample
        else:
            left = sample_interval(self)
            self.issued += left - 1
        stage._left = left
        try:
            if stage._needs_reset:
                t_reset = perf_counter()
                stage._restart_lazily()
                self.timed_s -= perf_counter() - t_reset  # counted as setup by setup()
            value = stage.next()
        except BaseException:
            self.lost += 1
            self.once_s += perf_counter() - t0
            raise
        t1 = perf_counter()
        self.timed_s += t1 - t0
        self.timed += 1
        if not second:
            self.returned = t1
        return value

    def setup(self, run: Callable[[Any], None], state: Any) -> None:
        """``run(state)`` (a stage's reset), its time counted unscaled."""
        t0 = perf_counter()
        try:
            run(state)
        finally:
            self.once_s += perf_counter() - t0

    def started(self, stage: Any) -> None:
        """A run of ``stage`` began: whether it counts its own items is known now."""
        self.own = stage.delivered() is not None

    def sample_soon(self, stage: Any) -> int:
        """Time ``stage``'s next call and the one after it (for a stage that counts its own
        items); returns in how many items to call again (:func:`sample_interval`)."""
        if not stage._left:
            stage._left = 1
        return sample_interval(self)

    def reset_due(self, stage: Any) -> None:
        """Route ``stage``'s next call through :meth:`call`, which resets it; unused cheap calls
        are taken back so they are not counted as items."""
        left = getattr(stage, "_left", 1)
        if left > 1:
            self.issued -= left - 1
        stage._left = 1

    # ---- what it measured -----------------------------------------------------------------
    def items(self, stage: Any) -> int:
        """Items ``stage.next()`` delivered so far (over every run of the stage object)."""
        own = stage.delivered()
        if own is not None:
            return int(own)
        return self.slow_calls + self.issued - max(0, stage._left - 1) - self.lost

    def inclusive_s(self, stage: Any) -> float:
        """Estimated seconds spent in ``stage.next()`` and setup, its sources' included (when
        they run on the same thread)."""
        sampled = self.timed_s * self.items(stage) / self.timed if self.timed else 0.0
        return max(0.0, sampled) + self.once_s

    def measure(self, stage: Any) -> dict[str, float]:
        """``stage``'s numbers: ``items`` delivered, ``busy_s`` in its own work, ``wait_s``
        waiting on its input, ``blocked_s`` its output waited on the consumer, ``lanes`` (how
        many threads do its work)."""
        inclusive = self.inclusive_s(stage)
        if stage.pulls_in_background:
            busy, wait = 0.0, inclusive
        else:
            wait = sum(src._meter.inclusive_s(src) for src in stage.sources)
            busy = max(0.0, inclusive - wait)
        items = self.items(stage)
        blocked = self.gap_s * items / self.gaps if self.gaps else 0.0
        return {"items": items, "busy_s": busy, "wait_s": wait, "blocked_s": blocked, "lanes": 1}


class TaskMeter:
    """The workers' time in a window's function: process tasks every one (from submission to
    result), thread tasks a jittered one in about :data:`TIME_EVERY`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process_s = 0.0
        self._sampled_s = 0.0
        self._sampled = self._submitted = self._sample_at = 0

    @property
    def busy_s(self) -> float:
        """Seconds the workers spent in the function, summed over workers (process workers:
        from submission to result, so queueing is included; thread workers: estimated from a
        sample of the tasks)."""
        sampled = self._sampled_s * self._submitted / self._sampled if self._sampled else 0.0
        return self._process_s + sampled

    def thread_task(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """What to submit to a thread worker for one item: ``fn``, or ``fn`` timed."""
        self._submitted += 1
        if self._submitted <= self._sample_at:
            return fn
        if self._submitted >= TIME_ALL_FIRST:
            self._sample_at = self._submitted + TIME_EVERY // 2 + getrandbits(_TIME_BITS)
        return lambda item: self._timed(fn, item)

    def _timed(self, fn: Callable[[Any], Any], item: Any) -> Any:
        t0 = perf_counter()
        try:
            return fn(item)
        finally:
            seconds = perf_counter() - t0
            with self._lock:
                self._sampled_s += seconds
                self._sampled += 1

    def process_task(self) -> Callable[[Future[Any]], None]:
        """A done-callback for a process task submitted now: adds its time when it ends."""
        t0 = perf_counter()
        return lambda _future: self._add(perf_counter() - t0)

    def _add(self, seconds: float) -> None:
        with self._lock:
            self._process_s += seconds
