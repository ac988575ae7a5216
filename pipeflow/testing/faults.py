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
(:data:`QUICK_RETRY`, same budget) to keep the suite short. The faults are real time and the
cases mostly wait, so all but the DataLoader one run side by side (:func:`side_by_side`), each
through a proxy of its own, once per backend; each test checks its own case's outcome.

Subclass :class:`BackendFaults` in a pytest module, name the backend, and provide an ``s3``
fixture (a :class:`~pipeflow.testing.LocalS3`, as :func:`~pipeflow.testing.local_s3` yields)::

    class TestMyBackend(BackendFaults):
        backend_name = "mybackend"

The suite takes a few seconds per backend on two cores (about the longest case, the outage),
plus the DataLoader case, marked ``slow``. Requires pytest (``pip install -e '.[test]'`` from a checkout).
"""

from __future__ import annotations

import functools
import hashlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, ClassVar

import pytest

from ..pipeline import Pipeline, from_items
from .proxy import Action, DelayProxy, Faults, RequestInfo

__all__ = ["CUT_AT", "OUTAGE_S", "QUICK_RETRY", "STALL_S", "STORM_S", "BackendFaults", "FailingStretch",
           "FirstGets", "assert_met_outage", "check_epoch", "digest", "fault_objects", "outage_after",
           "side_by_side", "through_outage"]

#: objects read per epoch, and their size in bytes
OBJECT_COUNT, OBJECT_SIZE = 16, 6000
#: body bytes delivered before a reset, a clean close or a stall inside the body
CUT_AT = 2000
#: seconds the store is down (connections refused) in the outage cases: longer than any SDK's own
#: retries (every backend turns them off, or down to two immediate attempts), several backoffs of
#: the default policy
OUTAGE_S = 1.5
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


class FirstGets:
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


class FailingStretch:
    """A fault hook (``DelayProxy(hook=...)``): from the ``after``-th request on, every request
    fails for ``seconds``, then every request is served again.

    Args:
        after: requests served before the stretch starts.
        seconds: how long every request fails.
        method: the requests ``after`` counts (``"GET"``: the reads, so the stretch starts
            mid-epoch whatever a backend sends before its first read); None counts every one.
        actions: how the failing requests fail, in turn: ``("error503",)`` is a 503 storm,
            ``("error503", "reset")`` a store that is down or restarting (a reset lands
            mid-body when the response has one).

    Attributes:
        failed: requests failed so far.
        served_after: requests forwarded once the stretch was over (the epoch went on).
    """

    def __init__(self, after: int, seconds: float, *, method: str | None = None,
                 actions: Sequence[Action] = ("error503",)) -> None:
        if not actions:
            raise ValueError("actions must name at least one failure")
        self.after, self.seconds, self.method, self.actions = after, seconds, method, tuple(actions)
        self.counted = 0
        self.failed = 0
        self.served_after = 0
        self.started: float | None = None
        self.lock = threading.Lock()

    def __call__(self, info: RequestInfo) -> Action | None:
        with self.lock:
            self.counted += self.method is None or info.method == self.method
            if self.started is None and self.counted > self.after:
                self.started = time.monotonic()
            if self.started is None:
                return None
            if time.monotonic() - self.started < self.seconds:
                self.failed += 1
                return self.actions[(self.failed - 1) % len(self.actions)]
            self.served_after += 1
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


def through_outage(make: Callable[[str], Pipeline], s3: Any, expected: dict[str, bytes], *, at: int = 2,
                   seconds: float = OUTAGE_S,
                   iterate: Callable[[Pipeline], Iterable[tuple[str, str]]] = iter) -> Pipeline:
    """One epoch of ``make(proxy_url)``, read by ``iterate``, through a proxy in front of ``s3``
    that goes down after the ``at``-th item for ``seconds`` and comes back; checked with
    :func:`check_epoch`. Returns the pipeline: its ``stats()`` show the retries."""
    threads: list[threading.Thread] = []
    with DelayProxy(s3.endpoint, delay_ms=0) as proxy:
        pipe = make(proxy.url)
        got = []
        for n, item in enumerate(iterate(pipe), 1):
            got.append(item)
            if n == at:  # the store has answered: from here on an outage gets the whole budget
                threads.append(outage_after(proxy, seconds))
        for thread in threads:
            thread.join()
    check_epoch(got, expected)
    return pipe


def assert_met_outage(counters: dict[str, Any]) -> None:
    """The stage's retry counters show the outage was met and waited out."""
    assert counters.get("retries", 0) > 0, f"the outage was not met: {counters}"
    assert counters.get("retry_wait_s", 0) > 0, counters


def side_by_side(run: Callable[..., Any], cases: Sequence[Hashable], at_once: int | None = None
                 ) -> dict[Any, Future[Any]]:
    """Start ``run(*case)`` (``run(case)`` for a case that is not a tuple) for every case,
    ``at_once`` (default: all) at a time in the order given; each test takes its case's result (or
    exception) from its future. Fault cases spend most of their time waiting (outages, stalls,
    backoff): side by side they take about as long as the longest, not the sum. Each case needs
    its own proxy. The threads are daemons and nothing joins them: a case that hangs fails its own
    test at the timeout, not the run."""
    futures: dict[Any, Future[Any]] = {case: Future() for case in cases}
    queue, lock = list(cases), threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                case = queue.pop(0)
            try:
                futures[case].set_result(run(*case) if isinstance(case, tuple) else run(case))
            except BaseException as exc:  # handed to the case's test, which raises it
                futures[case].set_exception(exc)

    for n in range(min(at_once or len(cases), len(cases))):
        threading.Thread(target=worker, name=f"pipeflow-fault-cases-{n}", daemon=True).start()
    return futures


def check_epoch(got: list[tuple[str, str]], expected: dict[str, bytes]) -> None:
    """Every expected object exactly once, byte-identical."""
    counts = Counter(url for url, _ in got)
    assert [u for u, c in counts.items() if c > 1] == [], "objects delivered twice"
    assert sorted(counts) == sorted(expected), "objects lost"
    bad = [u for u, h in got if h != hashlib.sha256(expected[u]).hexdigest()]
    assert bad == [], f"wrong bytes: {bad}"


_CUTS: tuple[Action, ...] = ("reset", "close")
_STALLS: tuple[Action, ...] = ("stall", "stall_body")


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
            **options: Any) -> tuple[list[tuple[str, str]], Pipeline, dict[str, Any]]:
        """One epoch through a proxy whose ``hook`` picks the faults, checked; the items, the
        pipeline and the proxy's counters."""
        with DelayProxy(s3.endpoint, delay_ms=0, hook=hook,
                        faults=Faults(reset_after=CUT_AT, stall_s=STALL_S)) as proxy:
            pipe = self.pipeline(sorted(fault_data), proxy.url, **options)
            got = list(pipe)
            stats = proxy.stats()
        check_epoch(got, fault_data)
        return got, pipe, stats

    # ---- the cases, each through a proxy of its own --------------------------------------------
    @pytest.fixture(scope="class")
    @classmethod
    def fault_cases(cls, fault_data: dict[str, bytes], s3: Any) -> dict[str, Future[Any]]:
        """Every case but the DataLoader one, started side by side; ``{name: future}``."""
        suite = cls()
        runs: dict[str, Callable[[], Any]] = {
            "outage": functools.partial(suite.outage, fault_data, s3),
            "storm": functools.partial(suite.storm, fault_data, s3),
            **{a: functools.partial(suite.faulted, fault_data, s3, a) for a in _CUTS + _STALLS},
        }
        return side_by_side(lambda name: runs[name](), list(runs))

    def outage(self, fault_data: dict[str, bytes], s3: Any) -> dict[str, Any]:
        """An outage under the default policy; the open stage's counters."""
        urls = sorted(fault_data)
        pipe = through_outage(lambda url: self.pipeline(urls, url), s3, fault_data)
        return pipe.stats().counters("open")

    def storm(self, fault_data: dict[str, bytes], s3: Any) -> int:
        """A 503 storm; the 503s answered."""
        storm = FailingStretch(after=2, seconds=STORM_S)
        self.run(fault_data, s3, hook=storm, retry=QUICK_RETRY)
        return storm.failed

    def faulted(self, fault_data: dict[str, bytes], s3: Any, action: Action) -> dict[str, int]:
        """Cut or stalled first GETs (every object cut, two stalled); the faults the proxy made."""
        hook = FirstGets(action, limit=OBJECT_COUNT if action in _CUTS else 2)
        options: dict[str, Any] = {"retry": QUICK_RETRY}
        if action in _STALLS:
            options["timeout"] = STALL_TIMEOUT
        _, _, stats = self.run(fault_data, s3, hook=hook, **options)
        return dict(stats["faults"])

    # ---- outages -------------------------------------------------------------------------------
    def test_outage_longer_than_sdk_retries(self, fault_cases: dict[str, Future[Any]]) -> None:
        assert_met_outage(fault_cases["outage"].result())

    def test_503_storm(self, fault_cases: dict[str, Future[Any]]) -> None:
        assert fault_cases["storm"].result() > 0

    # ---- cut bodies ----------------------------------------------------------------------------
    @pytest.mark.parametrize("action", _CUTS)
    def test_body_cut_mid_object(self, fault_cases: dict[str, Future[Any]], action: Action) -> None:
        faults = fault_cases[action].result()
        assert faults.get(action, 0) > 0, faults

    # ---- stalls --------------------------------------------------------------------------------
    @pytest.mark.parametrize("action", _STALLS)
    def test_stall(self, fault_cases: dict[str, Future[Any]], action: Action) -> None:
        faults = fault_cases[action].result()
        assert faults.get(action, 0) > 0, faults

    # ---- DataLoader workers --------------------------------------------------------------------
    @pytest.mark.slow
    def test_outage_under_dataloader_workers(self, fault_data: dict[str, bytes], s3: Any) -> None:
        torch_data = pytest.importorskip("torch.utils.data")

        def make(url: str) -> Pipeline:
            return from_items(sorted(fault_data)).open(self.backend_name, workers=1, read=True,
                                                       endpoint=url, **self.backend_options).map(digest)

        def iterate(pipe: Pipeline) -> Iterator[tuple[str, str]]:
            context = None if self.fork_safe else "spawn"
            return _pairs(torch_data.DataLoader(pipe, batch_size=None, num_workers=2,
                                                multiprocessing_context=context))

        # at=2: one item from each worker (they take turns): both have answered
        pipe = through_outage(make, s3, fault_data, iterate=iterate)
        counters = pipe.stats().counters("open")
        assert counters.get("retries", 0) > 0, f"the outage was not met: {counters}"


def _pairs(loader: Any) -> Iterator[tuple[str, str]]:
    for url, sha in loader:  # the default collate turns tuples into lists
        yield str(url), str(sha)
