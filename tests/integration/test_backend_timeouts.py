"""S3 timeouts and the single retry layer, against the local server behind the fault proxy.

A server that stalls must become a retried timeout and then a typed RetryExhaustedError, never a
hang; each backend's SDK must not add retries of its own under pipeflow's RetryPolicy.
"""

from __future__ import annotations

import os

import pytest

from pipeflow.backends import get_backend
from pipeflow.backends._retry import RetryPolicy
from pipeflow.errors import RetryExhaustedError
from pipeflow.testing.proxy import DelayProxy, Faults

pytestmark = [pytest.mark.s3, pytest.mark.timeout(90)]

#: longer than any timeout below and than the whole retry budget: a backend that ignores its
#: timeout waits the stall out and then succeeds, which fails the test
STALL_S = 20.0
BUDGET = RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.02, max_resumes=2)
DATA = os.urandom(50_000)


@pytest.fixture(scope="module")
def obj(s3):
    bucket = s3.make_bucket("timeouts")
    return s3.put(bucket, "stalled.bin", DATA)


def _gets(proxy: DelayProxy) -> int:
    """GETs of objects (the proxy counts listings, also GETs, separately as well)."""
    stats = proxy.stats()
    return int(stats["requests"].get("GET", 0)) - int(stats.get("lists", 0))


@pytest.mark.parametrize("backend", ["boto3", "s3fs", "fsspec", "iopath", "s5cmd", "s3torchconnector",
                                     "obstore"])
def test_a_stalled_server_ends_in_retry_exhausted(s3, obj, backend):
    faults = Faults(stall_rate=1.0, stall_s=STALL_S)
    with DelayProxy(s3.endpoint, delay_ms=0, faults=faults) as proxy:
        be = get_backend(backend, endpoint=proxy.url, retry=BUDGET, timeout=(1.0, 0.5))
        try:
            with pytest.raises(RetryExhaustedError) as info:
                be.read(obj)
        finally:
            be.close()
        assert obj in str(info.value)
        assert _gets(proxy) >= BUDGET.max_attempts, "the timed-out request was not retried"


@pytest.mark.parametrize("backend", ["boto3", "s3fs", "fsspec", "iopath", "s3torchconnector", "s5cmd",
                                     "obstore"])
def test_sdk_retries_do_not_stack_under_the_policy(s3, obj, backend):
    # every GET is answered 503: the store sees at most max_attempts GETs of the object
    # (s5cmd and obstore run with their own retries off, under the policy; the CRT makes at
    # least 2 attempts per request, the fewest its binding accepts, so 2 per policy attempt)
    expected = RetryExhaustedError
    per_attempt = 2 if backend == "s3torchconnector" else 1
    with DelayProxy(s3.endpoint, delay_ms=0, faults=Faults(error_rate=1.0, error_status=503)) as proxy:
        be = get_backend(backend, endpoint=proxy.url, retry=BUDGET)
        try:
            with pytest.raises(expected):
                be.read(obj)
        finally:
            be.close()
        assert _gets(proxy) <= BUDGET.max_attempts * per_attempt, proxy.stats()


def test_timeouts_reach_the_clients_and_default():
    from pipeflow.backends._s3config import DEFAULT_TIMEOUT
    from pipeflow.backends.fsspec import s3fs_kwargs

    be = get_backend("boto3", endpoint="http://127.0.0.1:1", timeout=(2, 3))
    config = be._client().meta.config
    assert (config.connect_timeout, config.read_timeout) == (2.0, 3.0)
    assert config.retries["total_max_attempts"] == 1
    opts = get_backend("s3fs", endpoint="http://127.0.0.1:1", timeout=4).options
    cfg = s3fs_kwargs(opts)["config_kwargs"]
    assert (cfg["connect_timeout"], cfg["read_timeout"]) == (4.0, 4.0)
    assert cfg["retries"]["total_max_attempts"] == 1
    fs = get_backend("s3fs", endpoint="http://127.0.0.1:1")._fs("s3://bkt/k")[0]
    assert fs.retries == 1
    assert get_backend("boto3").options.timeout == DEFAULT_TIMEOUT
    assert get_backend("iopath", endpoint="http://127.0.0.1:1", timeout=5)._client()[1] \
        .meta.config.read_timeout == 5.0


@pytest.mark.parametrize("backend", ["obstore", "s3torchconnector"])
def test_a_listing_whose_page_fails_lists_every_key_once(s3, backend):
    # both list 1,000 keys a request: the first page fails here; the listing stream is dropped
    # and a new one opened (from the last key taken, none yet)
    bucket = s3.make_bucket(f"pages-{backend}")
    urls = sorted(s3.put(bucket, f"p/k{i:02d}", b"x") for i in range(7))

    lists = []

    def fail_one_list(info):
        if info.method == "GET" and "list-type=" in info.path:
            lists.append(info.path)
            return "error503" if len(lists) == 1 else None
        return None

    with DelayProxy(s3.endpoint, delay_ms=0, hook=fail_one_list) as proxy:
        be = get_backend(backend, endpoint=proxy.url, retry={"max_delay": 0.05})
        got = [info.url for info in be.list(f"s3://{bucket}/p/")]
        assert proxy.stats()["faults"].get("error") == 1
        be.close()
    assert got == urls
    assert len(lists) == 2  # the failed page was asked for again, once
