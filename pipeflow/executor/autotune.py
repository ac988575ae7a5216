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

A tuner of requests to a store (``store=True``: ``open``) compares requests finished per
second rather than items delivered (in order, results leave the window in bursts behind a
request being retried: :attr:`Interval.throughput`), and also reads what the store says:

* Little's law: the requests in flight that a demand of ``D`` items/s needs at a latency of
  ``L`` seconds are ``D x L``. While the consumer waits for results and the latency stays flat,
  the tuner grows straight to that estimate (up to four times per interval) instead of
  doubling, from the first interval on (unless a quarter of its requests were retried), and a
  settled tuner probes up to it; when the consumer does not wait, the stage is not the limit
  and it stops growing. A step up after which the consumer does not wait is
  kept, whatever the delivered rate: under a DataLoader the job goes at the slower worker's
  pace, so a worker's step up may deliver no more while it did relieve its consumer.
* rising latency at the same concurrency: the store (or the link) is saturated, and more in
  flight only queue. Settled, a latency that doubles over the settled value's makes the tuner
  step down to what carries the measured throughput at the old latency (at most a quarter
  off), and keep the lower value only if it delivers as much (a longer round trip, which needs
  more in flight, does not); not while the consumer does not wait, which sets the rate then.
* throttling: a rising share of retried requests (503 SlowDown, throttling codes, 5xx, resets)
  lowers the limit (by a quarter to a half; the first count of a run, with no usual share yet,
  only beyond a quarter retried); two fresh counts of requests, at the lower limit
  and back at the one it left, judge it: the backoff stands when the higher limit meets a
  clearly higher share (a store limiting the request rate), and is undone when both meet the
  same share (a store failing a share of requests whatever the rate: its own error rate, the
  new normal).

Under a DataLoader, the tuners of one ``open`` in its worker processes share what they settle at
(:class:`Siblings`): the job goes at the slowest worker's pace, and workers that read the same
store with the same pipeline need the same depth. A worker whose consumer waits, settled below
the limit a sibling settled at, takes the sibling's limit rather than finding it again alone
(unless the store pushed back at this worker, or its own latency said it queued): tuning
alone, one worker's step up did not pay while its sibling grew at the same time and took the
store's share, and it held 4-8 in flight for 2-3 s while the other held 64.

A thread map's tuner sets the calls running at once (a :class:`Gate`), with twice as many items
in flight, as ``map(workers=N)`` keeps ``2 * N``.

Work that is not requests to a store climbs only while this process leaves a core idle: when
its CPU time over an interval is :data:`BUSY` of the cores it may use or more, more calls at
once can only share those cores, so the tuner holds the value it has (and does not probe up
while that lasts), whatever one interval's rate said. A JPEG decode in a thread map on 2
cores climbed 2, 4, 8 on rates whose first interval included the warm-up, and settled at 8
calls at once: 0.82x ``map(workers=2)`` (3 repeats of 15 s on a quiet machine).

Throughput is measured where items leave the window, so a pipeline limited by its consumer
or its source sees no gain from more concurrency and the tuner stays low.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import os
import struct
import sys
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from time import perf_counter, process_time
from typing import Literal

__all__ = ["AUTO", "BufferTuner", "Gate", "Interval", "Siblings", "Tuner", "bounds", "cpu_budget",
           "dataloader_workers"]

AUTO = "auto"
#: seconds (at least) per measurement interval
INTERVAL_S = 0.25
#: items (at least) per measurement interval, so a rate is not one item's latency
MIN_ITEMS = 12
#: a step must deliver this much more to count as better (noise on a loaded machine)
GAIN = 0.08
#: intervals spent settled between two probes one step up
PROBE_EVERY = 24
#: the consumer waited more than this share of an interval: it would take more items
STARVED = 0.1
#: the consumer waited less than this share of an interval: the stage is not its limit
IDLE = 0.03
#: latency this many times the settled value's, at the same concurrency: requests queue
RISE = 2.0
#: latency at most this many times the lowest since settling is flat (growth by Little's law)
FLAT = 1.3
#: Little's law estimates get this much room for the noise in rates and latencies
HEADROOM = 1.25
#: a share of retried requests up to this much above the normal one is not a push-back
SHARE_FLOOR = 0.02
#: a backoff lowers the limit by this share at least (the share refused, if more; a half at most)
BACKOFF_STEP = 0.25
#: requests (at least) over which a share of retried requests is judged
SHARE_ITEMS = 40
#: standard deviations by which the share at the limit a backoff left must exceed the share at
#: the lower limit for the backoff to stand: one paired judgement per backoff, not an alarm
#: raised again and again over a run (which needs three)
PAIRED = 2.0
#: ... or fewer, once this many of them, and half, were retried
SHARE_RETRIES = 8
#: a process whose CPU time over an interval is this share of :func:`cpu_budget` or more has no
#: idle core: the plain climb does not go up (see the module doc)
BUSY = 0.85
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


class Siblings:
    """Where the tuners of one stage in the DataLoader worker processes of one pipeline publish
    the limits they settled at, one slot per worker (see :meth:`Tuner.share`).

    One small table of rows in memory shared across ``fork``: :data:`BOARD`, made when this
    module is imported, so every process forked afterwards (DataLoader workers, each epoch's
    new ones) maps the same pages; anonymous, so there is nothing to remove (it goes with the
    last process that maps it). A row belongs to one stage of one pipeline (``key``: a hash of
    the pipeline's statistics channel, unique per pipeline object, and the stage's label);
    a key that lands on a row another stage holds takes it over, and the other stage's
    workers, who check the key at every read, go on tuning alone. A worker started by
    ``spawn`` or ``forkserver`` imports its own table, which no other worker sees: it tunes
    alone, as every worker did before. Workers restarted every epoch
    (``persistent_workers=False``) find the last epoch's workers' limits: a starting point,
    which the tuner's own rules (a latency rise, a push-back) still move."""

    ROWS = 32
    SLOTS = 64
    _ROW = 8 + 4 * SLOTS  # the key, then one limit per worker

    def __init__(self) -> None:
        self._mem = mmap.mmap(-1, self.ROWS * self._ROW)

    @staticmethod
    def _key(name: str) -> int:
        return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little") or 1

    def row(self, name: str) -> int:
        """The key of ``name``'s row, after taking the row over."""
        key = self._key(name)
        base = self._base(key)
        if struct.unpack_from("<Q", self._mem, base)[0] != key:
            self._mem[base + 8:base + self._ROW] = bytes(self._ROW - 8)
            struct.pack_into("<Q", self._mem, base, key)
        return key

    def _base(self, key: int) -> int:
        return (key % self.ROWS) * self._ROW

    def publish(self, key: int, slot: int, value: int) -> None:
        """Worker ``slot`` of the stage ``key`` holds ``value`` settled (0: none)."""
        base = self._base(key)
        if 0 <= slot < self.SLOTS and struct.unpack_from("<Q", self._mem, base)[0] == key:
            struct.pack_into("<i", self._mem, base + 8 + 4 * slot, value)

    def limits(self, name: str) -> list[int] | None:
        """What the workers of the stage ``name`` published, by slot (None: no worker of it
        took a row, or another stage took the row over since)."""
        key = self._key(name)
        base = self._base(key)
        if struct.unpack_from("<Q", self._mem, base)[0] != key:
            return None
        return list(struct.unpack_from(f"<{self.SLOTS}i", self._mem, base + 8))

    def highest(self, key: int, slot: int, count: int) -> int:
        """The highest limit another of the stage's ``count`` workers settled at (0: none, or
        the row is another stage's now)."""
        base = self._base(key)
        count = min(count, self.SLOTS)
        values = struct.unpack_from(f"<{count}i", self._mem, base + 8)
        if struct.unpack_from("<Q", self._mem, base)[0] != key:
            return 0
        return max((v for i, v in enumerate(values) if i != slot), default=0)


#: the table of this process and every process forked from it after the import
BOARD = Siblings()


def cpu_budget() -> int:
    """The cores this process may use: its CPU affinity, shared among DataLoader workers."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // dataloader_workers())


def bounds(kind: Kind) -> tuple[int, int]:
    """``(start, high)`` concurrency for a stage's work: ``"cpu"`` (decode, process map) is bounded
    by the cores (on processes the stage starts there, not at one: see
    :meth:`~pipeflow.stages.map.WindowedOptions.window`); ``"thread"`` (a thread map, whose
    function may wait on I/O) starts at the cores and is bounded by four per core; ``"io"``
    (``open(read=True)``) by a request budget; ``"stream"`` (``open()`` handing out streams)
    too, but starting from two: a stream handed out leaves the window, so two in flight is one
    object being read and the next one opened ahead, whose round trip to the first byte then
    overlaps the reading (a tar shard is read for a long time after it is opened; starting from
    one, every DataLoader worker read its first dozen shards strictly one after another while
    the tuner measured its first step)."""
    if kind in ("io", "stream"):
        high = max(4, IO_HIGH // dataloader_workers())
        return (min(4, high) if kind == "io" else 2), high
    cores = cpu_budget()
    # a thread map starts at the cores: a function that releases the GIL (an image decode, a
    # numpy op) is best there or above, and one that does not loses little at two
    return (1, cores) if kind == "cpu" else (cores, 4 * cores)


class Interval:
    """What one measurement interval saw besides the delivered rate: the time an item spent in
    the stage's function (a request's latency), the time the consumer waited for a result, and
    how many requests were retried.

    Attributes:
        items: items delivered in the interval.
        seconds: its length.
        latency_s: mean seconds an item spent in the function (None: none was timed).
        waited_s: seconds the consumer waited for the window's oldest result.
        retried: requests retried in the interval (503 SlowDown, throttling, 5xx, resets).
        calls: calls of the function (requests) that finished in the interval (0: not timed).
        cpu_s: CPU seconds this process used in the interval (every thread; None: unknown).
    """

    __slots__ = ("calls", "cpu_s", "items", "latency_s", "retried", "seconds", "waited_s")

    def __init__(self, items: int, seconds: float, latency_s: float | None, waited_s: float,
                 retried: float, calls: int = 0, cpu_s: float | None = None) -> None:
        self.items, self.seconds, self.latency_s = items, seconds, latency_s
        self.waited_s, self.retried, self.calls = waited_s, retried, calls
        self.cpu_s = cpu_s

    @property
    def cores_busy(self) -> bool:
        """The process used :data:`BUSY` of the cores it may use, or more: none is idle."""
        return self.cpu_s is not None and self.cpu_s >= BUSY * cpu_budget() * self.seconds

    @property
    def requests(self) -> int:
        """Requests the interval's retries are a share of: the calls that finished, when they
        were timed (delivered in order, an item may wait long after its request finished,
        behind an older one being retried), else the items delivered."""
        return self.calls or self.items

    @property
    def rate(self) -> float:
        return self.items / self.seconds

    @property
    def throughput(self) -> float:
        """Requests finished per second, when they were timed (else :attr:`rate`): what a store's
        tuner compares. Over the long run it equals the delivered rate, but over one interval
        it is far steadier: delivered in order, results leave the window in bursts behind a
        slow head (a request being retried), and the window turns over about once per
        interval when a round trip is as long as one. Under steady 503s, at a fixed 64 in
        flight, an interval's delivered rate varied by 0.71-0.76 (coefficient of variation),
        its finished requests by 0.24-0.31."""
        return (self.calls or self.items) / self.seconds

    @property
    def starved(self) -> bool:
        """The consumer waited a noticeable share of the interval: it would take more."""
        return self.waited_s > STARVED * self.seconds

    @property
    def idle(self) -> bool:
        """The consumer hardly ever waited: this stage is not what limits it."""
        return self.waited_s < IDLE * self.seconds

    @property
    def demand(self) -> float:
        """Items per second the consumer would take if it never waited for this stage."""
        return self.items / max(self.seconds - self.waited_s, 0.05 * self.seconds)


class Tuner:
    """A hill-climbing controller of one in-flight limit, fed by delivered items.

    Args:
        low, high: the range of the limit.
        start: the first value (clamped into the range).
        byte_budget: when items report sizes, the limit also stays under
            ``byte_budget / average item bytes``.
        store: the items are requests to a store: size the limit from latency and demand
            (Little's law), and step down when latency rises at the same concurrency.
    """

    def __init__(self, low: int, high: int, start: int, *, byte_budget: int | None = None,
                 store: bool = False) -> None:
        self.low, self.high = max(1, low), max(1, low, high)
        self.value = min(self.high, max(self.low, start))
        self.byte_budget = byte_budget
        self.store = store
        #: items per second this stage may deliver at most (a request-rate budget), if known
        self.ceiling: float | None = None
        self._avg_bytes = 0.0
        self._lock = threading.Lock()
        self._phase = "grow"
        self._base = (self.value, 0.0)  # (value, rate) the current step is compared with
        self._settled = 0
        self._doubted = False
        #: how many times the store pushed back (a rising share of retried requests) and the
        #: limit was halved
        self.backoffs = 0
        #: how many times a backoff was undone: the share of retried requests did not fall with
        #: fewer requests, which delivered less (the store's own error rate, not a rate limit)
        self.steady_errors = 0
        #: how many times the limit went up, and how many of those were probes of a settled limit
        self.steps_up = 0
        self.probes = 0
        #: seconds from the first item to the first settled value (None: still climbing)
        self.settled_after_s: float | None = None
        self._tuned_s = 0.0  # seconds of delivery measured so far
        #: how many times latency rose at the same concurrency and a lower limit delivered as much
        self.slowdowns = 0
        #: mean seconds per request over the last interval, and at the settled value
        self.latency_s: float | None = None
        self.base_latency_s: float | None = None
        self._latency_at: int | None = None  # the limit base_latency_s was measured at
        self._risen = 0
        self._pressure: Callable[[], float] | None = None
        self._pushed = 0.0
        self._share = 0.0  # the retried share taken as normal
        self._throttled_at: int | None = None  # the limit at the last push-back
        self._seen_items, self._seen_retried = 0, 0.0  # since the share was last judged
        self._unsettled = 0  # requests not counted in a share: the limit just moved
        #: a backoff being judged: None, "lower" (measuring the lower limit), "again" (the
        #: limit it left, measured afresh); what the lower limit saw, and the lower limit
        self._pending: str | None = None
        self._lower: tuple[float, int] = (0.0, 0)
        self._lowered = 0
        self._least_latency: float | None = None  # the lowest interval latency since settling
        self._normal_items, self._normal_retried = 0, 0.0  # since the last backoff
        #: (from, to) of a climb's first jump (:meth:`_first_jump`), while the limit stays there
        self._jumped: tuple[int, int] | None = None
        #: how many times the limit rose to one a sibling DataLoader worker settled at
        self.followed = 0
        self._siblings: tuple[int, int, int] | None = None  # (row key, this slot, workers)
        self.pause()

    def share(self, name: str, slot: int, count: int) -> None:
        """Publish the limits this tuner settles at as worker ``slot`` of ``count`` of the stage
        ``name`` (unique to the pipeline and stage) on :data:`BOARD`, and read the other
        workers' (see :meth:`_follow`)."""
        if count > 1:
            key = BOARD.row(name)
            self._siblings = (key, slot, count)

    def watch(self, pressure: Callable[[], float]) -> None:
        """Back off when the share of requests that ``pressure()`` (a count of retried requests:
        503 SlowDown, throttling, 5xx, resets) says were retried rises: the store is saying
        "fewer", which no gain in throughput shows in time (a retried request still
        delivers, late, and the others pay for it)."""
        self._pressure = pressure
        self._pushed = pressure()

    def pause(self) -> None:
        """Start a new interval (after a pause in delivery, e.g. between epochs)."""
        self._t0 = perf_counter()
        self._cpu0 = process_time()
        self._items = 0
        self._waited = 0.0
        self._served_s = 0.0
        self._served = 0

    def served(self, seconds: float) -> None:
        """One call of the function (a request) took ``seconds``; any thread may call it."""
        with self._lock:
            self._served_s += seconds
            self._served += 1

    def waited(self, seconds: float) -> None:
        """The consumer waited ``seconds`` for the window's oldest result."""
        self._waited += seconds

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
            latency = self._served_s / self._served if self._served else None
            self._judge(Interval(self._items, elapsed, latency, self._waited, self._retried(), self._served,
                                 process_time() - self._cpu0))
            self.pause()

    def _judge(self, interval: Interval) -> None:
        """One interval's decision, and its record for ``stats()``."""
        before = self.value
        if self._pushed_back(interval):  # a backoff and its judgement move the limit alone
            self.latency_s = interval.latency_s
            rechecked = self._pending == "again"  # back where it was, not a step up
        else:
            rechecked = False
            if self.store:
                self._store_step(interval)
                self._follow(interval)
            else:
                self._step(interval.rate, busy=interval.cores_busy)
        self.value = self._capped(self.value)
        if self._siblings is not None:
            key, slot, _ = self._siblings
            BOARD.publish(key, slot, self.value if self._phase == "steady" else 0)
        if self._jumped is not None and self.value != self._jumped[1]:
            self._jumped = None  # the limit moved on: a later push-back is not the jump's
        self.steps_up += self.value > before and not rechecked
        self._tuned_s += interval.seconds
        if self.settled_after_s is None and self._phase == "steady":
            self.settled_after_s = self._tuned_s

    def _retried(self) -> float:
        pressure = self._pressure
        if pressure is None:
            return 0.0
        seen = pressure()
        new, self._pushed = max(0.0, seen - self._pushed), seen
        return new

    def _pushed_back(self, interval: Interval) -> bool:
        """Lower the limit when the share of retried requests rose beyond the normal one,
        beyond the noise of a share: it is judged over SHARE_ITEMS requests at least (sooner when
        SHARE_RETRIES of them were retried, and half). True while the interval belongs to the
        judgement of a backoff (:meth:`_judge_backoff`): the limit then moves for it alone."""
        unsettled = self._unsettled
        if unsettled > 0:  # the window still turns over after the limit moved
            self._unsettled -= interval.requests
            if 2 * unsettled > interval.requests:  # the interval is mostly that turnover
                return self._pending is not None
        self._seen_items += interval.requests
        self._seen_retried += interval.retried
        items, retried, pending = self._seen_items, self._seen_retried, self._pending
        share = retried / items
        early = pending is None and retried >= SHARE_RETRIES and retried >= 0.5 * items
        if items < SHARE_ITEMS and not early:
            return pending is not None
        self._seen_items, self._seen_retried = 0, 0.0
        if pending is not None:
            return self._judge_backoff(share, items)
        if self._refused_more(share, items) and self.value > self.low:
            return self._back_off(share)
        # the normal share: of every request since the last backoff (a long memory, so a lucky
        # stretch does not make the usual share look like a push-back)
        self._normal_items += items
        self._normal_retried += retried
        self._share = self._normal_retried / self._normal_items
        return False

    def _refused_more(self, share: float, items: int) -> bool:
        """``share`` of ``items`` requests retried is a push-back: beyond the usual share by
        more than its noise (:func:`_rose`), and before any usual share is known (the first
        count of a run), beyond a quarter too. Against a usual share of none taken as known,
        a store failing a steady 10% of requests made one DataLoader worker in four back off
        within its first second (21% of 53 requests), and the judgement of that backoff held
        it at 12-24 in flight for another 1.2-1.4 s; a store that limits the rate refuses far
        more than a quarter of requests beyond it."""
        if not self._normal_items:
            return share > BACKOFF_STEP and _rose(share, items, 0.0, 0)
        return _rose(share, items, self._share, self._normal_items)

    def _back_off(self, share: float) -> bool:
        """Down to what the store accepted (the limit times the share not refused), by a
        quarter at least and a half at most (right after a climb's first jump, by all the
        store refused, down to the jump's start at most), and judge it: SHARE_ITEMS requests
        at the lower limit, then as many at the limit it left (see :meth:`_judge_backoff`)."""
        self.backoffs += 1
        self._throttled_at = value = self.value
        step = max(1, math.ceil(value * max(share, BACKOFF_STEP)))
        lower = max(self.low, value // 2, value - step)
        if self._jumped is not None:  # a jump of up to four times: by all it refused, to its start at most
            lower, self._jumped = max(self.low, self._jumped[0], value - step), None
        self._settle(lower, 0.0)
        self._pending, self._unsettled = "lower", value
        self._hold = PROBE_EVERY  # the store asked for fewer: no quick probe up
        return True

    def _judge_backoff(self, share: float, items: int) -> bool:
        """Why the store refused, from two fresh measurements of ``share`` (never the one that
        set the backoff off: picked for being high, it would make any later share look lower):
        SHARE_ITEMS requests at the lower limit, then as many back at the limit it left.

        A store that limits the request rate refuses more of more requests: the share at the
        higher limit is clearly above the one at the lower (PAIRED standard deviations), and
        the backoff stands (again, while the lower limit still meets a share beyond the floor).
        A store that fails a share of requests whatever the rate fails as large a share of
        both (within one standard deviation): the backoff bought nothing, the tuner keeps the
        higher limit and grows from there, and that share becomes the usual one
        (``steady_errors``). In between, it keeps the lower limit but neither holds it nor
        caps growth: a probe up that pays keeps its step. Both windows count requests, not
        seconds, so the verdict comes as fast as the store answers; the delivered rate has
        no say (it moves with the consumer and the other processes)."""
        if self._pending == "lower":
            self._pending, self._lower, self._lowered = "again", (share, items), self.value
            self.value = self._throttled_at or self.value  # the limit it left, measured afresh
            self._unsettled = self.value
            return True
        self._pending = None
        lower_share, lower_items = self._lower
        if _rose(share, items, lower_share, lower_items, sigmas=PAIRED):  # rate-driven
            self._normal(lower_share, lower_items)
            self._settle(self._lowered, 0.0)
            if _rose(lower_share, lower_items, 0.0, 0) and self.value > self.low:
                return self._back_off(lower_share)  # still refused beyond the floor: lower again
            self._hold = PROBE_EVERY
            return True
        self._normal((share * items + lower_share * lower_items) / (items + lower_items), items + lower_items)
        self._throttled_at = None
        if _rose(share, items, lower_share, lower_items, sigmas=1.0):  # undecided: lower, free
            self._settle(self._lowered, 0.0)
            return True
        self.steady_errors += 1
        self._phase, self._doubted, self._least_latency = "grow", False, None
        self._base = (self.value, 0.0)  # measured afresh, then grows
        return True

    def _normal(self, share: float, items: int) -> None:
        """Take ``share`` of ``items`` requests as the usual share of retried requests."""
        self._share, self._normal_items, self._normal_retried = share, items, share * items

    def _capped(self, value: int) -> int:
        high = self.high
        if self.byte_budget and self._avg_bytes:
            high = min(high, max(self.low, int(self.byte_budget / self._avg_bytes)))
        return min(high, max(self.low, value))

    # ---- requests to a store ------------------------------------------------------------------
    def _store_step(self, interval: Interval) -> None:
        """One interval of a store's tuner: latency and demand first, then the hill-climb."""
        latency, phase, held = interval.latency_s, self._phase, self.value  # measured at `held`
        self.latency_s = latency
        least = self._least_latency
        if latency is not None:
            self._least_latency = latency if least is None else min(least, latency)
        if phase == "shrink":
            self._judge_shrink(interval)
        elif phase == "steady" and self._latency_rose(latency) and not interval.idle:
            # (a consumer that does not wait sets the rate: fewer in flight would "deliver as
            # much" whatever they carry; under a DataLoader, because the other worker is slower)
            self._shrink(interval)
        elif phase == "grow" and self._at_ceiling(interval):
            self._settle(self.value, interval.throughput)  # it may not get more
        elif phase in ("grow", "probe", "refine") and interval.idle:
            # the consumer stopped waiting: this stage is no longer its limit at this value,
            # whatever the rate says. Under a DataLoader the job goes at the slower worker's
            # pace: a worker's step up then delivers no more (the other worker is the limit
            # now), and judged by its rate it went back down and held there
            self._settle(self.value, interval.throughput)
        elif phase == "steady" and interval.idle:
            self._settled = 0  # no probing up while the consumer does not wait
        elif (phase == "steady" and interval.starved and self._settled >= self._hold
              and self._flat(latency) and not self._at_ceiling(interval)):
            # the consumer waits at a flat latency: more may help now, as many as it would take
            # (by half only below a limit the store pushed back at: it is near; and after a
            # backoff neither kept nor undone, whose limit is forgotten but was near too: a jump
            # of four times from there met three in four requests refused)
            pushed = self._throttled_at is not None or self.backoffs > self.steady_errors
            self._probe(None if pushed else self._little(interval, least, floor=self._half_up()))
        else:
            grow_to = self._little(interval, least)
            self._step(interval.throughput, grow_to)
            if least is None and grow_to is not None and self.value > held:  # a first jump
                self._jumped = (held, self.value)
        if self._phase == "steady" and latency is not None and not self._risen and self.value == held:
            base = self.base_latency_s if self._latency_at == held else None
            self.base_latency_s = latency if base is None else base + 0.1 * (latency - base)
            self._latency_at = held

    def _follow(self, interval: Interval) -> None:
        """Settled below the limit a sibling DataLoader worker settled at, while this worker's
        consumer waits: take the sibling's limit. The job goes at the slowest worker's pace
        and the workers read the same store with the same pipeline; tuning alone, a worker's
        step up did not pay while its sibling grew at the same time and took the store's
        share (the store answered both at its capacity), and it settled at 8 in flight while
        the sibling held 64. Not where this worker's own measurements said fewer: after a
        push-back of the store at it (kept, being judged, or neither kept nor undone) or a
        step down for rising latency."""
        if self._siblings is None or self._phase != "steady" or not interval.starved:
            return
        if (self._pending is not None or self._throttled_at is not None
                or self.backoffs > self.steady_errors or self.slowdowns):
            return
        limit = self._capped(BOARD.highest(*self._siblings))
        if limit > self.value:
            self.followed += 1
            self._settle(limit, interval.throughput)

    def _flat(self, latency: float | None) -> bool:
        base = self.base_latency_s
        return latency is not None and base is not None and latency <= FLAT * base

    def _latency_rose(self, latency: float | None) -> bool:
        """Twice in a row, latency more than doubled over the settled value's."""
        base = self.base_latency_s
        if latency is None or base is None or latency <= RISE * base or self.value <= self.low:
            self._risen = 0
            return False
        self._risen += 1
        return self._risen >= 2

    def _shrink(self, interval: Interval) -> None:
        """Step down to what carries the measured throughput at the settled latency (Little's
        law), at most a quarter off; :meth:`_judge_shrink` keeps it if it delivers as much."""
        assert self.base_latency_s is not None
        needed = math.ceil(interval.throughput * self.base_latency_s * HEADROOM)
        self._phase, self._base = "shrink", (self.value, interval.throughput)
        self.value = max(self.low, min(self.value - 1, max(needed, self.value * 3 // 4)))

    def _judge_shrink(self, interval: Interval) -> None:
        base_value, base_rate = self._base
        self._risen = 0
        if interval.throughput >= base_rate * (1 - GAIN):  # as much with fewer: they were queueing
            self.slowdowns += 1
            self._settle(self.value, interval.throughput)
        else:  # fewer delivered less: a longer round trip, not a queue; its latency is the norm
            self._settle(base_value, base_rate)
        self.base_latency_s, self._latency_at = interval.latency_s, self.value

    def _little(self, interval: Interval, least: float | None, floor: int | None = None) -> int | None:
        """The next value to try when growing: Little's law, ``demand x latency`` with some
        headroom, between ``floor`` (default: two times the limit) and four times the limit;
        None (double) unless the consumer waits and the latency is flat against ``least``, the
        lowest of the earlier intervals since settling (a queue doubles the latency with the
        requests, which rules a jump out). The first interval of a climb has nothing to
        compare with and jumps all the same (:meth:`_first_jump`)."""
        latency = interval.latency_s
        if latency is None or not interval.starved:
            return None
        flat = self._first_jump(interval) if least is None else latency <= FLAT * least
        if not flat:
            return None
        demand = min(interval.demand, self.ceiling or math.inf)
        needed = math.ceil(demand * latency * HEADROOM)
        return max(floor or 2 * self.value, min(4 * self.value, needed))

    def _first_jump(self, interval: Interval) -> bool:
        """The first interval of a climb (nothing measured yet at the value it started from)
        may jump by Little's law too, with a quarter of its requests retried beyond the usual
        share at most. Doubling from the start, under a steady 10% of 503s, the climb went 4, 8,
        32, 64 in flight and settled after 1.5-2.3 s, while a fixed limit has its depth from the
        first request (0.81x of the best fixed limit in 6 s cases, 1.00x in 15 s ones). Its latency is the
        start value's, before any queue, and the jump stays within four times the limit; a
        store that refuses a quarter of the first requests may be limiting the rate, which
        more requests only meet more often: that climb doubles, and the push-back rule judges
        it. A push-back right after the jump goes down by all the store refused, to where the
        climb started at most (:meth:`_back_off`), not by half at most."""
        if self._phase != "grow" or self._base[1] != 0.0:
            return False
        return interval.retried <= (self._share + BACKOFF_STEP) * interval.requests

    def _at_ceiling(self, interval: Interval) -> bool:
        return self.ceiling is not None and interval.throughput >= (1 - GAIN) * self.ceiling

    def _probe(self, grow_to: int | None = None) -> None:
        """One step up from a settled value: by half, or to ``grow_to`` (Little's law's estimate,
        when the consumer waits at a flat latency)."""
        self.probes += 1
        self._phase, self._settled, self._doubted = "probe", 0, False
        self.value = self._up(grow_to or self._half_up())

    def _half_up(self) -> int:
        return max(self.value + 1, self.value * 3 // 2)

    def _up(self, nxt: int) -> int:
        """The next value when growing to ``nxt``: below the limit at which the store last
        pushed back, at most just under it; at or above it, an eighth more (the store's rate
        may have grown since, or the push-back came from someone else's requests)."""
        pushed = self._throttled_at
        if pushed is None:
            return nxt
        if self.value < pushed - 1:
            return min(nxt, pushed - 1)
        return self.value + max(1, self.value // 8)

    # ---- the hill-climb -----------------------------------------------------------------------
    def _step(self, rate: float, grow_to: int | None = None, *, busy: bool = False) -> None:
        base_value, base_rate = self._base
        better = rate > base_rate * (1 + GAIN)
        nxt = self._up(grow_to or self.value * 2)
        if busy and self._phase == "grow" and (base_rate == 0.0 or (better and self.value > base_value)):
            # no idle core: a step up would only share the cores; hold what was reached
            self._settle(self.value, rate)
            return
        if self._phase == "grow":
            if base_rate == 0.0 or (better and self.value > base_value):
                self._doubted = False
                self._try(self.value, rate, nxt)
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
            if better and busy:  # the probe paid, and took the last idle core: hold it
                self._settle(self.value, rate)
            elif better:
                self._phase = "grow"
                self._try(self.value, rate, nxt)
            elif not self._doubted:
                # measured twice, as a step of a climb is: a failed probe holds the lower value
                # for PROBE_EVERY intervals, the interval right after the step still delivers
                # mostly what was in flight before it, and on a loaded machine one interval's
                # rate is close to a coin toss
                self._doubted = True
            else:
                self._settle(base_value, base_rate)
                self._hold = PROBE_EVERY  # a waiting consumer no longer makes it probe soon
        else:
            self._settled += 1
            self._base = (self.value, 0.5 * (base_rate + rate))
            if self._settled >= PROBE_EVERY and self.value < self._capped(self.high) and not busy:
                self._probe()

    def _try(self, value: int, rate: float, nxt: int) -> None:
        self._base = (value, rate)
        nxt = self._capped(nxt)
        if nxt == value:
            self._settle(value, rate)
        else:
            self.value = nxt

    def _settle(self, value: int, rate: float) -> None:
        if value != self._latency_at:
            self.base_latency_s = None  # measured again at the value held
        self._least_latency = None
        self._phase, self._settled, self._hold = "steady", 0, 4
        self.value, self._base = value, (value, rate)

    @property
    def settled(self) -> bool:
        """True once the tuner holds a value (it may still probe later)."""
        return self._phase == "steady"


def _rose(share: float, items: int, before: float, before_items: int, *, sigmas: float = 3.0) -> bool:
    """A share of retried requests measured over ``items`` requests is higher than ``before``
    (measured over ``before_items``; 0: taken as known) by more than SHARE_FLOOR plus ``sigmas``
    standard deviations of the difference (three for an alarm judged again and again over a
    run: a rarer false alarm than two), for a pooled share of at least SHARE_FLOOR. Both shares'
    noise counts: a normal share learnt over a few dozen requests is as uncertain as the new one."""
    total = items + before_items
    pooled = (share * items + before * before_items) / max(1, total)
    pooled = min(max(pooled, SHARE_FLOOR), 1.0)
    spread = 1.0 / max(1, items) + (1.0 / before_items if before_items else 0.0)
    return share - before > SHARE_FLOOR + sigmas * math.sqrt(pooled * (1.0 - pooled) * spread)


class Gate:
    """At most ``tuner.value`` calls run at once, whatever the pool's size: a tuned thread map
    keeps twice that many items in flight (as ``map(workers=N)`` keeps ``2 * N``), so a thread
    that finishes a call takes the next item at once instead of idling until the consumer takes
    the oldest result. The items beyond wait in the gate's queue, not on a thread: at most
    ``value`` pool threads run the gate's calls, each taking queued items until the queue is
    empty or the value fell below the threads running. (Items used to wait on a thread of their
    own, at a lock: every call that ended woke another thread to run the next item, while the
    one that ended went to sleep holding a new one; with 8 threads for a decode tuned to 4 at
    once, the process used 1.75 of its 2 cores where ``map(workers=4)`` used 1.86.) The limit
    may move at any time: a lower one takes effect as calls end, a higher one at the next
    :meth:`submit`."""

    def __init__(self, tuner: Tuner) -> None:
        self.tuner = tuner
        self._lock = threading.Lock()
        self._queue: deque[tuple[Callable[[object], object], object, Future[object]]] = deque()
        self._runners = 0

    def submit(self, start: Callable[[Callable[[], None]], object], fn: Callable[[object], object],
               item: object) -> Future[object]:
        """``fn(item)`` in its turn, as a future; ``start(runner)`` runs ``runner()`` on a pool
        thread (an executor's ``submit``) when fewer than ``value`` run the queue."""
        future: Future[object] = Future()
        entry = (fn, item, future)
        with self._lock:
            self._queue.append(entry)
            more = self._runners < self.tuner.value
            self._runners += more
        if more:
            try:
                start(self._run)
            except BaseException:
                with self._lock:
                    self._runners -= 1
                    if entry in self._queue:
                        self._queue.remove(entry)
                raise
        return future

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue or self._runners > self.tuner.value:
                    self._runners -= 1
                    return
                fn, item, future = self._queue.popleft()
            if not future.set_running_or_notify_cancel():  # cancelled while it waited
                continue
            try:
                result = fn(item)
            except BaseException as exc:  # delivered through the future, as a pool does
                future.set_exception(exc)
            else:
                future.set_result(result)


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
