"""Faults against the real local S3 server, through the fault-injecting proxy.

Every S3 backend reads tar shards while the proxy answers a share of requests with 503 SlowDown
or 500, resets connections in the middle of bodies or stalls responses. Each epoch must end with
every sample delivered once and byte-identical, or, past the retry budget, with a typed error
within a bounded time. The server itself is killed and restarted mid-epoch. Never a hang.

Outages: with the default policy (a 60 s budget per request), a store that fails every request
for 2 s or 10 s mid-epoch costs time, not samples; a 403 or a missing key fails at the first
request; a store that never comes back fails once a small budget is spent, naming URL and endpoint.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import pipeflow as pf
from pipeflow.backends import get_backend
from pipeflow.backends._retry import RetryPolicy
from pipeflow.errors import (
    AccessDeniedError,
    BackendError,
    ObjectNotFoundError,
    PipeflowError,
    RetryExhaustedError,
)
from pipeflow.testing import local_s3
from pipeflow.testing.faults import FailingStretch, side_by_side
from pipeflow.testing.proxy import DelayProxy, Faults

from . import _data
from .conftest import FIGURES

pytestmark = [pytest.mark.s3, pytest.mark.timeout(120)]

BACKENDS = ["boto3", "s3fs", "s3torchconnector", "s5cmd", "obstore", "obstore-read-ahead", "iopath",
            "iopath-chunked"]
#: a case name -> (backend, options): iopath downloads whole objects through boto3's transfer
#: manager, which retries a cut body itself; with chunk_size its ranged reads are cut under
#: pipeflow's own resume; obstore's read-ahead thread meets a cut body before the reader does
VARIANTS = {"iopath-chunked": ("iopath", {"chunk_size": 4096}),
            "obstore-read-ahead": ("obstore", {"read_ahead": 1, "chunk_size": 1024})}
NUM_SHARDS, PER_SHARD = 6, 8
#: patient enough for a 30% fault rate, fast enough for CI
POLICY = RetryPolicy(max_attempts=8, base_delay=0.02, max_delay=0.2, max_resumes=50)

FAULTS = {
    "503-slowdown": Faults(error_rate=0.3, error_status=503, seed=1),
    "500-internal": Faults(error_rate=0.3, error_status=500, seed=2),
    "reset-mid-body": Faults(reset_rate=0.3, reset_after=1500, seed=3),
    "slow-responses": Faults(stall_rate=0.3, stall_s=0.4, seed=4),
    "everything": Faults(error_rate=0.15, reset_rate=0.15, reset_after=700, stall_rate=0.1,
                         stall_s=0.3, seed=5),
}

INJECTED: Counter[str] = Counter()


@pytest.fixture(scope="module")
def shards(s3):
    bucket = s3.make_bucket("reliability-faults")
    return s3.put_many(bucket, _data.tar_dataset(NUM_SHARDS, PER_SHARD))


def _expected():
    return sorted(f"s{i:02d}-{j:03d}" for i in range(NUM_SHARDS) for j in range(PER_SHARD))


def _backend(case: str) -> tuple[str, dict]:
    return VARIANTS.get(case, (case, {}))


def _pipeline(urls, case, endpoint, **extra):
    backend, options = _backend(case)
    return (pf.from_items(urls).shuffle(4, seed=1)
            .open(backend, workers=2, endpoint=endpoint, retry=POLICY, **options, **extra)
            .untar().group_pairs(required=("bin", "cls")).map(_data.check_sample))


def _faults_seen(proxy) -> int:
    stats = proxy.stats()
    faults = stats.get("faults", {})
    return sum(faults.values()) if isinstance(faults, dict) else int(faults or 0)


def _selected(request, test: str, names: tuple[str, ...]) -> list[tuple]:
    """The parameters ``names`` of the cases of ``test`` (in this module) that this run selected."""
    return [tuple(item.callspec.params[n] for n in names) for item in request.session.items
            if item.module is request.module and getattr(item, "originalname", None) == test]


def _fault_cases():
    for backend in BACKENDS:
        for fault in sorted(FAULTS):
            yield pytest.param(backend, fault)


def _epoch_through_faults(endpoint: str, shards: list[str], backend: str, fault: str):
    with DelayProxy(endpoint, delay_ms=0, faults=FAULTS[fault]) as proxy:
        keys = list(_pipeline(shards, backend, proxy.url))
        return keys, _faults_seen(proxy), proxy.stats()


@pytest.fixture(scope="module")
def fault_epochs(request, s3, shards):
    """Every selected backend x fault case, a few side by side (each reads a whole epoch)."""
    run = functools.partial(_epoch_through_faults, s3.endpoint, shards)
    return side_by_side(run, _selected(request, "test_epoch_is_exact_despite_faults", ("backend", "fault")),
                         at_once=4)


@pytest.mark.parametrize("backend,fault", list(_fault_cases()))
def test_epoch_is_exact_despite_faults(fault_epochs, backend, fault):
    keys, injected, stats = fault_epochs[(backend, fault)].result()
    INJECTED[fault] += injected
    FIGURES["faults injected"] += injected
    FIGURES["samples checked"] += len(keys)
    counts = Counter(keys)
    assert [k for k, c in counts.items() if c > 1] == [], "duplicated samples"
    assert sorted(counts) == _expected(), "lost samples"
    assert injected > 0, f"the proxy injected no fault: {stats}"


def _budget_cases():
    for status in (503, 500):
        for backend in BACKENDS:
            yield pytest.param(status, backend)


#: the retry policy of the cases that exhaust it
BUDGET = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05, max_resumes=3)


def _epoch_past_the_budget(endpoint: str, shards: list[str], status: int, backend: str):
    """The error of an epoch whose every GET is answered ``status``, and the faults injected."""
    with DelayProxy(endpoint, delay_ms=0, faults=Faults(error_rate=1.0, error_status=status)) as proxy:
        name, options = _backend(backend)
        pipe = pf.from_items(shards).open(name, endpoint=proxy.url, retry=BUDGET, **options).untar()
        try:
            list(pipe)
        except PipeflowError as exc:
            return exc, _faults_seen(proxy)
    raise AssertionError(f"{backend}: an epoch with every GET answered {status} ended without an error")


@pytest.fixture(scope="module")
def past_the_budget(request, s3, shards):
    """Every selected status x backend case, side by side."""
    test = "test_past_the_retry_budget_a_typed_error_within_bounded_time"
    run = functools.partial(_epoch_past_the_budget, s3.endpoint, shards)
    return side_by_side(run, _selected(request, test, ("status", "backend")))


# "within bounded time" is enforced by pytest-timeout (a hang fails the test), not by timing
# the call: the retry budget itself is a few hundredths of a second of backoff
@pytest.mark.timeout(60)
@pytest.mark.parametrize("status,backend", list(_budget_cases()))
def test_past_the_retry_budget_a_typed_error_within_bounded_time(past_the_budget, shards, backend, status):
    error, injected = past_the_budget[(status, backend)].result()
    INJECTED[f"budget-{status}"] += injected
    FIGURES["faults injected"] += injected
    assert isinstance(error, BackendError), f"{type(error).__name__}: {error}"
    assert shards[0] in str(error), "the error names the object"


#: every S3 backend, for the outage and permanent-error tests (the default retry policy)
ALL_S3 = ["obstore", "boto3", "s3fs", "fsspec", "iopath", "s3torchconnector", "s5cmd"]


def _outage_cases():
    for seconds in (2, 10):
        for backend in ALL_S3:
            marks = [pytest.mark.slow] if seconds > 2 else []
            yield pytest.param(backend, seconds, marks=marks, id=f"{backend}-{seconds}s")


def _epoch_through_outage(endpoint: str, shards: list[str], backend: str, seconds: float):
    # the default policy (no retry= option): a store that is down for seconds costs time, not data
    # every request fails, alternately 503 and a reset, from the third GET on
    outage = FailingStretch(after=2, seconds=seconds, method="GET", actions=("error503", "reset"))
    with DelayProxy(endpoint, delay_ms=0, hook=outage) as proxy:
        pipe = (pf.from_items(shards).open(backend, workers=2, endpoint=proxy.url)
                .untar().group_pairs(required=("bin", "cls")).map(_data.check_sample))
        keys = list(pipe)
    return outage, keys


@pytest.fixture(scope="module")
def outage_epochs(request, s3, shards):
    """Every selected outage case, run side by side, each with its own proxy and outage."""
    test = "test_an_outage_mid_epoch_loses_and_duplicates_nothing"
    return side_by_side(functools.partial(_epoch_through_outage, s3.endpoint, shards),
                         _selected(request, test, ("backend", "seconds")))


@pytest.mark.parametrize("backend,seconds", list(_outage_cases()))
def test_an_outage_mid_epoch_loses_and_duplicates_nothing(outage_epochs, backend, seconds):
    outage, keys = outage_epochs[(backend, seconds)].result()
    FIGURES["faults injected"] += outage.failed
    FIGURES["samples checked"] += len(keys)
    assert outage.failed > 0 and outage.served_after > 0, "the outage did not happen mid-epoch"
    counts = Counter(keys)
    assert [k for k, c in counts.items() if c > 1] == [], "duplicated samples"
    assert sorted(counts) == _expected(), "lost samples"


def _object_requests(log: list, key: str) -> int:
    return sum(1 for info in log if info.path.split("?", 1)[0].endswith("/" + key))


@pytest.mark.parametrize("backend", ALL_S3)
def test_access_denied_fails_at_once(s3, shards, backend):
    log: list = []

    def deny(info):
        log.append(info)
        return "error403"

    key = shards[0].split("/", 3)[3]
    with DelayProxy(s3.endpoint, delay_ms=0, hook=deny) as proxy:
        be = get_backend(backend, endpoint=proxy.url)
        try:
            with pytest.raises(BackendError) as info:
                be.read(shards[0])
        finally:
            be.close()
    assert not isinstance(info.value, RetryExhaustedError), f"a 403 was retried: {info.value}"
    if backend != "s3torchconnector":  # the CRT reports no error code (translation by code: issue 15)
        assert isinstance(info.value, AccessDeniedError), f"{type(info.value).__name__}: {info.value}"
    assert _object_requests(log, key) == 1, [(i.method, i.path) for i in log]


@pytest.mark.parametrize("backend", ALL_S3)
def test_a_missing_object_fails_at_once(s3, shards, backend):
    log: list = []
    url = shards[0] + ".missing"
    with DelayProxy(s3.endpoint, delay_ms=0, hook=lambda info: log.append(info)) as proxy:
        be = get_backend(backend, endpoint=proxy.url)
        try:
            with pytest.raises(ObjectNotFoundError):
                be.read(url)
        finally:
            be.close()
    assert _object_requests(log, url.split("/", 3)[3]) == 1, [(i.method, i.path) for i in log]


#: the retry budget of a read from a server that never comes back
NEVER_BACK = RetryPolicy(budget=1.5, base_delay=0.05, max_delay=0.3)


def _read_from_a_server_that_never_comes_back(endpoint: str, url: str, backend: str):
    """The read's error, the seconds it took, and the proxy's URL."""
    with DelayProxy(endpoint, delay_ms=0, hook=lambda info: "error503") as proxy:
        be = get_backend(backend, endpoint=proxy.url, retry=NEVER_BACK)
        started = time.monotonic()
        try:
            be.read(url)
        except BackendError as exc:
            return exc, time.monotonic() - started, proxy.url
        finally:
            be.close()
    raise AssertionError(f"{backend}: a read from a server that answers only 503 returned")


@pytest.fixture(scope="module")
def never_back(request, s3, shards):
    """Every selected backend at once: each spends the whole retry budget waiting."""
    test = "test_a_server_that_never_comes_back_fails_after_the_budget"
    run = functools.partial(_read_from_a_server_that_never_comes_back, s3.endpoint, shards[0])
    return side_by_side(run, _selected(request, test, ("backend",)))


@pytest.mark.parametrize("backend", ALL_S3)
def test_a_server_that_never_comes_back_fails_after_the_budget(never_back, shards, backend):
    error, elapsed, endpoint = never_back[(backend,)].result()
    FIGURES["faults injected"] += 1
    assert isinstance(error, RetryExhaustedError), f"{type(error).__name__}: {error}"
    assert shards[0] in str(error) and endpoint in str(error), str(error)
    # it kept trying for the whole budget (a lower bound: the attempts themselves add time)
    assert elapsed >= NEVER_BACK.budget


class _Relay:
    """A plain TCP relay from 127.0.0.1:port to another port: the "restarted server" answers on
    the old port with all its data already in place (moto keeps objects in memory only)."""

    def __init__(self, port: int, target: int) -> None:
        import socket

        self._target = target
        self._listener = socket.create_server(("127.0.0.1", port), reuse_port=False)
        self._socks: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        import socket

        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self._target))
            self._socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(2)
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        for s in self._socks:
            s.close()
        self._thread.join(5)


def _restart_server_after(first_item: threading.Event, port: int, holder: dict, objects: dict):
    first_item.wait(30)
    old = holder["server"]
    old.process.kill()  # abrupt: connections die mid-flight, then the port refuses connections
    old.process.wait(10)
    holder["killed"].set()
    ctx = local_s3(export_env=False)
    server = ctx.__enter__()
    server.make_bucket("restart")
    for key, data in objects.items():
        server.put("restart", key, data)
    holder["ctx2"], holder["relay"] = ctx, _Relay(port, server.port)
    holder["restarted"].set()
    holder["done"].wait(120)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["boto3", "s5cmd"])
def test_server_killed_and_restarted_mid_epoch(backend, monkeypatch):
    from pipeflow.testing import free_port

    objects = _data.tar_dataset(NUM_SHARDS, PER_SHARD)
    port = free_port()
    patient = RetryPolicy(max_attempts=40, base_delay=0.2, max_delay=1.0, max_resumes=40)
    with local_s3(port=port, export_env=False) as server:
        server.make_bucket("restart")
        urls = server.put_many("restart", objects)
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        holder = {"server": server, "restarted": threading.Event(), "done": threading.Event(),
                  "killed": threading.Event()}
        first_item = threading.Event()
        restarter = threading.Thread(target=_restart_server_after,
                                     args=(first_item, port, holder, objects), daemon=True)
        restarter.start()
        keys = []
        try:
            pipe = (pf.from_items(urls).open(backend, endpoint=server.endpoint, retry=patient)
                    .untar().group_pairs().map(_data.check_sample))
            for i, key in enumerate(pipe):
                keys.append(key)
                if i == PER_SHARD + 2:  # inside the second shard
                    first_item.set()
                    # carry on at once: the next requests meet a dead server, then a fresh one
                    assert holder["killed"].wait(30)
                    assert not holder["restarted"].is_set()
        finally:
            if "relay" in holder:
                holder["relay"].close()
            if "ctx2" in holder:
                holder["ctx2"].__exit__(None, None, None)
            holder["done"].set()
            restarter.join(60)
    assert holder["restarted"].is_set()
    INJECTED["server-restart"] += 1
    FIGURES["faults injected"] += 1
    FIGURES["samples checked"] += len(keys)
    assert sorted(keys) == _expected()
    assert len(keys) == len(set(keys))


def test_local_s3_started_from_a_thread_outlives_it():
    import urllib.request

    box = {}
    ctx = local_s3(export_env=False)
    starter = threading.Thread(target=lambda: box.setdefault("server", ctx.__enter__()))
    starter.start()
    starter.join(60)
    # a parent-death signal tied to the starting thread fires when the kernel thread ends, a moment
    # after join() returns: wait for that, then the server must still answer (a killed one cannot)
    task = Path(f"/proc/self/task/{starter.native_id}")
    deadline = time.monotonic() + 10
    while task.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not task.exists(), "the starting thread never ended"
    try:
        urllib.request.urlopen(box["server"].endpoint + "/moto-api/", timeout=5).close()
        assert box["server"].process.poll() is None, "the server died with the thread that started it"
    finally:
        ctx.__exit__(None, None, None)


_STARTS_FROM_A_THREAD = """
import sys, threading, time
from pipeflow.testing import local_s3
box = {}
ctx = local_s3(export_env=False)
starter = threading.Thread(target=lambda: box.setdefault("server", ctx.__enter__()))
starter.start()
starter.join(60)
print(box["server"].process.pid, flush=True)
time.sleep(120)
"""


def _gone(pid: int) -> bool:
    """No such process, or a zombie whose new parent has yet to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_local_s3_started_from_a_thread_dies_with_its_parent_process():
    """The server outlives the thread that started it (above) but not the process: a parent
    SIGKILLed leaves no server behind, whichever thread started it."""
    import os
    import signal
    import subprocess
    import sys

    script = [sys.executable, "-c", _STARTS_FROM_A_THREAD]
    parent = subprocess.Popen(script, stdout=subprocess.PIPE, text=True)
    server_pid = None
    try:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
        time.sleep(0.5)  # the starting thread has ended by now
        assert not _gone(server_pid), "the server died before its parent"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while not _gone(server_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(server_pid), "the server outlived its parent process by 10 s"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
        if server_pid is not None and not _gone(server_pid):
            os.kill(server_pid, signal.SIGKILL)
