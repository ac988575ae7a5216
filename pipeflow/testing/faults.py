"""The fault suite: what every S3 backend must survive, for pipeflow's own backends and yours.

Each test reads a small set of objects through a pipeline (``open(..., read=True)``) with the
fault proxy (:class:`~pipeflow.testing.proxy.DelayProxy`) between the backend and the local S3
server, injects one kind of fault, and checks the epoch: every object delivered exactly once,
byte-identical. The faults:

* an outage longer than any SDK's own retries: the store goes down (connections refused)
  mid-epoch for :data:`OUTAGE_S` seconds and comes back; the default retry policy must carry
  the epoch through it, and ``stats()`` must show the retries and the seconds waited;
* a 503 ``SlowDown`` storm: every request answered 503 for :data:`STORM_S` seconds;
* a body cut mid-object, by a TCP reset and by a clean close (the body just ends short);
* a response that stalls before its first byte, and one that stalls inside its body, for
  longer than the read timeout (the test runs with ``timeout=(1, 1)``);
* the outage under ``DataLoader(num_workers=2)`` (each worker has read before it starts).

The outages run under the default retry policy; the other cases cap the backoff at 0.5 s
(:data:`QUICK_RETRY`, same budget) to keep the suite short.

Subclass :class:`BackendFaults` in a pytest module, name the backend, and provide an ``s3``
fixture (a :class:`~pipeflow.testing.LocalS3`, as :func:`~pipeflow.testing.local_s3` yields)::

    class TestMyBackend(BackendFaults):
        backend_name = "mybackend"

The suite takes about 15 s per backend on two cores (the outages and stalls are real time);
the DataLoader case is marked ``slow``. Requires pytest (``pip install -e '.[test]'`` from a checkout).
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest

from ..pipeline import Pipeline, from_items
from .proxy import Action, DelayProxy, Faults, RequestInfo

__all__ = ["CUT_AT", "OUTAGE_S", "STALL_S", "STORM_S", "BackendFaults", "digest", "fault_objects",
           "outage_after"]

#: objects read per epoch, and their size in bytes
OBJECT_COUNT, OBJECT_SIZE = 16, 6000
#: body bytes delivered before a reset, a clean close or a stall inside the body
CUT_AT = 2000
#: seconds the store is down (connections refused) in the outage cases
OUTAGE_S = 3.0
#: seconds of the 503 storm
STORM_S = 1.5
#: seconds a stalled response waits, longer than the read timeout of the stall cases
STALL_S = 2.5
#: ``timeout=`` of the stall cases: (connect, read) seconds
STALL_TIMEOUT = (1.0, 1.0)
#: ``retry=`` of the storm, cut and stall cases: the default budget, a shorter backoff cap (the
#: outage cases use the default policy as it is)
QUICK_RETRY = {"max_delay": 0.5}


def fault_objects(count: int = OBJECT_COUNT) -> dict[str, bytes]:
    """The suite's objects by key: deterministic random bytes."""
    rng = random.Random(2323)
    return {f"faults/object-{i:03d}.bin": rng.randbytes(OBJECT_SIZE) for i in range(count)}


def digest(record: Any) -> tuple[str, str]:
    """``(url, sha256 of the bytes)`` of a read record (module level: spawn workers pickle it)."""
    return record.url, hashlib.sha256(record.data).hexdigest()


class _FirstGets:
    """A fault hook: the first GET of each of the first ``limit`` objects gets ``action``
    (so every object is cut, or stalled, at most once, and the resumed request goes through)."""

    def __init__(self, action: Action, limit: int) -> None:
        self.action, self.limit = action, limit
        self.seen: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, info: RequestInfo) -> Action | None:
        path = info.path.split("?", 1)[0]
        if info.method != "GET" or path.count("/") < 2:  # listings are GETs on the bucket
            return None
        with self.lock:
            if path in self.seen or len(self.seen) >= self.limit:
                self.seen.add(path)
                return None
            self.seen.add(path)
        return self.action


class _Storm:
    """A fault hook: from the ``after``-th request on, every request is answered 503 for
    ``seconds``."""

    def __init__(self, after: int, seconds: float) -> None:
        self.after, self.seconds = after, seconds
        self.count = 0
        self.started: float | None = None
        self.answered = 0  # 503s sent
        self.lock = threading.Lock()

    def __call__(self, info: RequestInfo) -> Action | None:
        with self.lock:
            self.count += 1
            if self.started is None and self.count > self.after:
                self.started = time.monotonic()
            if self.started is not None and time.monotonic() - self.started < self.seconds:
                self.answered += 1
                return "error503"
        return None


def outage_after(proxy: DelayProxy, seconds: float = OUTAGE_S) -> threading.Thread:
    """Take ``proxy`` down now and bring it back after ``seconds``, on a thread (joined by the
    caller)."""
    proxy.down()

    def come_back() -> None:
        time.sleep(seconds)
        proxy.up()

    thread = threading.Thread(target=come_back, name="pipeflow-outage", daemon=True)
    thread.start()
    return thread


def check_epoch(got: list[tuple[str, str]], expected: dict[str, bytes]) -> None:
    """Every expected object exactly once, byte-identical."""
    counts = Counter(url for url, _ in got)
    assert [u for u, c in counts.items() if c > 1] == [], "objects delivered twice"
    assert sorted(counts) == sorted(expected), "objects lost"
    bad = [u for u, h in got if h != hashlib.sha256(expected[u]).hexdigest()]
    assert bad == [], f"wrong bytes: {bad}"


class BackendFaults:
    """The suite. Subclass it (as ``TestSomething``) and provide an ``s3`` fixture.

    Attributes:
        backend_name: the registered backend name.
        backend_options: keyword options for ``open()`` (besides ``endpoint``).
        fork_safe: False for a backend whose client does not survive a fork after use: the
            DataLoader case then starts its workers with spawn.
    """

    backend_name: ClassVar[str] = ""
    backend_options: ClassVar[dict[str, Any]] = {}
    fork_safe: ClassVar[bool] = True

    @pytest.fixture(scope="class")
    @classmethod
    def fault_data(cls, s3: Any) -> dict[str, bytes]:
        """The objects in a bucket of their own: ``{url: bytes}``."""
        bucket = s3.make_bucket(f"faults-{cls.__name__.lower().replace('_', '-')}")
        objects = fault_objects()
        urls = s3.put_many(bucket, objects)
        return dict(zip(urls, objects.values(), strict=True))

    def pipeline(self, urls: list[str], endpoint: str, **options: Any) -> Pipeline:
        return from_items(urls).open(self.backend_name, workers=2, read=True, endpoint=endpoint,
                                     **{**self.backend_options, **options}).map(digest)

    def run(self, fault_data: dict[str, bytes], s3: Any, *, hook: Callable[..., Any] | None = None,
            during: Callable[[DelayProxy, int], None] | None = None,
            **options: Any) -> tuple[list[tuple[str, str]], Pipeline, dict[str, Any]]:
        """One epoch through the proxy, checked; the items, the pipeline and the proxy's counters.
        ``during(proxy, n)`` runs after the n-th item."""
        with DelayProxy(s3.endpoint, delay_ms=0, hook=hook,
                        faults=Faults(reset_after=CUT_AT, stall_s=STALL_S)) as proxy:
            pipe = self.pipeline(sorted(fault_data), proxy.url, **options)
            got = []
            for n, item in enumerate(pipe, 1):
                got.append(item)
                if during is not None:
                    during(proxy, n)
            stats = proxy.stats()
        check_epoch(got, fault_data)
        return got, pipe, stats

    # ---- outages -------------------------------------------------------------------------------
    def test_outage_longer_than_sdk_retries(self, fault_data: dict[str, bytes], s3: Any) -> None:
        threads: list[threading.Thread] = []

        def during(proxy: DelayProxy, n: int) -> None:
            if n == 2:  # the store has answered: from here on an outage gets the whole budget
                threads.append(outage_after(proxy))

        _, pipe, _ = self.run(fault_data, s3, during=during)
        for thread in threads:
            thread.join()
        counters = pipe.stats().counters("open")
        assert counters.get("retries", 0) > 0, f"the outage was not met: {counters}"
        assert counters.get("retry_wait_s", 0) > 0, counters

    def test_503_storm(self, fault_data: dict[str, bytes], s3: Any) -> None:
        storm = _Storm(after=2, seconds=STORM_S)
        self.run(fault_data, s3, hook=storm, retry=QUICK_RETRY)
        assert storm.answered > 0

    # ---- cut bodies ----------------------------------------------------------------------------
    @pytest.mark.parametrize("action", ["reset", "close"])
    def test_body_cut_mid_object(self, fault_data: dict[str, bytes], s3: Any, action: Action) -> None:
        hook = _FirstGets(action, limit=OBJECT_COUNT)
        _, _, stats = self.run(fault_data, s3, hook=hook, retry=QUICK_RETRY)
        assert stats["faults"].get(action, 0) > 0, stats

    # ---- stalls --------------------------------------------------------------------------------
    @pytest.mark.parametrize("action", ["stall", "stall_body"])
    def test_stall(self, fault_data: dict[str, bytes], s3: Any, action: Action) -> None:
        hook = _FirstGets(action, limit=2)
        _, _, stats = self.run(fault_data, s3, hook=hook, timeout=STALL_TIMEOUT, retry=QUICK_RETRY)
        assert stats["faults"].get(action, 0) > 0, stats

    # ---- DataLoader workers --------------------------------------------------------------------
    @pytest.mark.slow
    def test_outage_under_dataloader_workers(self, fault_data: dict[str, bytes], s3: Any) -> None:
        torch_data = pytest.importorskip("torch.utils.data")
        with DelayProxy(s3.endpoint, delay_ms=0) as proxy:
            pipe = from_items(sorted(fault_data)).open(
                self.backend_name, workers=1, read=True, endpoint=proxy.url,
                **self.backend_options).map(digest)
            loader = torch_data.DataLoader(pipe, batch_size=None, num_workers=2,
                                           multiprocessing_context=None if self.fork_safe else "spawn")
            got, threads = [], []
            for n, item in enumerate(_pairs(loader), 1):
                got.append(item)
                if n == 2:  # one item from each worker (they take turns): both have answered
                    threads.append(outage_after(proxy))
            for thread in threads:
                thread.join()
        check_epoch(got, fault_data)
        counters = pipe.stats().counters("open")
        assert counters.get("retries", 0) > 0, f"the outage was not met: {counters}"


def _pairs(loader: Any) -> Iterator[tuple[str, str]]:
    for url, sha in loader:  # the default collate turns tuples into lists
        yield str(url), str(sha)
