"""The cutting of a listing into ranges (pipeflow/backends/parallel_list.py), over a store that
answers pages from a sorted list in this process: every key exactly once and in order, and never
more requests than a serial chain plus the budget, whatever the keys look like. Over HTTP the
same is checked against the local S3 server in tests/integration/test_listing_scale.py."""

from __future__ import annotations

import base64
import bisect
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pipeflow.backends.base import Backend
from pipeflow.backends.parallel_list import list_parallel, serial_requests
from pipeflow.errors import BackendError, ConfigError
from pipeflow.items import ObjectInfo

PAGE = 10


class SortedStore(Backend):
    """Pages of ``PAGE`` keys from a sorted list, counting requests (``StartAfter`` semantics)."""

    name = "sorted"
    pages_from_any_key = True

    #: keys a page
    page = PAGE

    def __init__(self, keys: list[str]) -> None:
        super().__init__()
        self.keys = sorted(keys)
        self.requests = 0
        self.lock = threading.Lock()

    def list_page(self, url: str, *, start_after: str | None, limit: int = PAGE,
                  ) -> tuple[list[ObjectInfo], bool]:
        with self.lock:
            self.requests += 1
        lo = bisect.bisect_left(self.keys, url)
        hi = bisect.bisect_left(self.keys, url + "\U0010ffff")
        i = lo if start_after is None else max(lo, bisect.bisect_right(self.keys, start_after))
        page = self.keys[i:min(i + self.page, hi)]
        return [ObjectInfo(k, size=1) for k in page], i + self.page < hi

    def open(self, url: str, *, start: int = 0) -> Any:
        raise NotImplementedError

    def list(self, url: str) -> Iterator[ObjectInfo]:
        raise NotImplementedError

    def info(self, url: str) -> ObjectInfo:
        raise NotImplementedError


def _shapes(n: int) -> dict[str, list[str]]:
    rng = random.Random(n)
    return {
        "numbered": [f"s3://b/d/{i:07d}.jpg" for i in range(n)],
        "numbered with gaps": [f"s3://b/d/{i:07d}.jpg" for i in range(n * 11 // 10) if i % 11 != 5],
        "hashed": [f"s3://b/d/{rng.getrandbits(64):016x}.jpg" for _ in range(n)],
        "nested": [f"s3://b/d/c{i % 37:03d}/{i:06d}.png" for i in range(n)],
        "numbered, then others": [f"s3://b/d/{i:07d}.jpg" for i in range(n // 2)]
                                 + [f"s3://b/d/x{rng.getrandbits(32):08x}" for _ in range(n - n // 2)],
        "base64": [f"s3://b/d/{base64.urlsafe_b64encode(rng.randbytes(9)).decode()}.webp"
                   for _ in range(n)],
        "nested, uneven": [f"s3://b/d/{rng.choice('abc')}/{rng.randint(0, 10**rng.randint(1, 6))}-{i}"
                           for i in range(n)],
        "dated": [f"s3://b/d/2024/{i % 12 + 1:02d}/img_{i:06d}.jpg" for i in range(n)],
        # numbered keys that mislead a search for where they stop: dense, then one in 97
        "dense, then sparse": [f"s3://b/d/{i:07d}.jpg" for i in range(n // 2 * 11 // 10) if i % 11]
                              + [f"s3://b/d/{n * 2 + 97 * i:07d}.jpg" for i in range(n - n // 2)],
        # and two runs of numbers far apart
        "two number ranges": [f"s3://b/d/{i:07d}.jpg" for i in range(n // 2)]
                             + [f"s3://b/d/{5 * n + i:07d}.jpg" for i in range(0, 2 * (n - n // 2), 2)],
    }


@pytest.mark.parametrize("n", [95, 2_000, 25_000])
@pytest.mark.parametrize("shape", list(_shapes(10)))
def test_every_key_once_in_order_within_the_budget(n: int, shape: str) -> None:
    keys = sorted(_shapes(n)[shape])
    store = SortedStore([*keys, "s3://b/a", "s3://b/e/after"])  # neighbours outside the prefix
    listing = list_parallel(store, "s3://b/d/", concurrency=8, min_pages=2, pages_per_cut=20)
    assert [i.url for i in listing.objects] == keys
    assert listing.requests == store.requests
    serial = serial_requests(len(keys), PAGE)
    assert serial <= listing.requests <= serial + len(keys) // (PAGE * 20)


class BigPageStore(SortedStore):
    """Pages of 100 keys: enough keys a page for the guess of the key count to be tested."""

    page = 100


@pytest.mark.parametrize("shape", ["hashed", "nested", "base64"])
def test_a_trusted_guess_gives_every_thread_a_chain_within_the_budget(shape: str) -> None:
    # 60,000 keys, 600 pages; a cut is earned per 10 pages (1,000 keys): the guess is made at
    # 1,000 keys, tested by one cut, and trusted for these evenly spread keys
    keys = sorted(set(_shapes(60_000)[shape]))
    store = BigPageStore(keys)
    listing = list_parallel(store, "s3://b/d/", concurrency=8, min_pages=2, pages_per_cut=10)
    assert [i.url for i in listing.objects] == keys
    assert listing.ranges >= 8
    serial = serial_requests(len(keys), 100)
    assert serial <= listing.requests <= serial + len(keys) // 1000


@pytest.mark.parametrize("size", [1_500, 4_000, 13_000, 60_000])
def test_numbers_with_gaps_find_their_end_and_give_every_thread_a_chain(size: int) -> None:
    # one number in 11 missing, from 0 to where they stop: the search gallops (3x, 9x the
    # numbers found) and cuts what its full pages vouch for; every size keeps the bound
    keys = [f"s3://b/d/{i:07d}.jpg" for i in range(size * 11 // 10) if i % 11 != 5]
    store = BigPageStore(keys)
    listing = list_parallel(store, "s3://b/d/", concurrency=8, min_pages=2, pages_per_cut=10)
    assert [i.url for i in listing.objects] == keys
    serial = serial_requests(len(keys), 100)
    assert serial <= listing.requests <= serial + len(keys) // 1000
    if size == 60_000:  # at 1,000 keys found, the probes at 3x and 9x vouch for 8 chains
        assert listing.ranges >= 8


class InFlightStore(BigPageStore):
    """Pages after a short wait, noting the most requests in flight at once while fewer than
    ``early`` keys have been returned."""

    def __init__(self, keys: list[str], early: int) -> None:
        super().__init__(keys)
        self.early, self.returned, self.now, self.most_early = early, 0, 0, 0
        self.counting = threading.Lock()

    def list_page(self, url: str, *, start_after: str | None, limit: int = PAGE,
                  ) -> tuple[list[ObjectInfo], bool]:
        with self.counting:
            self.now += 1
            if self.returned < self.early:
                self.most_early = max(self.most_early, self.now)
        time.sleep(0.002)
        page, more = super().list_page(url, start_after=start_after, limit=limit)
        with self.counting:
            self.now -= 1
            self.returned += len(page)
        return page, more


def test_numbers_with_gaps_give_every_thread_a_chain_soon_after_the_first_cut() -> None:
    # 10^5 keys to 110,000, a cut earned per 10^4 keys found (1%): the search's two probes
    # vouch for the cuts that run 8 chains before 30% of the keys are listed (one cut per 10^4
    # keys found would reach 3 or 4 chains by then), within the budget
    keys = [f"s3://b/d/{i:07d}.jpg" for i in range(110_000) if i % 11 != 5]
    store = InFlightStore(keys, early=30_000)
    listing = list_parallel(store, "s3://b/d/", concurrency=8, pages_per_cut=100)
    assert [i.url for i in listing.objects] == keys
    assert store.most_early == 8
    assert listing.requests <= serial_requests(len(keys), 100) + len(keys) // 10_000


def test_a_guess_its_probe_refutes_costs_what_the_keys_found_pay_for() -> None:
    # numbers from 0 with gaps look spread over the whole 7-digit space; the probe near its end
    # finds nothing, and the listing goes on cutting as the keys found pay for it
    rng = random.Random(5)
    keys = sorted(f"s3://b/d/{i:07d}.jpg" for i in rng.sample(range(40_000), 30_000))
    store = BigPageStore(keys)
    listing = list_parallel(store, "s3://b/d/", concurrency=8, min_pages=2, pages_per_cut=10)
    assert [i.url for i in listing.objects] == keys
    assert listing.requests <= serial_requests(len(keys), 100) + len(keys) // 1000


def test_keys_that_stop_following_the_guess_cost_at_most_a_chain_a_thread_more() -> None:
    # the first keys are spread evenly over the first 1/1000 of a hex space, and a block sits
    # near its end where the probe lands: the guess is trusted and wrong. The cuts it paid for
    # find little; the listing stays exact and at most concurrency - 1 requests over the budget
    rng = random.Random(9)
    space = 16 ** 10
    low = {rng.randrange(space // 1000) for _ in range(3_000)}
    high = {rng.randrange(space * 85 // 100, space) for _ in range(300)}
    keys = sorted(f"s3://b/d/{k:010x}" for k in low | high)
    store = BigPageStore(keys)
    listing = list_parallel(store, "s3://b/d/", concurrency=8, min_pages=1, pages_per_cut=10)
    assert [i.url for i in listing.objects] == keys
    serial = serial_requests(len(keys), 100)
    assert listing.requests <= serial + len(keys) // 1000 + 8 - 1


def test_a_small_listing_is_one_serial_chain() -> None:
    keys = [f"s3://b/d/{i:07d}.jpg" for i in range(99 * PAGE)]  # under the 100 pages of one cut
    listing = list_parallel(SortedStore(keys), "s3://b/d/", concurrency=8)
    assert listing.ranges == 1 and listing.requests == 99


def test_consecutive_numbers_are_cut_on_page_boundaries_at_no_cost() -> None:
    keys = [f"s3://b/d/{i:07d}.jpg" for i in range(30_000)]
    listing = list_parallel(SortedStore(keys), "s3://b/d/", concurrency=8, min_pages=2)
    assert [i.url for i in listing.objects] == keys
    assert listing.ranges > 4
    # past the last key, a probe can find nothing: at most the budget of 30 cuts, in practice a few
    assert 3_000 <= listing.requests <= 3_000 + 30


def test_one_thread_or_a_bad_option() -> None:
    keys = [f"s3://b/d/{i:07d}.jpg" for i in range(5_000)]
    assert list_parallel(SortedStore(keys), "s3://b/d/", concurrency=1).requests == 500
    with pytest.raises(ConfigError):
        list_parallel(SortedStore(keys), "s3://b/d/", concurrency=0)
    with pytest.raises(ConfigError):
        list_parallel(SortedStore(keys), "s3://b/d/", pages_per_cut=0)


def test_random_key_sets_stay_exact_and_within_the_budget() -> None:
    rng = random.Random(7)
    for _ in range(60):
        n, per_cut = rng.randint(50, 6000), rng.choice([1, 2, 5, 20])
        shape = rng.choice(["numbered", "gaps", "hashed", "nested", "dense gaps", "two runs"])
        if shape == "numbered":
            keys = [f"s3://b/d/{i:06d}.x" for i in range(n)]
        elif shape == "gaps":
            keys = [f"s3://b/d/{i:06d}.x" for i in rng.sample(range(n * 3), n)]
        elif shape == "dense gaps":  # numbers that stop, at any of the points a search probes
            keys = [f"s3://b/d/{i:06d}.x" for i in rng.sample(range(n * 10 // 9), n)]
        elif shape == "two runs":
            cut, far = rng.randint(1, n - 1), rng.randint(n, 20 * n)
            keys = [f"s3://b/d/{i:06d}.x" for i in [*range(cut), *range(far, far + n - cut)]]
        elif shape == "hashed":
            keys = [f"s3://b/d/{rng.getrandbits(40):010x}" for _ in range(n)]
        else:
            keys = [f"s3://b/d/{rng.choice('abxyz')}{rng.randint(0, 99)}/{i}" for i in range(n)]
        keys = sorted(set(keys))
        store = SortedStore(keys)
        listing = list_parallel(store, "s3://b/d/", concurrency=rng.choice([2, 8]),
                                min_pages=rng.choice([1, 2, 5]), pages_per_cut=per_cut)
        assert [i.url for i in listing.objects] == keys, (shape, n, per_cut)
        assert listing.requests <= serial_requests(len(keys), PAGE) + len(keys) // (PAGE * per_cut), (
            shape, n, per_cut, listing.requests)


class CaseFoldingStore(SortedStore):
    """A store that lists in its own order (case-insensitive), not in byte order."""

    def __init__(self, keys: list[str]) -> None:
        super().__init__(keys)
        self.keys = sorted(keys, key=str.lower)

    def list_page(self, url: str, *, start_after: str | None, limit: int = PAGE,
                  ) -> tuple[list[ObjectInfo], bool]:
        keys = [k for k in self.keys if k.startswith(url)]
        i = 0 if start_after is None else next(
            (n for n, k in enumerate(keys) if k.lower() > start_after.lower()), len(keys))
        return [ObjectInfo(k, size=1) for k in keys[i:i + PAGE]], i + PAGE < len(keys)


def test_a_store_listing_out_of_byte_order_is_a_typed_error_not_lost_keys() -> None:
    rng = random.Random(3)
    keys = sorted({f"s3://b/d/{rng.choice('aAbBzZ')}{rng.getrandbits(24):06x}" for _ in range(3_000)})
    with pytest.raises(BackendError, match="byte order"):
        list_parallel(CaseFoldingStore(keys), "s3://b/d/", concurrency=4, min_pages=1,
                      pages_per_cut=1)
