"""Measurement, kept out of the stage contract: how long stages and their workers take.

Two meters, one per thing measured, both hooks that the measured code calls and that decide
alone what to time:

* :class:`StageMeter`, one per stage, times a jittered sample of the stage's ``next()`` calls,
  about one in :data:`SAMPLE_EVERY`, and scales the sums by the items delivered. A timed call
  measures the stage's *exclusive* time: while it runs, every call of its sources is timed too
  (they are *forced*), and the time spent inside them is subtracted, so a shuffle filling its
  buffer or a batch collecting items is not charged for the work of the stages it pulls from.
  The stage's ``__next__`` holds only a countdown, ``stage._left``, that the meter sets: 0, the
  stage counts its own items and no sample is due (the stage calls :meth:`StageMeter.sample_soon`
  when it reaches one); n > 1, count this call and do not time it; 1, hand the call to
  :meth:`StageMeter.call`. That countdown is the whole per-item cost of measuring.
* :class:`TaskMeter`, one per in-flight window, times the window's function on the workers:
  every process task (from submission to result), one thread task in about
  :data:`TIME_EVERY`.

:meth:`StageMeter.measure` turns the sums into the numbers ``stats()`` shows. The time a
stage's output waited on its consumer is not sampled call by call (a consumer that works once
per batch of 32 items would be caught in one sample in 32): it is the stage's active wall time
(first call to close) minus the time spent inside its ``next()``, both of which are known well.
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

#: one call in about this many (a power of two; at least) is timed
SAMPLE_EVERY = 128
#: the first calls of a stage (and the first tasks of a window) are all timed: a short run gets
#: exact figures, and one call slowed by the machine (another process got the core) is not
#: multiplied by the sampling ratio
TIME_ALL_FIRST = 64
#: a stage's calls between two samples take about this long at least: cheaper calls are
#: sampled less often (down to one in 64 * SAMPLE_EVERY), so that timing them stays well
#: under 1% of their cost
SAMPLE_SPAN_S = 4e-3
#: thread workers time one task in about this many (a power of two), jittered: timing costs
#: a lock and a frame per task, a visible share of a thread hand-off
TIME_EVERY = 16
_MIN_BITS = SAMPLE_EVERY.bit_length() - 1
_MAX_BITS = _MIN_BITS + 6
_TIME_BITS = TIME_EVERY.bit_length() - 1
#: a sample counts at most this much towards the sampling rate: one call that lost the core
#: to another process does not make a cheap stage look costly (and sampled often)
_SPAN_CAP = SAMPLE_SPAN_S / SAMPLE_EVERY
#: later samples needed before their mean replaces the mean of all (one or two samples of a
#: call that varies, such as a map waiting on its workers, say little)
_MIN_LATER = 8


def sample_interval(meter: StageMeter) -> int:
    """Calls until the next sample: jittered (from half to one and a half times the mean), so
    a stage with a period of its own (a batch every 8 calls) is not always sampled in the same
    phase; the mean is :data:`SAMPLE_EVERY`, or more for cheap calls (:data:`SAMPLE_SPAN_S`)."""
    bits = _MIN_BITS
    if meter.timed:
        # seconds of SAMPLE_EVERY calls of the stage's own work: a cheap stage downstream of
        # costly ones is sampled rarely too (each of its samples times its sources' calls)
        span = meter.span_s * SAMPLE_EVERY / meter.timed
        while span < SAMPLE_SPAN_S and bits < _MAX_BITS:
            span *= 2
            bits += 1
    return (1 << (bits - 1)) + getrandbits(bits)


class _Clock(threading.local):
    """Per thread: seconds spent so far in timed calls of sources during the current timed
    call (or setup) of their consumer, which subtracts them from its own time."""

    inner = 0.0


_clock = _Clock()


class StageMeter:
    """One stage's measurements: about one call in :data:`SAMPLE_EVERY` timed (its exclusive
    time), and every call counted unless the stage counts its items itself (``own``: its
    ``delivered()`` is not None).

    The methods take the stage they measure; the stage holds its meter as ``_meter`` and the
    meter's countdown as ``_left`` (see the module docstring).
    """

    # one attribute on the stage, not a dozen: many instance attributes make every attribute
    # load of a stage slower (the instance dict stops sharing its keys)
    __slots__ = ("active_s", "began", "forced", "forced_left", "issued", "lost",
                 "once_s", "span_s", "early", "early_s", "own", "slow_calls", "timed", "timed_s")

    def __init__(self) -> None:
        self.own = False
        self.slow_calls = self.issued = self.lost = self.timed = self.forced = 0
        self.timed_s = 0.0  # timed calls: their own time, the sources' excluded
        self.span_s = 0.0  # the same, each capped at _SPAN_CAP (for the sampling rate)
        #: the calls of the first TIME_ALL_FIRST, all timed: counted exactly, not scaled (they
        #: are no random sample: a shuffle's first call fills its buffer, a pool starts)
        self.early = 0
        self.early_s = 0.0
        self.once_s = 0.0  # setup and end-of-run calls, counted unscaled
        self.began = self.active_s = 0.0  # the current run's first call; ended runs' wall time
        #: the countdown the stage had when its consumer began a timed call; -1: not forced
        self.forced_left = -1

    # ---- hooks the stage calls ------------------------------------------------------------
    def call(self, stage: Any) -> Any:
        """A call of ``stage.next()`` the countdown handed over, or made while its consumer's
        call is timed (forced): restarting the stage first when a reset is due, then a sample
        (:meth:`_sample`) when one is due, else, forced, timed whole for the consumer."""
        # the clock starts here, not around next() only: the bookkeeping of a forced call
        # belongs to it, not to the consumer that subtracts it
        t0 = perf_counter()
        clock = _clock
        outer = clock.inner
        clock.inner = 0.0
        if not self.began:
            self.began = t0
        if stage._needs_reset:
            stage._restart_lazily()  # timed as setup by setup(), which adds it to clock.inner
        forced_left = self.forced_left
        if forced_left < 0:
            stage._left = self._count()
        elif forced_left == 1:  # forced, and the stage's own sample is due: this call is it
            self.forced_left = self._count()
        else:
            return self._forced(stage, t0, clock, outer)
        return self._sample(stage, t0, clock, outer)

    def _count(self) -> int:
        """Count this call; returns the countdown for the calls after it."""
        self.slow_calls += 1
        if self.slow_calls < TIME_ALL_FIRST:
            return 1
        if self.own:
            return 0  # until the stage asks for the next sample
        left = sample_interval(self)
        self.issued += left - 1
        return left

    def _sample(self, stage: Any, t0: float, clock: _Clock, outer: float) -> Any:
        """A timed call: its exclusive time (the sources are forced meanwhile)."""
        forced = _force(stage)
        try:
            value = stage.next()
        except BaseException:
            self.lost += 1
            self._add_once(perf_counter() - t0, clock, outer)
            raise
        finally:
            if forced:
                _release(forced)
        elapsed = perf_counter() - t0
        own = elapsed - clock.inner
        self.timed_s += own
        self.span_s += own if own < _SPAN_CAP else _SPAN_CAP
        clock.inner = outer + elapsed
        self.timed += 1
        if self.slow_calls < TIME_ALL_FIRST:
            self.early += 1
            self.early_s += own
        return value

    def _forced(self, stage: Any, t0: float, clock: _Clock, outer: float) -> Any:
        """A call made while the consumer's call is timed, not a sample of this stage: timed
        whole (its sources' calls included) for the consumer to subtract."""
        try:
            value = stage.next()
        finally:
            clock.inner = outer + (perf_counter() - t0)
        self.forced += 1
        if self.forced_left > 1:  # its own countdown runs on: its next sample comes in time
            self.forced_left -= 1
            self.issued -= 1  # this call was counted as ``forced``
        return value

    def _add_once(self, elapsed: float, clock: _Clock, outer: float) -> None:
        self.once_s += elapsed - clock.inner
        clock.inner = outer + elapsed

    def setup(self, run: Callable[[Any], None], state: Any) -> None:
        """``run(state)`` (a stage's reset), its time counted unscaled, its sources' resets
        excluded (they count their own)."""
        clock = _clock
        outer = clock.inner
        clock.inner = 0.0
        t0 = perf_counter()
        try:
            run(state)
        finally:
            self._add_once(perf_counter() - t0, clock, outer)

    def started(self, stage: Any) -> None:
        """A run of ``stage`` began: whether it counts its own items is known now."""
        self.own = stage.delivered() is not None

    def sample_soon(self, stage: Any) -> int:
        """Time ``stage``'s next call (for a stage that counts its own items); returns in how
        many items to call again (:func:`sample_interval`)."""
        if self.forced_left == 0:  # its consumer's call is timed: after it
            self.forced_left = 1
        elif not stage._left:
            stage._left = 1
        return sample_interval(self)

    def reset_due(self, stage: Any) -> None:
        """Route ``stage``'s next call through :meth:`call`, which resets it; unused cheap calls
        are taken back so they are not counted as items. The run's wall time ends here."""
        left = getattr(stage, "_left", 1) if self.forced_left < 0 else self.forced_left
        if left > 1:
            self.issued -= left - 1
        if self.forced_left >= 0:
            self.forced_left = 1
        stage._left = 1
        if self.began:
            self.active_s += perf_counter() - self.began
            self.began = 0.0

    # ---- what it measured -----------------------------------------------------------------
    def items(self, stage: Any) -> int:
        """Items ``stage.next()`` delivered so far (over every run of the stage object)."""
        own = stage.delivered()
        if own is not None:
            return int(own)
        left = stage._left if self.forced_left < 0 else self.forced_left
        return self.slow_calls + self.issued + self.forced - max(0, left - 1) - self.lost

    def active(self) -> float:
        """Wall seconds from the first call of each run of the stage to its close (or now)."""
        return self.active_s + (perf_counter() - self.began if self.began else 0.0)

    def own_s(self, stage: Any) -> float:
        """Estimated seconds of ``stage``'s own calls and setup, its sources' time excluded:
        the first calls exactly, the mean of the later samples for the later calls."""
        if not self.timed:
            return self.once_s
        later = self.timed - self.early
        if later >= _MIN_LATER:
            mean = (self.timed_s - self.early_s) / later
        else:
            mean = self.timed_s / self.timed
        rest = max(0, self.items(stage) - self.early)
        return self.early_s + mean * rest + self.once_s

    def inclusive_s(self, stage: Any) -> float:
        """Estimated seconds spent inside ``stage.next()`` and setup on the consumer's thread:
        its own time plus its sources' (unless they run on a thread of their own)."""
        own = self.own_s(stage)
        if stage.pulls_in_background:
            return own
        return own + sum(src._meter.inclusive_s(src) for src in stage.sources)

    def measure(self, stage: Any) -> dict[str, float]:
        """``stage``'s numbers: ``items`` delivered, ``busy_s`` in its own work (never more
        than its wall time), ``wait_s`` waiting on its input (its sources' time, or for a
        stage that pulls them in the background the time it waited for them), ``blocked_s``
        its output waited on the consumer, ``lanes`` (how many threads do its work)."""
        own = self.own_s(stage)
        active = self.active()
        if stage.pulls_in_background:
            busy, wait = 0.0, own
        else:
            busy = min(own, active)
            # estimates of variable calls may overshoot: never more than the wall time left
            wait = min(sum(src._meter.inclusive_s(src) for src in stage.sources), active - busy)
        blocked = max(0.0, active - own - wait)
        return {"items": self.items(stage), "busy_s": busy, "wait_s": wait, "blocked_s": blocked,
                "lanes": 1}


def _force(stage: Any) -> list[Any]:
    """Time every call of ``stage``'s sources until :func:`_release` (not for a stage that
    pulls them on a thread of its own: their calls run there, on another clock)."""
    if stage.pulls_in_background:
        return []
    forced = []
    for src in stage.sources:
        meter = getattr(src, "_meter", None)  # None: a stage that skipped Stage.__init__
        if meter is not None and meter.forced_left < 0:
            meter.forced_left = src._left
            src._left = 1
            forced.append(src)
    return forced


def _release(forced: list[Any]) -> None:
    for src in forced:
        meter = src._meter
        src._left, meter.forced_left = meter.forced_left, -1


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
