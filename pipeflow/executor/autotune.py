"""Online concurrency tuning: ``workers="auto"``, ``max_inflight="auto"``, ``prefetch("auto")``.

A :class:`Tuner` owns one number, the in-flight limit of a window. The window reports every
item it delivers; over short intervals the tuner measures delivered items per second and
hill-climbs: it doubles the limit while each step delivers clearly more (beyond the noise of
a shared machine; a step that does not pay is measured twice before it counts as a failure),
tries one step in between when a doubling does not pay, settles on the best
value, and probes one step up now and then in case the load changed. It never leaves
``[low, high]``; ``high`` comes from a budget: the cores this process may use (divided among
DataLoader workers) for CPU-bound work, a larger request count for I/O-bound ``open``, and,
when items carry bytes, a memory budget of bytes in flight.

Throughput is measured where items leave the window, so a pipeline limited by its consumer
or its source sees no gain from more concurrency and the tuner stays low.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from time import perf_counter
from typing import Literal

__all__ = ["AUTO", "BufferTuner", "Tuner", "bounds", "cpu_budget", "dataloader_workers"]

AUTO = "auto"
#: seconds (at least) per measurement interval
INTERVAL_S = 0.25
#: items (at least) per measurement interval, so a rate is not one item's latency
MIN_ITEMS = 12
#: a step must deliver this much more to count as better (noise on a loaded machine)
GAIN = 0.08
#: intervals spent settled between two probes one step up
PROBE_EVERY = 24
#: requests in flight an ``open`` may reach per process (latency-bound: well above cores)
IO_HIGH = 64
#: bytes in flight an ``open`` may hold per process (results read into memory)
BYTE_BUDGET = 256 << 20

Kind = Literal["cpu", "thread", "io", "stream"]


def dataloader_workers() -> int:
    """How many DataLoader worker processes share this machine with this one (1 outside)."""
    torch_data = sys.modules.get("torch.utils.data")  # never import torch for this
    if torch_data is None:
        return 1
    info = torch_data.get_worker_info()
    return max(1, info.num_workers) if info is not None else 1


def cpu_budget() -> int:
    """The cores this process may use: its CPU affinity, shared among DataLoader workers."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // dataloader_workers())


def bounds(kind: Kind) -> tuple[int, int]:
    """``(start, high)`` concurrency for a stage's work: ``"cpu"`` (decode, process map) is
    bounded by the cores; ``"thread"`` (a thread map, whose function may wait on I/O) by
    four per core; ``"io"`` (``open(read=True)``) by a request budget; ``"stream"``
    (``open()`` handing out streams) too, but starting from two: a stream handed out leaves the
    window, so two in flight is one object being read and the next one opened ahead, whose
    round trip to the first byte then overlaps the reading (a tar shard is read for a long
    time after it is opened; starting from one, every DataLoader worker read its first dozen
    shards strictly one after another while the tuner measured its first step)."""
    if kind in ("io", "stream"):
        high = max(4, IO_HIGH // dataloader_workers())
        return (min(4, high) if kind == "io" else 2), high
    cores = cpu_budget()
    return 1, (cores if kind == "cpu" else 4 * cores)


class Tuner:
    """A hill-climbing controller of one in-flight limit, fed by delivered items.

    Args:
        low, high: the range of the limit.
        start: the first value (clamped into the range).
        byte_budget: when items report sizes, the limit also stays under
            ``byte_budget / average item bytes``.
    """

    def __init__(self, low: int, high: int, start: int, *, byte_budget: int | None = None) -> None:
        self.low, self.high = max(1, low), max(1, low, high)
        self.value = min(self.high, max(self.low, start))
        self.byte_budget = byte_budget
        self._avg_bytes = 0.0
        self._lock = threading.Lock()
        self._phase = "grow"
        self._base = (self.value, 0.0)  # (value, rate) the current step is compared with
        self._settled = 0
        self._doubted = False
        #: how many times the store pushed back (a retried request) and the limit was halved
        self.backoffs = 0
        self._pressure: Callable[[], float] | None = None
        self._pushed = 0.0
        self.pause()

    def watch(self, pressure: Callable[[], float]) -> None:
        """Back off when ``pressure()`` (a count of retried requests: 503 SlowDown, throttling,
        5xx, resets) grows: the store is saying "fewer", which no gain in throughput shows
        in time (a retried request still delivers, late, and the others pay for it)."""
        self._pressure = pressure
        self._pushed = pressure()

    def pause(self) -> None:
        """Start a new interval (after a pause in delivery, e.g. between epochs)."""
        self._t0 = perf_counter()
        self._items = 0

    def delivered(self, nbytes: int = 0) -> None:
        """One item left the window (``nbytes``: its size, when known)."""
        with self._lock:
            self._items += 1
            if nbytes:
                avg = self._avg_bytes
                self._avg_bytes = nbytes if not avg else 0.9 * avg + 0.1 * nbytes
            elapsed = perf_counter() - self._t0
            if elapsed < INTERVAL_S or self._items < MIN_ITEMS:
                return
            rate = self._items / elapsed
            if not self._pushed_back():
                self._step(rate)
            self.value = self._capped(self.value)
            self.pause()

    def _pushed_back(self) -> bool:
        """Halve the limit and hold it (probing up again only after PROBE_EVERY quiet
        intervals) when requests were retried since the last interval."""
        pressure = self._pressure
        if pressure is None:
            return False
        seen = pressure()
        if seen <= self._pushed:
            return False
        self._pushed = seen
        self.backoffs += 1
        self._settle(max(self.low, self.value // 2), 0.0)
        return True

    def _capped(self, value: int) -> int:
        high = self.high
        if self.byte_budget and self._avg_bytes:
            high = min(high, max(self.low, int(self.byte_budget / self._avg_bytes)))
        return min(high, max(self.low, value))

    def _step(self, rate: float) -> None:
        base_value, base_rate = self._base
        better = rate > base_rate * (1 + GAIN)
        if self._phase == "grow":
            if base_rate == 0.0 or (better and self.value > base_value):
                self._doubted = False
                self._try(self.value, rate, self.value * 2)
            elif self.value > base_value and not self._doubted:
                # one interval that did not pay may be noise (or a neighbour's step: DataLoader
                # workers tune at once and share the cores): measure the same step again
                self._doubted = True
            elif self.value > base_value:  # the step did not pay twice: try between, or stop
                middle = (base_value + self.value) // 2
                if self.value - base_value >= 2 and middle > base_value:
                    self._phase = "refine"
                    self.value = middle
                else:
                    self._settle(base_value, base_rate)
            else:
                self._settle(self.value, rate)
        elif self._phase == "refine":
            self._settle(*((self.value, rate) if better else (base_value, base_rate)))
        elif self._phase == "probe":
            if better:
                self._phase = "grow"
                self._try(self.value, rate, self.value * 2)
            else:
                self._settle(base_value, base_rate)
        else:
            self._settled += 1
            self._base = (self.value, 0.5 * (base_rate + rate))
            if self._settled >= PROBE_EVERY and self.value < self._capped(self.high):
                self._phase, self._settled = "probe", 0
                self.value = max(self.value + 1, self.value * 3 // 2)

    def _try(self, value: int, rate: float, nxt: int) -> None:
        self._base = (value, rate)
        nxt = self._capped(nxt)
        if nxt == value:
            self._settle(value, rate)
        else:
            self.value = nxt

    def _settle(self, value: int, rate: float) -> None:
        self._phase, self._settled = "steady", 0
        self.value, self._base = value, (value, rate)

    @property
    def settled(self) -> bool:
        """True once the tuner holds a value (it may still probe later)."""
        return self._phase == "steady"


class BufferTuner:
    """Sizes a prefetch buffer: it doubles (up to ``high``) when, over an interval, the
    consumer found the buffer empty on more than one get in ten while the producer also found
    it full: both sides waited at different times, so a deeper buffer absorbs the bursts. When
    only the consumer waits, the producer is simply slower and a bigger buffer would not help."""

    def __init__(self, start: int = 2, high: int = 64) -> None:
        self.value = start
        self.high = high
        self._gets = self._empty = self._full = 0
        self._t0 = perf_counter()

    def got(self, waited: bool) -> bool:
        """The consumer took one item (``waited``: the buffer was empty); True when the size
        changed."""
        self._gets += 1
        self._empty += waited
        if perf_counter() - self._t0 < INTERVAL_S or self._gets < MIN_ITEMS:
            return False
        grow = self._empty * 10 > self._gets and self._full > 0 and self.value < self.high
        self._gets = self._empty = self._full = 0
        self._t0 = perf_counter()
        if grow:
            self.value = min(self.high, 2 * self.value)
        return grow

    def full(self) -> None:
        """The producer found the buffer full."""
        self._full += 1
