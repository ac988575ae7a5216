"""Resuming a cut body against the real local S3 server, through the fault proxy: the backend's
own resume path (not the SDK's retries) and the guard that keeps two versions of an object apart."""

from __future__ import annotations

import os

import pytest

from pipeflow.backends import get_backend
from pipeflow.backends._retry import RetryPolicy
from pipeflow.errors import ObjectChangedError, PipeflowError
from pipeflow.testing.proxy import DelayProxy, Faults

pytestmark = [pytest.mark.s3, pytest.mark.timeout(60)]

POLICY = RetryPolicy(max_attempts=4, base_delay=0.01, max_delay=0.05, max_resumes=4)


def _reset_gets(*numbers: int):
    """A fault hook that cuts the bodies of the GETs with these 0-based numbers."""
    seen = {"gets": -1}

    def hook(request):
        if request.method != "GET":
            return None
        seen["gets"] += 1
        return "reset" if seen["gets"] in numbers else None

    return hook


def test_iopath_chunked_reader_resumes_a_cut_range_itself(s3, s3_bucket):
    # iopath's chunked reader issues ranged GETs that botocore does not retry once the body
    # streams: a cut there reaches pipeflow's resume. The fifth GET is a range in the middle of
    # the object, so the resume must start at an offset, not at the beginning
    data = os.urandom(60_000)
    url = s3.put(s3_bucket, "chunked.bin", data)
    with DelayProxy(s3.endpoint, delay_ms=0, faults=Faults(reset_after=1500), hook=_reset_gets(4)) as proxy:
        be = get_backend("iopath", endpoint=proxy.url, retry=POLICY, chunk_size=8192)
        try:
            stream = be.open(url)
            # small reads, so the cut comes after bytes were delivered and the resume has to
            # start in the middle of the object
            got = b"".join(iter(lambda: stream.read(3000), b""))
            resumes = stream.resumes
            stream.close()
        finally:
            be.close()
        faults = proxy.stats()["faults"]
    assert got == data
    assert faults == {"reset": 1}
    assert resumes == 1, "the cut was not recovered by the backend's resume"


def test_an_object_overwritten_mid_read_is_an_error_not_a_splice(s3, s3_bucket):
    old, new = os.urandom(300_000), os.urandom(300_000)
    url = s3.put(s3_bucket, "changing.bin", old)
    with DelayProxy(s3.endpoint, delay_ms=0, faults=Faults(reset_after=40_000), hook=_reset_gets(0)) as proxy:
        be = get_backend("boto3", endpoint=proxy.url, retry=POLICY)
        try:
            stream = be.open(url)
            head = stream.read(1000)
            s3.put(s3_bucket, "changing.bin", new)  # a new version lands while we read the old one
            with pytest.raises(PipeflowError) as info:
                while stream.read(8192):
                    pass
            stream.close()
        finally:
            be.close()
        requests = proxy.counts()
    assert head == old[:1000]
    # the store refused the guarded resume (412): typed, so no caller has to read the message
    assert isinstance(info.value, ObjectChangedError), f"{type(info.value).__name__}: {info.value}"
    assert url in str(info.value)
    assert requests == {"GET": 2}, "one cut, one guarded resume, and no retry of a refusal"
