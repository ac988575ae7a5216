"""The verdict names an open() over high latency with too few requests in flight."""

from __future__ import annotations

import pytest

import pipeflow as pf
from pipeflow.testing.proxy import DelayProxy

pytestmark = pytest.mark.s3


def test_verdict_open_over_latency_wants_more_requests_in_flight(s3, s3_bucket, monkeypatch):
    urls = s3.put_many(s3_bucket, {f"o/{i:03d}.bin": bytes([i]) * 2048 for i in range(40)})
    with DelayProxy(s3.endpoint, delay_ms=40) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        pipe = pf.from_items(urls).open(workers=2, read=True).map(len).batch(4)
        assert sum(len(b) for b in pipe) == 40
    stats = pipe.stats()
    assert stats.bottleneck == "open", str(stats)
    assert stats.advice.startswith("more requests in flight")
    assert stats["open"]["workers"] == 2 and stats["open"]["items"] == 40


def test_open_counts_requests_and_bytes(s3, s3_bucket):
    urls = s3.put_many(s3_bucket, {f"c/{i}.bin": b"x" * (100 + i) for i in range(10)})
    pipe = pf.from_items(urls).open(workers=3, read=True)
    assert len(list(pipe)) == 10
    counters = pipe.stats().counters("open")
    assert counters["requests"] == 10
    assert counters["bytes"] == sum(100 + i for i in range(10))
