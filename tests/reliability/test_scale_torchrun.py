"""One listing per job and exactly once over a listing, an index and a large ``from_items``,
under ``torchrun --nproc_per_node=2`` x DataLoader workers {0, 2, 3} started with fork, and 3
started with spawn.

The objects sit in the real local S3 server behind the counting proxy; one torchrun launch runs
every case (see torchrun_scale.py)."""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeflow.keytable import SHARE_MIN
from pipeflow.testing.proxy import DelayProxy

from ._launch import torchrun
from .conftest import suite
from .torchrun_scale import CASES

pytestmark = [pytest.mark.torchrun, pytest.mark.s3, pytest.mark.slow, pytest.mark.timeout(420)]

N = 1234  # 13 pages of 100


@pytest.fixture(scope="module")
def scale(s3, tmp_path_factory):
    bucket = s3.make_bucket("scale-torchrun")
    client = s3.client()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: client.put_object(Bucket=bucket, Key=f"data/{i:05d}.bin", Body=b"x"),
                      range(N)))
    out = tmp_path_factory.mktemp("scale")
    with DelayProxy(s3.endpoint, delay_ms=1) as proxy:
        results = torchrun("torchrun_scale.py", out, proxy.url, bucket, timeout=400,
                           env={"XDG_CACHE_HOME": str(out / "cache")})
    assert results["world_size"] == 2
    keys = out / "cache" / "pipeflow" / "keys"
    left = os.listdir(keys) if keys.exists() else []
    return bucket, suite(results, "scale"), left


def test_the_ranks_of_a_node_map_one_file_and_leave_none(scale):
    _, ranks, left = scale
    held = [r["held"] for r in ranks]
    assert held[0]["path"] == held[1]["path"] and held[0]["inode"] == held[1]["inode"]
    assert [h["files"] for h in held] == [[os.path.basename(held[0]["path"])]] * 2  # no copy per rank
    assert left == []  # every table of the job went with it


def test_the_job_lists_once_not_once_per_rank(scale):
    _, ranks, _ = scale
    counts = ranks[0]["lists"]
    assert counts["listing"] == 13  # one serial chain, on rank 0 only (two ranks would send 26)
    # several chains: at most one request more a cut (cuts <= threads), never one listing a rank
    assert 13 <= counts["parallel"] <= 13 + 4 < 2 * 13
    assert 13 <= counts["index_cold"] <= 13 + 8 < 2 * 13  # the first job lists, writes the index ...
    assert counts["index_warm"] == 0  # ... later jobs read it
    assert counts["loaders"] == 0  # DataLoader workers never list


def test_large_key_sets_travel_as_shared_tables(scale):
    _, ranks, _ = scale
    assert all(r["kinds"] == {"items": "KeyTable", "index": "KeyTable"} for r in ranks)


def test_the_parallel_listing_is_the_listing(scale):
    bucket, ranks, _ = scale
    assert all(r["seen"]["parallel-listed"] == [f"s3://{bucket}/data/{i:05d}.bin" for i in range(N)]
               for r in ranks)


@pytest.mark.parametrize("source", ["listing", "index", "items", "broadcast"])
@pytest.mark.parametrize("case", [f"w{w}-{c or 'main'}" for w, c in CASES])
def test_every_key_exactly_once_across_ranks_and_workers(scale, source, case):
    bucket, ranks, _ = scale
    if source == "items":
        expected = [f"k{i:07d}" for i in range(SHARE_MIN + 11)]
    else:
        expected = [f"s3://{bucket}/data/{i:05d}.bin" for i in range(N)]
    per_rank = [r["seen"][f"{source}-{case}"] for r in ranks]
    counts = Counter(k for keys in per_rank for k in keys)
    assert sorted(counts) == expected and set(counts.values()) == {1}
    assert all(per_rank)
