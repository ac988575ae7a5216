"""Listing a large prefix as several chains of pages at once.

A store lists 1,000 keys a request, each request naming where the previous one stopped, so a
million keys are a thousand round trips in a row. When a backend can start a page at any key
(:attr:`~pipeflow.backends.base.Backend.pages_from_any_key`: S3's ``StartAfter``), the key space
can be cut into ranges listed concurrently. Nothing says where the keys are, so the cuts are
made as the listing goes: a chain that still has work when a thread is free gives part of it to
a new chain. Each range is the half-open interval ``(low, high]`` of URLs, so every key falls in
exactly one range; the ranges are concatenated in order (and checked to be strictly increasing).

Cost: a range of ``n`` keys takes at most ``floor(n / 1000) + 1`` requests (one for an empty
one), so a cut costs at most one request over ``ceil(N / 1000)``: the short last page of the
range it shortens, or a probe past the end of the keys. Cuts are paid for out of a budget of one
request per ``pages_per_cut`` (100) pages of keys found so far: a cut is made only when the
ranges that may still cost one (:meth:`_Parallel._may_cost`) fit in it, so a listing under 10^5
keys is a single chain. (The exception: numbers found without a gap, then gaps; the ranges cut
on page boundaries and open when the first gap shows may cost one request each, one a thread at
most.) Where the first page's keys are consecutive numbers in a fixed width
(``train/0000000.jpg``, ``train/0000001.jpg``...), cuts fall on what would be page boundaries,
and a range that ends on its last key costs nothing.

Other keys (hashes, keys in directories) are spread by a guess. When the keys found pay for a
first cut, the characters seen at each position of a sample of them give the key space (hex
digits, digits, ``c`` then three digits then ``/``...), and how densely the keys found fill it
gives a guess of how many there are. That cut tests the guess: it starts a chain near the end of
the key space, whose first page is a page of the listing whatever it finds. A full page there
trusts the guess, which then pays, once, for cuts that give every thread a chain of an equal
share: as many as three quarters of the guess pays for, ``concurrency - 1`` at most. Later cuts
are paid by the keys found. So the listing stays within 1% whenever the keys continue as spread
as the first ones; keys that stop following the guess after its probe (a dense start and a block
where the probe lands, nothing between) cost at most ``concurrency - 1`` requests over it.

Keys numbered with gaps fill the space of their digits densely up to where they stop, so the
guess would expect far too many; where they stop is searched instead (:meth:`_Parallel._gallop`):
probes three, then nine times as far from the first number as the keys found reach, each a chain
whose full page, as dense as the first keys, vouches for the keys below it and pays for the next
probe, then for cuts in equal spans of numbers of the ranges known to hold keys. The same
``concurrency - 1`` limit holds for keys placed to mislead it; the probes are about
``log3(concurrency) + 1`` whatever the number of keys.
Memory is the listing itself. Backends without ``pages_from_any_key`` list as one serial chain
(:meth:`~pipeflow.backends.base.Backend.list`).
"""

from __future__ import annotations

import bisect
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace

from ..errors import BackendError, ConfigError
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
    requests: int = 0
    at_end: bool = False  # ended where the store's keys end (it holds the last key)
    aligned: bool = False  # both ends on page boundaries of consecutively numbered keys
    left: float = float("inf")  # keys estimated still to list (updated after each page)


#: Character classes keys are commonly written in (digits, hex, base 36, base 62, URL-safe base
#: 64), each in byte order; a position of a key is assumed to take any character of the smallest
#: class that holds every character seen where keys differ.
_CLASSES = (
    "0123456789",
    "0123456789abcdef",
    "0123456789ABCDEF",
    "0123456789abcdefghijklmnopqrstuvwxyz",
    "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
    "-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz",
)


def _alphabets(sample: list[str]) -> list[str]:
    """Per position, the characters a key may hold there, learned from ``sample``.

    Where keys differ, the characters seen pick a class (hex for ``3fa9...``, digits for
    ``c017/00042.jpg``); a position holding only characters of that class takes the whole class
    (``0`` in every key's first place of a hex listing may still become ``f``), and any other
    position keeps what was seen (the ``c`` and ``/`` of ``c017/``, the ``.jpg``), so a cut never
    lands in a span no key can be in, such as ``c4z/`` between directories named by digits."""
    length = max(map(len, sample), default=0)
    seen = ["".join(sorted({k[i] for k in sample if i < len(k)})) for i in range(length)]
    varying = {c for chars in seen if len(chars) > 1 for c in chars}
    cls = next((c for c in _CLASSES if varying and varying <= set(c)), None)
    return [cls if cls is not None and set(chars) <= set(cls) else chars for chars in seen]


class _Cutter:
    """Keys as numbers, each position counted in the characters keys hold there, to estimate how
    many keys lie between two keys and where to cut between them."""

    def __init__(self, sample: list[str], prefix: str, page_len: int | None = None) -> None:
        self.numbered = _Numbered.of([prefix + k for k in sample])
        # the same form with gaps allowed: cuts between numbers are made in integers, where
        # keys are as dense as their numbers (character positions would see a gap at each carry)
        self.form = _Numbered.loose([prefix + k for k in sample])
        self.per_number: float | None = None  # keys a number, once trusted (numbered keys)
        self.page_len = max(1, page_len or len(sample))
        self.alphabets = _alphabets(sample)
        self.fallback = "".join(sorted({c for key in sample for c in key})) or "0"
        self.prefix = prefix
        # the highest key in these alphabets, as long as the sample's last key ("0000999.jpg"
        # -> "9999999.jpg", "c000/0042.jpg" -> "c999/9999.jpg")
        last = sample[-1] if sample else ""
        self.top = "".join(self._alpha(i)[-1] for i in range(len(last)))
        self.first = sample[0] if sample else ""  # the listing's first key, after the prefix
        self.width = len(self.top) + 1
        self.density: float | None = None  # keys a unit of value(., width), once trusted

    def trust(self, keys: float) -> None:
        """Estimate keys between two keys from ``keys`` spread evenly from the first key to the
        highest, not from the density of a page (which, for keys in directories, is the density
        inside one directory)."""
        span = self.value(None, self.width) - self.value(self.prefix + self.first, self.width)
        self.density = keys / max(1, span)

    def _alpha(self, i: int) -> str:
        return self.alphabets[i] if i < len(self.alphabets) else self.fallback

    def value(self, url: str | None, width: int) -> int:
        """``url`` (under the prefix; None: the highest key in these alphabets) as a number of
        ``width`` digits; digit 0 is "no character" (a shorter key sorts first)."""
        key = (self.top or self.fallback[-1] * width) if url is None else url[len(self.prefix):]
        number = 0
        for i in range(width):
            alpha = self._alpha(i)
            digit = min(bisect.bisect_left(alpha, key[i]), len(alpha) - 1) + 1 if i < len(key) else 0
            number = number * (len(alpha) + 1) + digit
        return number

    def key(self, number: int, width: int) -> str:
        digits = []
        for i in reversed(range(width)):
            number, d = divmod(number, len(self._alpha(i)) + 1)
            digits.append(d)
        digits.reverse()
        while digits and digits[-1] == 0:
            digits.pop()  # "no character": a shorter key
        return self.prefix + "".join(self._alpha(i)[max(d, 1) - 1] for i, d in enumerate(digits))

    def estimate(self, highest: str, found: int) -> float:
        """Keys in the whole listing if they go on to the highest key of these alphabets as
        densely as the ``found`` keys from the first one to ``highest``."""
        width = max(len(self.top), len(highest) - len(self.prefix), len(self.first)) + 1
        lo = self.value(self.prefix + self.first, width)
        mid, hi = self.value(highest, width), self.value(None, width)
        if not lo < mid < hi:
            return float(found)
        return found * (hi - lo) / (mid - lo)

    def toward_end(self, after: str, share: float) -> str | None:
        """A key ``share`` of the way from ``after`` to the highest key of these alphabets
        (None: none between them)."""
        width = max(len(self.top), len(after) - len(self.prefix)) + 1
        lo, hi = self.value(after, width), self.value(None, width)
        cut = self.key(lo + int((hi - lo) * share), width)
        return cut if after < cut < self.prefix + self.top else None

    def cuts(self, page: list[ObjectInfo], high: str | None, min_keys: int,
             parts: int) -> tuple[list[str], bool]:
        """Keys that cut ``(last key of page, high]``, each part estimated to hold ``min_keys``
        keys or more (none when it cannot be cut so), and whether they fall on page boundaries
        of consecutively numbered keys.

        A bounded range is cut into ``parts`` equal parts; the density of keys is the page's
        (its keys over the span from its first key to its last). The open-ended last range is
        cut where the listing so far would end if doubled: the end of the key space is unknown,
        and a cut past it costs a request that finds nothing (with a trusted guess of the key
        count, the caller passes the highest key the guess expects as ``high``).
        """
        exact = self._numbered_cuts(page, high, min_keys, parts)
        if exact is not None:
            return exact, True
        between = self._form_cuts(page, high, min_keys, parts)
        if between is not None:
            return between, False
        return self._spread_cuts(page, high, min_keys, parts), False

    def left(self, page: list[ObjectInfo], high: str | None) -> float:
        """Keys estimated in ``(last key of page, high]`` at the page's density, or the trusted
        one (the open-ended range: unknown, as many as can be)."""
        if high is None:
            return float("inf")
        numbers = self._numbers(page, high)
        if numbers is not None:
            first, last, top = numbers
            return max(0, top - last) * (self.per_number or len(page) / (last - first + 1))
        if self.density is not None:
            lo, hi = self.value(page[-1].url, self.width), self.value(high, self.width)
            return max(0, hi - lo) * self.density
        width = max(len(page[-1].url), len(page[0].url), len(high)) - len(self.prefix) + 3
        lo, first, hi = (self.value(u, width) for u in (page[-1].url, page[0].url, high))
        return (hi - lo) * len(page) / max(1, lo - first)

    def _spread_cuts(self, page: list[ObjectInfo], high: str | None, min_keys: int,
                     parts: int) -> list[str]:
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
        parts = min(parts, int(self.left(page, high) // max(1, min_keys)))
        if parts < 2:
            return []
        out: list[str] = []
        for k in range(1, parts):
            key = self.key(lo + (hi - lo) * k // parts, width)
            if key > (out[-1] if out else last) and key < high:
                out.append(key)
        return out

    def _numbers(self, page: list[ObjectInfo], high: str | None) -> tuple[int, int, int] | None:
        """The numbers of the page's first and last keys and of ``high``, when all three are
        written in the numbered form (None otherwise, or for an open end)."""
        form = self.form
        if form is None or high is None:
            return None
        numbers = (form.number(page[0].url), form.number(page[-1].url), form.number(high))
        first, last, top = numbers
        if first is None or last is None or top is None or last < first:
            return None
        return first, last, top

    def _form_cuts(self, page: list[ObjectInfo], high: str | None, min_keys: int,
                   parts: int) -> list[str] | None:
        """Cuts of ``(last key of page, high]`` in equal spans of numbers, for numbered keys
        with gaps (None: not so numbered); the open end is cut where the listing so far would
        end if doubled, as :meth:`_spread_cuts` does."""
        form = self.form
        if form is None:
            return None
        if high is None:
            first, last = form.number(page[0].url), form.number(page[-1].url)
            if first is None or last is None or last < first:
                return None
            per = self.per_number or len(page) / (last - first + 1)
            ahead = max(last - form.start + 1, int(min_keys / per))
            cut = form.key(last + ahead)
            return [cut] if cut is not None else []
        numbers = self._numbers(page, high)
        if numbers is None:
            return None
        _, last, top = numbers
        parts = min(parts, int(self.left(page, high) // max(1, min_keys)))
        if parts < 2:
            return []
        keys = [form.key(last + (top - last) * k // parts) for k in range(1, parts)]
        out: list[str] = []
        for key in keys:
            if key is not None and key > (out[-1] if out else page[-1].url) and key < high:
                out.append(key)
        return out

    def on_boundary(self, low: str, high: str | None) -> bool:
        """Whether ``(low, high]`` starts and ends where pages of consecutive numbers end."""
        form = self.numbered
        if form is None or high is None:
            return False
        ends = [form.number(low), form.number(high)]
        return all(n is not None and (n - form.start + 1) % self.page_len == 0 for n in ends)

    def follows(self, after: str, page: list[ObjectInfo]) -> bool:
        """Whether ``page`` holds the numbers right after ``after``'s, with no gap."""
        form = self.numbered
        if form is None or not page:
            return form is not None
        first, last = form.number(page[0].url), form.number(page[-1].url)
        before = form.number(after)
        return (first is not None and last is not None and before is not None
                and first == before + 1 and last - first == len(page) - 1)

    def _numbered_cuts(self, page: list[ObjectInfo], high: str | None, min_keys: int,
                       parts: int) -> list[str] | None:
        """Cuts a whole number of pages apart, for consecutively numbered keys (None: the keys
        are not numbered so): a range then ends on what would have been the end of a page."""
        form = self.numbered
        last = form.number(page[-1].url) if form else None
        if form is None or last is None:
            return None
        step = self.page_len
        if high is None:
            ahead = max(last - form.start + 1, min_keys)
            cut = form.key(last + -(-ahead // step) * step)
            return [cut] if cut is not None else []
        top = form.number(high)
        if top is None:
            return None
        pages = (top - last) // step
        parts = min(parts, pages * step // max(1, min_keys))
        if parts < 2:
            return []
        keys = [form.key(last + pages * k // parts * step) for k in range(1, parts)]
        return [k for k in keys if k is not None and page[-1].url < k < high]


@dataclass(frozen=True)
class _Numbered:
    """URLs made of a fixed head, a number of a fixed width and a fixed tail, as many datasets
    name their samples; found in the first page only when its keys are consecutive numbers."""

    head: str
    width: int
    tail: str
    start: int

    @classmethod
    def of(cls, urls: list[str]) -> _Numbered | None:
        """The form of ``urls`` when they are consecutive numbers (no gap)."""
        form = cls.loose(urls)
        if form is None or any(form.number(u) != form.start + i for i, u in enumerate(urls)):
            return None
        return form

    @classmethod
    def loose(cls, urls: list[str]) -> _Numbered | None:
        """The form of ``urls`` when every one is the same head, a number of the same width and
        the same tail, gaps allowed (None otherwise)."""
        if len(urls) < 2 or len(urls[0]) != len(urls[-1]):
            return None
        a, b = urls[0], urls[-1]
        differ = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        if not differ:
            return None
        lo, hi = differ[0], differ[-1] + 1
        while lo > 0 and a[lo - 1].isdigit():
            lo -= 1
        while hi < len(a) and a[hi].isdigit():
            hi += 1
        if not (a[lo:hi].isdigit() and b[lo:hi].isdigit()):
            return None
        form = cls(a[:lo], hi - lo, a[hi:], int(a[lo:hi]))
        if any(form.number(u) is None for u in urls):
            return None
        return form

    def number(self, url: str) -> int | None:
        middle = url[len(self.head):len(url) - len(self.tail)]
        if (len(middle) != self.width or not middle.isdigit() or not url.startswith(self.head)
                or not url.endswith(self.tail)):
            return None
        return int(middle)

    def key(self, number: int) -> str | None:
        text = f"{number:0{self.width}d}"
        return self.head + text + self.tail if len(text) == self.width else None


def list_parallel(backend: Backend, url: str, *, concurrency: int = 8, max_cuts: int | None = None,
                  min_pages: int = 10, pages_per_cut: int = 100) -> Listing:
    """List ``url`` with up to ``concurrency`` chains of pages in flight (sorted by URL).

    Args:
        backend: the backend; one serial chain unless ``backend.pages_from_any_key``.
        url: the prefix.
        concurrency: requests in flight at most.
        max_cuts: cuts of the key space at most (default ``16 * concurrency``).
        min_pages: a range is cut only into parts estimated to hold this many pages each.
        pages_per_cut: the budget: a listing sends at most one request more than a serial
            chain per this many pages of keys it has found (100: at most 1% more). A cut is
            made only when the ranges that could still cost a request fit in it.
    """
    if concurrency < 1:
        raise ConfigError(f"listing concurrency must be >= 1, got {concurrency!r}")
    if pages_per_cut < 1:
        raise ConfigError(f"pages_per_cut must be >= 1, got {pages_per_cut!r}")
    first, more = backend.list_page(url, start_after=None)
    if not more:
        return Listing(first, 1)
    if concurrency == 1 or not backend.pages_from_any_key:
        rest = _serial(backend, url, first[-1].url)
        return Listing(first + rest.objects, 1 + rest.requests)
    _check_order(url, first, None)
    cuts = 16 * concurrency if max_cuts is None else max_cuts
    return _Parallel(backend, url, first, concurrency, cuts, min_pages * len(first),
                     pages_per_cut).run()


def _check_order(url: str, page: list[ObjectInfo], after: str | None) -> None:
    """Cuts are placed by comparing URLs, so a store that lists in another order (or repeats
    keys) would have keys fall outside their range: refused with a typed error, never dropped."""
    last = after
    for info in page:
        if last is not None and info.url <= last:
            raise BackendError(
                f"listing {url}: the store returned {info.url!r} after {last!r}; a parallel "
                "listing needs keys in byte order (list_objects(..., threads=1) lists serially)")
        last = info.url


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
                 max_cuts: int, min_keys: int, pages_per_cut: int) -> None:
        self.backend, self.url, self.first = backend, url, first
        self.concurrency, self.cuts_left, self.min_keys = concurrency, max_cuts, min_keys
        self.cutter = _Cutter([i.url[len(url):] for i in first], url)
        self.lock = threading.Lock()
        self.ranges = [_Range(first[-1].url, None)]
        self.regular = self.cutter.numbered is not None  # every page so far consecutive
        self.highest = first[-1].url  # the highest key seen: keys exist up to it
        self.requests = 1  # the first page
        self.kept = len(first)  # keys found so far: what the budget is earned by
        self.keys_per_request = len(first) * pages_per_cut
        self.active = 0
        # the guess of how many keys there are, from how densely the first ones are spread
        # (_guess): untested, pending (its probe is in flight), trusted or refuted
        self.guess = "untested"
        self.predicted = 0.0
        self.allowance = 0  # cuts the trusted guess may pay for before the keys found do
        self.spending = False  # the allowance is still to be spent on one cut
        self.ceiling: str | None = None  # no key is past it (a probe found none there)
        self.wasted = 0  # requests of probes that found nothing, no longer in self.ranges
        self.probe: _Range | None = None
        self.end: str | None = None  # the highest key the guess expects (trusted only)
        # numbered keys (_gallop): keys a number in the first ones, the lowest a probe's page
        # showed, and the number the probe in flight starts after
        self.searching = False
        self.per_number = 0.0
        self.thinnest = 0.0
        self.probe_at = 0
        self.vouched = (0, 0)  # (keys, number): keys found up to that number when it began
        self.futures: list[Future[None]] = []
        self.pool: ThreadPoolExecutor | None = None

    def run(self) -> Listing:
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="pipeflow-list") as pool:
            self.pool = pool
            with self.lock:
                self._start(self.ranges[0])
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
                _check_order(self.url, page, after)
                with self.lock:
                    self.requests += 1
                    rng.requests += 1
                    if page and page[-1].url > self.highest:
                        self.highest = page[-1].url
                    high = rng.high  # may have been lowered by a cut
                    keep = [i for i in page if high is None or i.url <= high]
                    rng.found += keep
                    self.kept += len(keep)
                    if rng is self.probe and self.guess == "pending":
                        (self._judge_number if self.searching else self._judge)(page, more)
                    if self.regular and not self.cutter.follows(after, keep):
                        self.regular = False  # a gap: aligned ranges may cost a request too
                    # a page that ends on the range's last key ends the range without a request
                    # that would only find the next range's keys
                    ends = bool(keep) and keep[-1].url == high
                    if not more or len(keep) < len(page) or not page or ends:
                        rng.done, rng.at_end = True, not more and len(keep) == len(page) > 0
                        return
                    after = page[-1].url
                    rng.left = self.cutter.left(page, rng.high if rng.high else self.end)
                    self._maybe_cut(rng, page)
        finally:
            with self.lock:
                self.active -= 1

    def _may_cost(self, ranges: list[_Range]) -> int:
        """How many more requests than ``ceil(N / page)`` the listing may take with these ranges.

        A range of ``n`` keys takes ``ceil(n / page)`` requests when it ends where the store's
        keys end, ``n / page`` when it ends on a whole page, and ``floor(n / page) + 1`` when a
        page crosses its end (one request found nothing, for an empty one): so each range may
        cost one, except those that ended on a whole page or at the end of the keys; the last
        range once it has found a key (it will end at the end of the keys); and, while every
        page so far held consecutive numbers, those that start and end on page boundaries
        below a key seen. The last range before an open-ended one that has found nothing and
        that range cannot both cost one: when the last one is empty, the one before holds the
        last key."""
        page = len(self.first)
        costs = [self._cost(r, page, first=i == 0) for i, r in enumerate(ranges)]
        if len(ranges) > 1 and costs[-1] and not ranges[-2].done:
            costs[-2] = 0
        return sum(costs) + self.wasted

    def _cost(self, r: _Range, page: int, *, first: bool) -> int:
        if r.done:
            return int(not (r.at_end or len(r.found) == r.requests * page))
        if r.high is None:
            return int(not (r.found or first))
        return int(not (r.aligned and self.regular and r.high <= self.highest))

    def _maybe_cut(self, rng: _Range, page: list[ObjectInfo]) -> None:
        """Share what ``rng`` has left after ``page`` with new chains, in equal parts, while
        threads are free, each part is estimated to hold ``min_keys``, and the budget allows
        (cuts on page boundaries below a key seen, while the numbers run on, cost nothing)."""
        threads = min(self.concurrency - self.active, self.cuts_left)
        if threads <= 0 or (self.searching and self.guess == "pending"):
            return
        earned = self._budget()
        if (self.guess == "untested" and rng.high is None and earned >= 1 and not self.regular):
            self._guess(rng, page)
            return
        now = self._may_cost(self.ranges)
        biggest = rng.left >= max(r.left for r in self.ranges if not r.done)
        for parts_wanted in range(1 + threads, 1, -1):
            bounds, aligned = self.cutter.cuts(page, rng.high or self.end, self.min_keys,
                                               parts_wanted)
            bounds = [b for b in bounds if self.ceiling is None or b < self.ceiling]
            if not bounds:
                return
            plan = self._planned(rng, page, bounds, aligned)
            cost = self._may_cost(plan)
            # a cut that costs nothing is always made; one that may cost a request must fit in
            # the budget, and goes to the range with the most left to list
            if cost <= now or (cost <= earned and biggest):
                self._commit(rng, plan)
                if self.spending:  # the cut the guess paid for: the allowance is what it took
                    self.allowance, self.spending = max(cost, now), False
                return
            if now >= earned or not biggest:
                return

    def _budget(self) -> int:
        """Requests the listing may spend on cuts: one per ``pages_per_cut`` pages of keys found,
        or what the one cut made on a trusted guess committed (:meth:`_judge`), if more."""
        return max(self.kept // self.keys_per_request, self.allowance)

    def _guess(self, rng: _Range, page: list[ObjectInfo]) -> None:
        """Once the keys found pay for one cut: guess how many keys there are from how densely
        the keys found so far fill the key space (learned from a sample of them), and test the
        guess with that one cut, placed to leave the new chain the last ``1 / concurrency`` of
        the keys it expects: near the end of the key space, where a wrong guess shows, and where
        the chain that made the cut, trusting the guess, cuts what it has left into equal parts
        for the other threads. The new chain's first page is a page of the listing either way;
        the guess is trusted only when that page is full (keys go on there as they did here)."""
        self.guess = "refuted"  # unless the probe below is made
        found = [*self.first, *(i for r in self.ranges for i in r.found)]
        step = max(1, len(found) // 2000)
        sample = [i.url[len(self.url):] for i in found[::step]] + [found[-1].url[len(self.url):]]
        cutter = _Cutter(sample, self.url, page_len=len(self.first))
        if cutter.form is not None:
            self.cutter = cutter
            self._gallop(rng, page)
            return
        estimate = cutter.estimate(self.highest, self.kept)
        cut = cutter.toward_end(page[-1].url, 1 - 1 / self.concurrency)
        if cut is None or estimate < 2 * self.kept:
            return
        self.cutter = cutter
        plan = self._planned(rng, page, [cut], False)
        if self._may_cost(plan) > self._budget():
            return
        self._commit(rng, plan)
        self.guess, self.predicted, self.probe = "pending", estimate, plan[-1]

    def _judge(self, page: list[ObjectInfo], more: bool) -> None:
        """The probe's first page: full, with more to come, trusts the guess. Trusted, it pays
        for the cuts that give every thread a chain at once, as many as three quarters of the
        keys it expects (less three standard deviations of a count of keys: about Poisson) pay
        for, ``concurrency - 1`` at most; from then on, cuts are paid by the keys found."""
        if not (more and len(page) == len(self.first)):
            self.guess = "refuted"
            if not page:
                self._unprobe()
            return
        self.guess, self.end = "trusted", self.url + self.cutter.top
        self.cutter.trust(self.predicted)
        sure = 0.75 * self.predicted * (1 - 3 / self.kept ** 0.5)
        earned = self.kept // self.keys_per_request
        self.allowance = min(int(sure) // self.keys_per_request, earned + self.concurrency - 1)
        self.spending = True

    def _gallop(self, rng: _Range, page: list[ObjectInfo]) -> None:
        """Numbered keys (``train/0004711.jpg``) fill the space of their digits densely up to
        where they stop, so the guess from the key space would expect ten times too many. The
        end is found by galloping instead: a probe three times as far from the first number as
        the keys found reach, then three times further while each probe's page is full and as
        dense as the first keys. Each such page is the first page of a chain that goes on, and
        vouches for the keys up to it (at the lowest density seen), which pays for the next
        probe and then for the cuts that give every thread a part of the ranges known to hold
        keys (:meth:`_settle`). A probe that finds nothing costs a request; one whose page is
        thinner or further than expected stops the search (it is a chain all the same)."""
        form = self.cutter.form
        high = form.number(self.highest) if form else None
        if form is None or high is None or high < form.start:
            return
        self.searching, self.vouched = True, (self.kept, high)
        self.per_number = self.thinnest = self.kept / (high - form.start + 1)
        self.cutter.per_number = self.per_number
        self._probe_number(rng, page, form.start + 3 * (high - form.start + 1))

    def _probe_number(self, rng: _Range, page: list[ObjectInfo], at: int) -> None:
        """Cut the open-ended ``rng`` after number ``at`` (no further than ``(concurrency - 1) /
        concurrency`` of the way to the highest number of the form), if the budget allows."""
        form = self.cutter.form
        assert form is not None
        last = form.number(page[-1].url)
        top = 10 ** form.width - 1
        if last is None:
            return self._settle(freeing=0)
        at = min(at, last + (top - last) * (self.concurrency - 1) // self.concurrency)
        cut = form.key(at)
        if cut is None or cut <= page[-1].url or (self.ceiling and cut >= self.ceiling):
            return self._settle(freeing=0)
        plan = self._planned(rng, page, [cut], False)
        if self._may_cost(plan) > self._budget():
            return self._settle(freeing=0)
        self._commit(rng, plan)
        self.guess, self.probe_at = "pending", at
        self.probe = self.ranges[self.ranges.index(rng) + 1]

    def _judge_number(self, page: list[ObjectInfo], more: bool) -> None:
        """A gallop probe's first page (:meth:`_gallop`)."""
        form, at = self.cutter.form, self.probe_at
        assert form is not None and self.probe is not None
        if not page:  # no key past ``at``: the range before is the last again
            self._unprobe()
            return self._settle(freeing=1)
        first, last = form.number(page[0].url), form.number(page[-1].url)
        full = more and len(page) == len(self.first)
        if first is None or last is None or not full:
            return self._settle(freeing=0)  # other keys, or the last page of the listing
        dense = len(page) / (last - first + 1)
        # as dense as the first keys, and starting about where they would
        if dense < 0.8 * self.per_number or (first - at) * self.per_number > len(page):
            return self._settle(freeing=0)
        self.thinnest = min(self.thinnest, dense)
        keys, high = self.vouched
        sure = (keys + self.thinnest * (at - high)) * (1 - 3 / self.kept ** 0.5)
        earned = self.kept // self.keys_per_request
        most = earned + self.concurrency - 1
        self.allowance = max(self.allowance, min(int(sure) // self.keys_per_request, most))
        if self.allowance >= most:
            return self._settle(freeing=0)
        self._probe_number(self.probe, page, form.start + 3 * (at - form.start))

    def _settle(self, *, freeing: int) -> None:
        """The search is over: what the probes vouched for pays for cuts of the ranges known to
        hold keys (:meth:`_spread`); later cuts are paid by the keys found."""
        self.guess = "trusted" if self.allowance else "refuted"
        if self.ceiling is not None:
            self.end = self.ceiling  # no key is past it
        if self.allowance:
            self._spread(freeing)

    def _unprobe(self) -> None:
        """The probe found no key: there are none past its start, so the range before it is
        the last one again, cut as an open-ended range is (where the listing so far would end
        if doubled), never at or past the probe's start. The probe's request stays counted."""
        assert self.probe is not None
        at = self.ranges.index(self.probe)
        self.ranges[at - 1].high = None
        self.ceiling = self.probe.low
        del self.ranges[at]
        self.wasted += 1

    def _spread(self, freeing: int) -> None:
        """Give each free thread a part of the bounded ranges still to list, more parts to the
        longer ones (in numbers; they are about equally dense), as many as the budget allows.
        The open-ended last range stays one chain: how far it goes is not known."""
        form = self.cutter.form
        assert form is not None
        spans: dict[int, tuple[_Range, int, int]] = {}
        for rng in self.ranges:
            lo = form.number(rng.found[-1].url if rng.found else rng.low)
            hi = form.number(rng.high) if rng.high is not None else None
            if not rng.done and lo is not None and hi is not None and hi > lo:
                spans[id(rng)] = (rng, lo, hi)
        if not spans:
            return
        parts = dict.fromkeys(spans, 1)

        def each(k: int, n: int) -> float:  # numbers a part of spans[k] if cut in n
            return (spans[k][2] - spans[k][1]) / n

        for _ in range(self.concurrency - self.active + freeing):
            k = max(parts, key=lambda k: each(k, parts[k]))
            if each(k, parts[k] + 1) * self.per_number < self.min_keys:
                break
            parts[k] += 1
        while any(n > 1 for n in parts.values()):
            plan = self.ranges
            for k, n in parts.items():
                plan = self._split(plan, spans[k], n)
            if self._may_cost(plan) <= self._budget():
                break
            k = min((k for k in parts if parts[k] > 1), key=lambda k: each(k, parts[k] - 1))
            parts[k] -= 1
        for k, n in parts.items():
            if n > 1:
                self._commit(spans[k][0], self._split(self.ranges, spans[k], n))

    def _split(self, ranges: list[_Range], span: tuple[_Range, int, int], n: int,
               ) -> list[_Range]:
        """``ranges`` with ``span``'s range cut in ``n`` parts of equal spans of numbers."""
        form = self.cutter.form
        rng, lo, hi = span
        assert form is not None and rng.high is not None
        bounds = [form.key(lo + (hi - lo) * i // n) for i in range(1, n)]
        cuts = sorted({b for b in bounds if b is not None and rng.low < b < rng.high
                       and (not rng.found or b > rng.found[-1].url)})
        if not cuts:
            return ranges
        left = (hi - lo) * self.per_number / (len(cuts) + 1)
        parts = [replace(rng, high=cuts[0], left=left)]
        parts += [_Range(a, b, left=left) for a, b in zip(cuts, [*cuts[1:], rng.high])]
        at = ranges.index(rng)
        return [*ranges[:at], *parts, *ranges[at + 1:]]

    def _planned(self, rng: _Range, page: list[ObjectInfo], bounds: list[str],
                 aligned: bool) -> list[_Range]:
        """The ranges after cutting ``rng`` at ``bounds`` (``rng`` itself replaced by its
        shortened copy, the new ones after it)."""
        share = self.cutter.left(page, rng.high or self.end) / (len(bounds) + 1)
        parts = [replace(rng, high=bounds[0])]
        parts += [_Range(lo, hi) for lo, hi in zip(bounds, [*bounds[1:], rng.high])]
        for part in parts:
            part.aligned = aligned and self.cutter.on_boundary(part.low, part.high)
            part.left = share if part.high is not None or self.end else float("inf")
        at = self.ranges.index(rng)
        return [*self.ranges[:at], *parts, *self.ranges[at + 1:]]

    def _commit(self, rng: _Range, plan: list[_Range]) -> None:
        at = self.ranges.index(rng)
        shortened = plan[at]
        rng.high, rng.aligned, rng.left = shortened.high, shortened.aligned, shortened.left
        added = len(plan) - len(self.ranges)
        parts = plan[at + 1:at + 1 + added]
        self.ranges[at + 1:at + 1] = parts
        self.cuts_left -= len(parts)
        for part in parts:
            self._start(part)

    def _joined(self) -> list[ObjectInfo]:
        """The ranges in order; a key out of order means the store does not list in the byte
        order the cuts assume, so keys may be missing: a typed error, never a silent drop.

        Each range is strictly increasing already (every page was checked against the key it
        started after), so only where ranges meet is checked, and each range is appended
        whole: O(ranges) in Python, the copy at C speed (a loop over 10^6 keys took 0.5 s)."""
        out = list(self.first)
        for rng in self.ranges:
            skip = 0
            while out and skip < len(rng.found) and rng.found[skip].url <= out[-1].url:
                if rng.found[skip].url != out[-1].url:
                    raise BackendError(
                        f"listing {self.url}: the store returned {rng.found[skip].url!r} after "
                        f"{out[-1].url!r}; a parallel listing needs keys in byte order "
                        "(list_objects(..., threads=1))")
                skip += 1  # ranges meet at a boundary key: never twice
            out += rng.found[skip:] if skip else rng.found
        return out


def serial_requests(n: int, page: int = 1000) -> int:
    """The requests one serial chain of pages takes for ``n`` keys (at least one)."""
    return max(1, -(-n // page))

