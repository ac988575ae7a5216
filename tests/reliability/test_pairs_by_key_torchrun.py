"""One object per sample on 2 ranks (torchrun, gloo) x DataLoader workers: every sample exactly
once and whole, every object fetched exactly once (GETs counted at the proxy)."""

from __future__ import annotations

from collections import Counter

import pytest

from pipeflow.testing.proxy import DelayProxy

from ._launch import torchrun

pytestmark = [pytest.mark.torchrun, pytest.mark.s3, pytest.mark.timeout(360)]

SAMPLES = 24
CONFIGS = ("auto-w0", "auto-w2", "shard_by_rank-w2", "key-w3")


def test_pairs_sharded_by_key_across_ranks_and_workers(s3, tmp_path):
    bucket = s3.make_bucket("pairs-torchrun")
    objects = {}
    for i in range(SAMPLES):
        objects[f"pairs/{i:04d}.image"] = f"image {i}".encode()
        objects[f"pairs/{i:04d}.label"] = str(i).encode()
    s3.put_many(bucket, objects)
    with DelayProxy(s3.endpoint, delay_ms=0) as proxy:
        results = torchrun("pairs_by_key_torchrun.py", tmp_path, f"s3://{bucket}/pairs/", timeout=300,
                           env={"AWS_ENDPOINT_URL": proxy.url, "AWS_ENDPOINT_URL_S3": proxy.url})
        stats = proxy.stats()
    assert results["world_size"] == 2
    expected = [f"s3://{bucket}/pairs/{i:04d}" for i in range(SAMPLES)]
    for name in CONFIGS:
        per_rank = results[name]
        for rank, part in enumerate(per_rank):
            assert part["ok"], f"rank {rank} failed in {name}: {part['error']}\n{part['traceback']}"
        counts = Counter(k for part in per_rank for k in part["data"])
        assert sorted(counts) == expected and set(counts.values()) == {1}, name
        assert all(part["data"] for part in per_rank), f"{name}: a rank got nothing"
    object_gets = int(stats["requests"].get("GET", 0)) - int(stats.get("lists", 0))
    assert object_gets == len(CONFIGS) * 2 * SAMPLES, stats
