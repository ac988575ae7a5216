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
    """Keys as numbers, counted in the alphabet the keys are written in, to estimate how many
    keys lie between two keys and where to cut between them."""

    def __init__(self, sample: list[str], prefix: str) -> None:
        chars = sorted({c for key in sample for c in key})
        self.alphabet = chars or ["0"]
        self.prefix = prefix
        self.base = len(self.alphabet) + 1
        # a guess at the last key: the sample's last key with each digit or letter raised to
        # the highest of its kind ("0000999.jpg" -> "9999999.zzz"); the alphabet's highest
        # character in every place would guess far too high for numbered keys
        last = sample[-1] if sample else ""
        self.top = "".join(_highest(c) for c in last)
        self.first = sample[0] if sample else ""  # the listing's first key, after the prefix

    def value(self, url: str | None, width: int) -> int:
        """``url`` (under the prefix; None: the largest key in this alphabet) as a number of
        ``width`` digits; digit 0 is "no character" (a shorter key sorts first)."""
        key = (self.top or self.alphabet[-1] * width) if url is None else url[len(self.prefix):]
        top = len(self.alphabet) - 1
        number = 0
        for i in range(width):
            digit = min(bisect.bisect_left(self.alphabet, key[i]), top) + 1 if i < len(key) else 0
            number = number * self.base + digit
        return number

    def key(self, number: int, width: int) -> str:
        digits = []
        for _ in range(width):
            number, d = divmod(number, self.base)
            digits.append(d)
        text = "".join(self.alphabet[max(d, 1) - 1] for d in reversed(digits))
        return self.prefix + text.rstrip(self.alphabet[0])

    def cuts(self, page: list[ObjectInfo], high: str | None, min_keys: int, parts: int) -> list[str]:
        """Keys that cut ``(last key of page, high]``, each part estimated to hold ``min_keys``
        keys or more (none when it cannot be cut so).

        A bounded range is cut into ``parts`` equal parts; the density of keys is the page's
        (its keys over the span from its first key to its last). The open-ended last range is
        cut where the listing so far would end if doubled: the end of the key space is unknown,
        and a cut past it costs a request that finds nothing.
        """
        last = page[-1].url
        width = max(len(i.url) for i in (page[0], page[-1])) - len(self.prefix) + 3
        width = max(width, len(self.first) + 3, len(high or "") - len(self.prefix) + 3)
        lo = self.value(last, width)
        span = lo - self.value(page[0].url, width)
        if span <= 0:
            return []
        if high is None:
            start = self.value(self.prefix + self.first, width)
            cut = self.key(lo + max(lo - start, min_keys * span // len(page)), width)
            return [cut] if cut > last else []
        hi = self.value(high, width)
        if hi <= lo:
            return []
        parts = min(parts, (hi - lo) * len(page) // (span * max(1, min_keys)))
        if parts < 2:
            return []
        out: list[str] = []
        for k in range(1, parts):
            key = self.key(lo + (hi - lo) * k // parts, width)
            if key > (out[-1] if out else last) and key < high:
                out.append(key)
        return out


def _highest(c: str) -> str:
    for lo, hi in (("0", "9"), ("a", "z"), ("A", "Z")):
        if lo <= c <= hi:
            return hi
    return c


def list_parallel(backend: Backend, url: str, *, concurrency: int = 8, max_cuts: int | None = None,
                  min_pages: int = 100, pages_per_cut: int = 10) -> Listing:
    """List ``url`` with up to ``concurrency`` chains of pages in flight (sorted by URL).

    Args:
        backend: the backend; one serial chain unless ``backend.pages_from_any_key``.
        url: the prefix.
        concurrency: requests in flight at most.
        max_cuts: cuts of the key space at most (default ``2 * concurrency``).
        min_pages: a range is cut only into parts estimated to hold this many pages each: a
            cut may cost one request more than a serial listing, so 100 keeps that near 1%.
        pages_per_cut: a cut is allowed once per this many requests made so far (cuts at
            directory boundaries excepted), which bounds the extra requests of a listing whose
            size the estimates get wrong to ``1 / pages_per_cut`` of it.
    """
    if concurrency < 1:
        raise ConfigError(f"listing concurrency must be >= 1, got {concurrency!r}")
    first, more = backend.list_page(url, start_after=None)
    if not more:
        return Listing(first, 1)
    if concurrency == 1 or not backend.pages_from_any_key:
        rest = _serial(backend, url, first[-1].url)
        return Listing(first + rest.objects, 1 + rest.requests)
    cuts = 2 * concurrency if max_cuts is None else max_cuts
    # one delimiter request for the "directories", when the first page shows there are some
    nested = any("/" in i.url[len(url):] for i in first)
    dirs = [d for d in backend.list_prefixes(url) if d > first[-1].url] if nested else []
    return _Parallel(backend, url, first, concurrency, cuts, min_pages * len(first), dirs,
                     1 + nested, pages_per_cut).run()


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
                 max_cuts: int, min_keys: int, dirs: list[str], requests: int,
                 pages_per_cut: int) -> None:
        self.backend, self.url, self.first = backend, url, first
        self.concurrency, self.cuts_left, self.min_keys = concurrency, max_cuts, min_keys
        self.cutter = _Cutter([i.url[len(url):] for i in first], url)
        self.lock = threading.Lock()
        # "directories" give the first cuts: chains start at evenly spaced directory boundaries
        step = len(dirs) / concurrency
        bounds = sorted({dirs[int(k * step)] for k in range(1, concurrency)}) if len(dirs) > 1 else []
        edges = [first[-1].url, *bounds]
        self.ranges = [_Range(lo, hi) for lo, hi in zip(edges, [*bounds, None])]
        self.cuts_left -= len(bounds)
        self.requests = requests  # the first page, and the directory listing if there was one
        self.active = 0
        self.futures: list[Future[None]] = []
        self.pool: ThreadPoolExecutor | None = None
        self.cuts_made = 0
        self.pages_per_cut = pages_per_cut

    def run(self) -> Listing:
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="pipeflow-list") as pool:
            self.pool = pool
            with self.lock:
                for rng in self.ranges:
                    self._start(rng)
                if len(self.ranges) == 1:
                    self._maybe_cut(self.ranges[0], self.first)
            while True:
                with self.lock:  # a chain registers the chains it cuts off before it ends
                    pending = [f for f in self.futures if not f.done()]
                if not pending:
                    break
                wait(pending, return_when=FIRST_COMPLETED)
            for fut in self.futures:
                fut.result()  # a failed request fails the listing, with its typed error
        return Listing(self._joined(), self.requests, len(self.ranges))

    def _start(self, rng: _Range) -> None:
        assert self.pool is not None
        self.active += 1
        self.futures.append(self.pool.submit(self._walk, rng))

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
                    self._maybe_cut(rng, page)
        finally:
            with self.lock:
                self.active -= 1

    def _maybe_cut(self, rng: _Range, page: list[ObjectInfo]) -> None:
        """Share what ``rng`` has left after ``page`` with new chains, in equal parts, while
        threads are free and each part is estimated to hold ``min_keys`` keys."""
        # a cut may cost a request: allow one per `pages_per_cut` pages listed so far, so a
        # small listing stays one chain and a large one spreads as it proves large
        earned = self.requests // self.pages_per_cut - self.cuts_made
        free = min(self.concurrency - self.active, self.cuts_left, earned)
        if free <= 0:
            return
        bounds = self.cutter.cuts(page, rng.high, self.min_keys, 2)
        if not bounds:
            return
        parts = [_Range(lo, hi) for lo, hi in zip(bounds, [*bounds[1:], rng.high])]
        rng.high = bounds[0]
        self.cuts_left -= len(parts)
        self.cuts_made += len(parts)
        at = self.ranges.index(rng) + 1
        self.ranges[at:at] = parts
        for part in parts:
            self._start(part)

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

