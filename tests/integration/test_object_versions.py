"""Objects replaced while they are read, and what one open costs.

A stream read in several requests (the CRT backend's windows, iopath's chunks) must never
splice two versions of an object together: the object replaced mid-read is
:class:`~pipeflow.errors.ObjectChangedError`. And iopath's chunked reader, which learns an
object's size with a GET of its own, costs one GET per open of a one-chunk object.
"""

from __future__ import annotations

import os

import pytest

from pipeflow.backends import get_backend
from pipeflow.errors import ObjectChangedError
from pipeflow.testing.proxy import DelayProxy, Faults, RequestInfo

pytestmark = pytest.mark.s3

WINDOW = 64 << 10


@pytest.mark.parametrize("backend,options", [
    ("s3torchconnector", {"range_size": WINDOW}),
    ("iopath", {"chunk_size": WINDOW}),
    ("boto3", {}),
])
def test_an_object_replaced_mid_read_is_a_typed_error(s3, s3_bucket, backend, options):
    old, new = os.urandom(5 * WINDOW), os.urandom(5 * WINDOW)
    url = s3.put(s3_bucket, "replaced.bin", old)
    be = get_backend(backend, **options)
    try:
        with be.open(url) as stream:
            head = stream.read(WINDOW + 1)  # past the first window: the next requests follow
            assert head == old[: WINDOW + 1]
            s3.put(s3_bucket, "replaced.bin", new)
            if backend == "boto3":
                # one GET streams the whole body: the old version, to its end, is consistent
                assert head + stream.read() == old
                return
            with pytest.raises(ObjectChangedError) as info:
                stream.read()
    finally:
        be.close()
    assert info.value.url == url and info.value.backend == backend


def test_a_resumed_boto3_stream_refuses_a_replaced_object(s3, s3_bucket):
    old, new = os.urandom(200_000), os.urandom(200_000)
    url = s3.put(s3_bucket, "resumed.bin", old)
    cut: list[int] = []

    def reset_first_get(info: RequestInfo):
        if info.method == "GET" and not cut:
            cut.append(info.index)
            return "reset"
        return None

    with DelayProxy(s3.endpoint, delay_ms=0, hook=reset_first_get,
                    faults=Faults(reset_after=50_000)) as proxy:
        be = get_backend("boto3", endpoint=proxy.url)
        try:
            with be.open(url) as stream:
                s3.put(s3_bucket, "resumed.bin", new)
                with pytest.raises(ObjectChangedError):
                    stream.read()
        finally:
            be.close()
    assert cut


def test_iopath_sends_one_get_per_open(s3, s3_bucket):
    data = os.urandom(10_000)
    url = s3.put(s3_bucket, "one-get.bin", data)
    with DelayProxy(s3.endpoint, delay_ms=0) as proxy:
        be = get_backend("iopath", endpoint=proxy.url)  # default chunk: 8 MiB, one chunk
        try:
            be.read(url)  # the client is made, the endpoint answered
            proxy.reset_counts()
            for start in (0, 123):
                with be.open(url, start=start) as stream:
                    assert stream.read() == data[start:]
            assert be.read(url, 9_000) == data[9_000:]
        finally:
            be.close()
        assert proxy.counts() == {"GET": 3}, proxy.stats()
