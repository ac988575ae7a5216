"""The disk cache in front of the real local S3 server, with every request counted by the proxy."""

from __future__ import annotations

import pytest
import torch.utils.data

import pipeflow as pf
from pipeflow.testing.proxy import DelayProxy

pytestmark = pytest.mark.s3


def _objects() -> dict[str, bytes]:
    return {f"cached/{i:03d}.bin": bytes([i]) * (300 + 37 * i) for i in range(12)}


@pytest.mark.parametrize("workers", [0, 3])
def test_a_cached_epoch_sends_no_request_of_any_method(s3, s3_bucket, tmp_path, workers):
    objects = _objects()
    urls = s3.put_many(s3_bucket, objects)
    expected = [objects[url.split(f"s3://{s3_bucket}/", 1)[1]] for url in urls]
    with DelayProxy(s3.endpoint, delay_ms=0) as proxy:
        pipe = pf.from_items(urls).cache(str(tmp_path / "cache"), max_bytes=1 << 20, backend="boto3",
                                         workers=workers, backend_options={"endpoint": proxy.url})
        assert [r.data for r in pipe] == expected
        assert proxy.counts().get("GET", 0) >= len(urls), "the first epoch reads through the proxy"
        proxy.reset_counts()
        assert [r.data for r in pipe] == expected
        # not only no GET: no HEAD, no listing, nothing that revalidates a cached copy
        assert proxy.counts() == {}


def test_dataloader_workers_send_no_request_once_cached(s3, s3_bucket, tmp_path):
    objects = _objects()
    urls = s3.put_many(s3_bucket, objects)
    with DelayProxy(s3.endpoint, delay_ms=0) as proxy:
        pipe = (pf.from_items(urls).cache(str(tmp_path / "cache"), max_bytes=1 << 20, backend="boto3",
                                          backend_options={"endpoint": proxy.url})
                .map(lambda r: (r.url, r.data)))
        loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2)
        pipe.set_epoch(0)
        first = dict(loader)
        proxy.reset_counts()
        pipe.set_epoch(1)
        assert dict(loader) == first == {u: objects[u.split(f"s3://{s3_bucket}/", 1)[1]] for u in urls}
        assert proxy.counts() == {}
