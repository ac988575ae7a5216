"""Listing a large prefix as several chains of pages at once.

A store lists 1,000 keys a request, each request naming where the previous one stopped, so a
million keys are a thousand round trips in a row. When a backend can start a page at any key
(:attr:`~pipeflow.backends.base.Backend.pages_from_any_key`: S3's ``StartAfter``), the key space
can be cut into ranges listed concurrently. Nothing says where the keys are, so the cuts are
made as the listing goes: the first page shows the characters keys are made of; a chain that
still has work when a thread is free gives the upper half of what is left to it, cut at the
midpoint between its position and its end, counted in those characters. Each range is the
half-open interval ``(low, high]`` of URLs, so every key falls in exactly one range; the ranges
are concatenated in order (and checked to be strictly increasing).

Cost: ``ceil(N / 1000)`` requests plus at most one per cut (the short last page of a range,
or a probe that lands in an empty part of the key space); the number of cuts is bounded by
``max_cuts``. Memory is the listing itself. Backends without ``pages_from_any_key`` list as
one serial chain (:meth:`~pipeflow.backends.base.Backend.list`).
"""

from __future__ import annotations

import bisect
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..items import ObjectInfo
from .base import Backend

__all__ = ["Listing", "list_parallel", "serial_requests"]


@dataclass
class Listing:
    """A finished listing: the objects in URL order and the list requests it took."""

    objects: list[ObjectInfo]
    requests: int
    ranges: int = 1


@dataclass
class _Range:
    """Keys in ``(low, high]`` (``high`` None: no end), listed by one chain of pages."""

    low: str
    high: str | None
    found: list[ObjectInfo] = field(default_factory=list)
    done: bool = False


class _Cutter:
    """Midpoints between two keys, counted in the alphabet the keys are written in."""

    def __init__(self, sample: list[str]) -> None:
        chars = sorted({c for key in sample for c in key})
        self.alphabet = chars or ["0"]

    def _digits(self, key: str, width: int) -> list[int]:
        # digit 0 is "no character" (a shorter key sorts first), digit k is alphabet[k - 1]
        out = [min(bisect.bisect_left(self.alphabet, c), len(self.alphabet) - 1) + 1 for c in key[:width]]
        return out + [0] * (width - len(out))

    def midpoint(self, low: str, high: str | None, prefix: str) -> str | None:
        """A key strictly between ``low`` and ``high`` (``high`` None: the largest key under
        ``prefix`` in this alphabet), or None when they are too close to cut."""
        lo = low[len(prefix):]
        width = max(len(lo), len(high or "") - len(prefix)) + 2
        top = high[len(prefix):] if high is not None else self.alphabet[-1] * width
        base = len(self.alphabet) + 1
        a = b = 0
        for da, db in zip(self._digits(lo, width), self._digits(top, width)):
            a, b = a * base + da, b * base + db
        mid = (a + b) // 2
        digits = []
        for _ in range(width):
            mid, d = divmod(mid, base)
            digits.append(d)
        text = prefix + "".join(self.alphabet[max(d, 1) - 1] for d in reversed(digits)).rstrip(
            self.alphabet[0])
        if not low < text or (high is not None and not text < high):
            return None
        return text


def list_parallel(backend: Backend, url: str, *, concurrency: int = 8, max_cuts: int | None = None,
                  ) -> Listing:
    """List ``url`` with up to ``concurrency`` chains of pages in flight (sorted by URL).

    Args:
        backend: the backend; one serial chain unless ``backend.pages_from_any_key``.
        url: the prefix.
        concurrency: requests in flight at most.
        max_cuts: cuts of the key space at most (default ``2 * concurrency``): each may cost one
            request more than a serial listing.
    """
    if concurrency < 1:
        raise ConfigError(f"listing concurrency must be >= 1, got {concurrency!r}")
    first, more = backend.list_page(url, start_after=None)
    if not more or concurrency == 1 or not backend.pages_from_any_key:
        if not more:
            return Listing(first, 1)
        rest = _serial(backend, url, first[-1].url)
        return Listing(first + rest.objects, 1 + rest.requests)
    return _Parallel(backend, url, first, concurrency,
                     2 * concurrency if max_cuts is None else max_cuts).run()


def _serial(backend: Backend, url: str, after: str) -> Listing:
    found: list[ObjectInfo] = []
    requests = 0
    while True:
        page, more = backend.list_page(url, start_after=after)
        requests += 1
        found += page
        if not more or not page:
            return Listing(found, requests)
        after = page[-1].url


class _Parallel:
    """The ranges of one parallel listing and the threads that walk them."""

    def __init__(self, backend: Backend, url: str, first: list[ObjectInfo], concurrency: int,
                 max_cuts: int) -> None:
        self.backend, self.url, self.first = backend, url, first
        self.concurrency, self.cuts_left = concurrency, max_cuts
        self.cutter = _Cutter([i.url[len(url):] for i in first])
        self.prefix = url
        self.lock = threading.Lock()
        self.ranges = [_Range(first[-1].url, None)]
        self.requests = 1
        self.active = 0
        self._pool: ThreadPoolExecutor | None = None
        self._queued: list[Future[None]] = []

    def run(self) -> Listing:
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="pipeflow-list") as pool:
            pending: set[Future[None]] = {self._start(pool, self.ranges[0])}
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    fut.result()  # a failed request fails the listing, with its typed error
                with self.lock:
                    pending |= set(self._queued)
                    self._queued.clear()
        return Listing(self._joined(), self.requests, len(self.ranges))

    def _start(self, pool: ThreadPoolExecutor, rng: _Range) -> Future[None]:
        self._pool = pool
        self.active += 1
        return pool.submit(self._walk, rng)

    def _walk(self, rng: _Range) -> None:
        after = rng.low
        try:
            while True:
                page, more = self.backend.list_page(self.url, start_after=after)
                with self.lock:
                    self.requests += 1
                    high = rng.high  # may have been lowered by a cut
                    keep = [i for i in page if high is None or i.url <= high]
                    rng.found += keep
                    if not more or len(keep) < len(page) or not page:
                        rng.done = True
                        return
                    after = page[-1].url
                    self._maybe_cut(rng, after)
        finally:
            with self.lock:
                self.active -= 1

    def _maybe_cut(self, rng: _Range, position: str) -> None:
        """Give the upper half of what ``rng`` has left to a new chain, if a thread is free."""
        if self.cuts_left <= 0 or self.active >= self.concurrency:
            return
        mid = self.cutter.midpoint(position, rng.high, self.prefix)
        if mid is None:
            return
        upper = _Range(mid, rng.high)
        rng.high = mid
        self.cuts_left -= 1
        self.ranges.insert(self.ranges.index(rng) + 1, upper)
        self.active += 1
        assert self._pool is not None
        self._queued.append(self._pool.submit(self._walk, upper))

    def _joined(self) -> list[ObjectInfo]:
        out = list(self.first)
        for rng in self.ranges:
            for info in rng.found:
                if info.url > out[-1].url:  # ranges meet at a boundary key: never twice
                    out.append(info)
        return out


def serial_requests(n: int, page: int = 1000) -> int:
    """The requests one serial chain of pages takes for ``n`` keys (at least one)."""
    return max(1, -(-n // page))

