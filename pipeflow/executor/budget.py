"""A request-rate budget: at most so many requests per second, spread over the job.

An object store limits requests per second per key prefix (S3: about 5,500 GET/s per
partitioned prefix), whoever sends them: the limit belongs to the job, not to one DataLoader
worker. :class:`RateBudget` paces one process's requests; :func:`process_share` splits a job's
budget evenly over its processes (ranks x DataLoader workers), known at every process without
talking to the others. Cost: O(1) per request (one lock, one addition), nothing that grows
with objects, ranks or workers; an idle process's share is not lent to the others.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from ..errors import ConfigError

__all__ = ["RateBudget", "check_rate", "process_share"]


def check_rate(value: object, what: str) -> float | None:
    """``value`` as a positive, finite number of requests per second, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"{what} must be a positive number of requests per second or None, "
                          f"got {value!r}")
    return float(value)


def process_share(rate: float, processes: int) -> float:
    """The requests per second each of ``processes`` (ranks x DataLoader workers) may send."""
    return rate / max(1, processes)


class RateBudget:
    """Paces calls of :meth:`acquire` to ``rate`` per second (bursts of at most ``burst``).

    Each call reserves the next free slot and sleeps until it: over any stretch of ``T``
    seconds at most ``rate x T + burst`` calls pass. Thread-safe; :meth:`close` wakes every
    waiting thread at once (the pipeline is stopping: nothing it waits for is wanted).
    """

    def __init__(self, rate: float, *, burst: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = max(1.0, burst)
        self._clock = clock
        self._lock = threading.Lock()
        self._next = clock()  # the earliest time the next slot starts
        self._closed = threading.Event()
        #: seconds callers spent waiting for their slot
        self.waited_s = 0.0

    def reserve(self, after: float = 0.0) -> float:
        """Take the next slot that begins ``after`` seconds from now or later; the seconds to
        wait until it begins."""
        with self._lock:
            now = self._clock()
            interval = 1.0 / self.rate
            slot = max(self._next, now + after - (self.burst - 1.0) * interval)
            self._next = slot + interval
            wait = max(0.0, slot - now)
            self.waited_s += wait
            return wait

    def acquire(self) -> float:
        """Wait for a slot; the seconds waited."""
        wait = self.reserve()
        if wait > 0.0:
            self._closed.wait(wait)
        return wait

    def retry_turn(self, backoff: float) -> float:
        """Wait for a retry's slot, which the caller's backoff of ``backoff`` seconds (slept
        next) does not cover; the seconds waited here."""
        extra = self.reserve(after=backoff) - backoff
        if extra > 0.0:
            self._closed.wait(extra)
            return extra
        return 0.0

    def close(self) -> None:
        self._closed.set()
