"""The s3torchconnector (CRT) backend: bounded memory, typed errors, a bounded stall.

Everything runs against the local S3 server, through the fault proxy where a fault is needed.
"""

from __future__ import annotations

import os
import socket
import time

import pytest

from pipeflow.backends import get_backend, parse_s3_url
from pipeflow.backends._retry import RetryPolicy
from pipeflow.errors import AccessDeniedError, ObjectNotFoundError, RetryExhaustedError
from pipeflow.testing import local_s3
from pipeflow.testing.proxy import DelayProxy, Faults, RequestInfo

pytest.importorskip("s3torchconnector")
pytestmark = [pytest.mark.s3, pytest.mark.timeout(120)]

BIG = 64 << 20
WINDOW = 8 << 20


@pytest.fixture(scope="module")
def big(s3):
    bucket = s3.make_bucket("crt-big")
    data = os.urandom(1 << 20) * (BIG >> 20)
    return s3.put(bucket, "big.bin", data), data


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_reading_a_large_object_keeps_the_buffer_bounded(big):
    url, data = big
    be = get_backend("s3torchconnector", part_size=WINDOW, max_range_size=2 * WINDOW)
    peak = 0
    got = bytearray()
    with be.open(url) as stream:
        while True:
            chunk = stream.read(1 << 20)
            if not chunk:
                break
            got += chunk
            # the reader's own account: bytes requested from the server, not yet handed out
            peak = max(peak, stream._raw.peak_buffered)
    assert bytes(got) == data
    assert 0 < peak <= 4 * WINDOW, f"held {peak} bytes of a {BIG}-byte object"


def test_a_long_read_grows_its_ranges_to_four_parts(s3, big):
    """By default the ranges of a sequential read double from one part (8 MiB) to four (32 MiB),
    which the CRT fetches at once: 64 MiB in four ranges (8, 16, 32, then the last 8), so four
    version checks (one before each range after the first, one after the last) where ranges of
    one part took eight."""
    url, data = big
    with DelayProxy(s3.endpoint, delay_ms=0) as proxy:
        be = get_backend("s3torchconnector", endpoint=proxy.url)
        assert be.options.effective_max_range_size == 4 * WINDOW
        with be.open(url) as stream:
            got = stream.read()
        counts = proxy.counts()
        be.close()
    assert got == data
    assert counts.get("HEAD") == 4, counts
    # the CRT splits each range into parts of 8 MiB: 8 parts, and at most one past the end
    assert BIG // WINDOW <= counts.get("GET", 0) <= BIG // WINDOW + 2, counts


def test_an_object_smaller_than_a_range_is_one_get(s3):
    bucket = s3.make_bucket("crt-small")
    url = s3.put(bucket, "small.bin", b"x" * 1000)
    exact = s3.put(bucket, "exact.bin", b"y" * (1 << 20))
    with DelayProxy(s3.endpoint, delay_ms=0) as proxy:
        be = get_backend("s3torchconnector", endpoint=proxy.url, range_size=1 << 20)
        assert be.read(url) == b"x" * 1000
        assert proxy.counts().get("GET") == 1
        assert proxy.counts().get("HEAD", 0) == 0
        # exactly one range: the next range starts at the end and is answered 416
        assert be.read(exact) == b"y" * (1 << 20)
        be.close()


def test_a_closed_port_is_retry_exhausted_naming_the_endpoint_quickly():
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    be = get_backend("s3torchconnector", endpoint=endpoint,
                     retry=RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05))
    started = time.monotonic()
    with pytest.raises(RetryExhaustedError) as info:
        be.read("s3://bucket/key")
    elapsed = time.monotonic() - started
    assert str(info.value).count(endpoint) == 1
    assert "s3://bucket/key" in str(info.value)
    with pytest.raises(RetryExhaustedError, match="127.0.0.1"):
        list(be.list("s3://bucket/"))
    print(f"closed port: RetryExhaustedError after {elapsed:.2f} s")


def test_a_closed_port_is_reported_at_first_contact_without_a_crt_attempt():
    from pipeflow.errors import EndpointUnreachableError

    endpoint = f"http://127.0.0.1:{_closed_port()}"
    policy = RetryPolicy(first_contact=1.0)  # the default budget (60 s); a shorter window
    be = get_backend("s3torchconnector", endpoint=endpoint, retry=policy)
    started = time.monotonic()
    with pytest.raises(EndpointUnreachableError) as info:
        be.read("s3://bucket/key")
    elapsed = time.monotonic() - started
    assert endpoint in str(info.value) and "s3://bucket/key" in str(info.value)
    # TCP connections found the refusal: the CRT client (about 1 s to start, 0.2-0.5 s of its
    # own backoff per attempt) was never made, and the window was given (the budget spent would
    # be a RetryExhaustedError, not EndpointUnreachableError)
    assert be._client_obj is None
    assert elapsed >= policy.first_contact
    with pytest.raises(EndpointUnreachableError):
        list(be.list("s3://bucket/"))
    print(f"closed port: EndpointUnreachableError after {elapsed:.2f} s (first_contact 1 s)")


def test_an_endpoint_that_comes_up_within_the_first_contact_window_is_read(s3):
    import threading

    bucket = s3.make_bucket("crt-late")
    url = s3.put(bucket, "late.bin", b"z" * 5000)
    with DelayProxy(s3.endpoint, delay_ms=0) as proxy:
        proxy.down()  # refusing, and never answered in this process (a fresh port)
        timer = threading.Timer(0.5, proxy.up)
        timer.start()
        try:
            be = get_backend("s3torchconnector", endpoint=proxy.url)  # fail fast after 3 s
            assert be.read(url) == b"z" * 5000
        finally:
            timer.join()
        be.close()


def test_no_credentials_is_access_denied(s3, big, monkeypatch, tmp_path):
    url, _ = big
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(AccessDeniedError, match="no usable credentials found: set AWS_ACCESS_KEY_ID"):
        get_backend("s3torchconnector").read(url)


@pytest.mark.parametrize("backend", ["s3torchconnector", "boto3", "s3fs"])
def test_wrong_credentials_are_access_denied(backend, monkeypatch):
    # a second server that checks signatures: moto knows no access key, so every key is wrong
    monkeypatch.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "0")
    with local_s3(export_env=False) as server:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "wrong")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        be = get_backend(backend, endpoint=server.endpoint)
        with pytest.raises(AccessDeniedError):
            be.read("s3://bucket/key")
        be.close()


def test_missing_object_is_not_found(s3, big):
    url, _ = big
    with pytest.raises(ObjectNotFoundError):
        get_backend("s3torchconnector").open(url + ".missing")


def test_a_stalled_body_is_resumed_after_the_read_timeout(s3, big):
    url, data = big
    stalled: list[int] = []
    gets: list[int] = []

    def stall_first_get(info: RequestInfo):
        if info.method == "GET" and "list-type" not in info.path:
            gets.append(info.index)
            if not stalled:
                stalled.append(info.index)
                return "stall"
        return None

    with DelayProxy(s3.endpoint, delay_ms=0, faults=Faults(stall_s=20.0), hook=stall_first_get) as proxy:
        be = get_backend("s3torchconnector", endpoint=proxy.url, timeout=(5.0, 1.0),
                         retry=RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02))
        assert be.read(url, 0, 3 << 20) == data[: 3 << 20]
        assert stalled, "the proxy stalled nothing"
        # waiting the 20 s stall out would end in one GET; the read timeout asks again
        assert len(gets) >= 2, "the stalled body was waited out instead of timed out and resumed"
        be.close()


def test_a_server_that_always_stalls_ends_in_retry_exhausted(s3, big):
    url, _ = big
    with DelayProxy(s3.endpoint, delay_ms=0, faults=Faults(stall_rate=1.0, stall_s=20.0)) as proxy:
        be = get_backend("s3torchconnector", endpoint=proxy.url, timeout=(5.0, 0.5),
                         retry=RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.02))
        with pytest.raises(RetryExhaustedError) as info:
            be.read(url, 0, 1000)
        assert url in str(info.value)
        assert proxy.url in str(info.value)
        be.close()


@pytest.mark.parametrize("backend", ["s3fs", "fsspec", "iopath", "obstore"])
def test_every_retry_exhausted_names_the_endpoint(backend):
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    be = get_backend(backend, endpoint=endpoint,
                     retry=RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.02))
    with pytest.raises(RetryExhaustedError) as info:
        be.read("s3://bucket/key")
    assert str(info.value).count(endpoint) == 1
    assert "s3://bucket/key" in str(info.value)


def test_a_stream_dropped_without_close_leaves_no_thread(big):
    import gc
    import threading

    url, data = big
    be = get_backend("s3torchconnector", part_size=WINDOW)
    before = {t.ident for t in threading.enumerate()}
    # the ranged body itself, as a wrapper that forgot to close it would hold it
    stream = be._ranged(parse_s3_url(url), url, 0, None)
    assert stream.read(1000) == data[:1000]
    del stream  # never closed, read far from the end: the pump waits for a reader that is gone
    gc.collect()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = [t for t in threading.enumerate()
                if t.name == "pipeflow-ranged-read" and t.ident not in before]
        if not left:
            break
        time.sleep(0.1)
    assert not left, "the range thread outlived its stream"
