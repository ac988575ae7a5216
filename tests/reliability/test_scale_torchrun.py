"""The scale of the job under ``torchrun --nproc_per_node=2``, one launch (torchrun_scale.py).

One listing per job and exactly once over a listing, an index and a large ``from_items``, at
DataLoader workers {0, 2, 3} started with fork, and 3 started with spawn: the objects sit in the
real local S3 server behind the counting proxy.

Keys are sent once per node, not once per rank: a key table made on rank 0 and an index read from
the store reach one rank of each node, which writes the node's file; the other ranks of the node
map it.
"""

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

pytestmark = [pytest.mark.torchrun, pytest.mark.s3, pytest.mark.slow, pytest.mark.timeout(480)]

N = 1234  # 13 pages of 100
PERNODE_N = 250  # 3 pages of 100


def _put(client, bucket, count):
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: client.put_object(Bucket=bucket, Key=f"data/{i:05d}.bin", Body=b"x"),
                      range(count)))


@pytest.fixture(scope="module")
def launch(s3, tmp_path_factory):
    """Every suite of torchrun_scale.py, one launch: results, buckets, the tables left behind."""
    buckets = s3.make_bucket("scale-torchrun"), s3.make_bucket("pernode-torchrun")
    for bucket, count in zip(buckets, (N, PERNODE_N)):
        _put(s3.client(), bucket, count)
    out = tmp_path_factory.mktemp("scale")
    with DelayProxy(s3.endpoint, delay_ms=1) as proxy:
        results = torchrun("torchrun_scale.py", out, proxy.url, *buckets, timeout=400,
                           env={"XDG_CACHE_HOME": str(out / "cache")})
    assert results["world_size"] == 2
    left = [f for d in ("cache", "node0", "node1") if (out / d / "pipeflow" / "keys").exists()
            for f in os.listdir(out / d / "pipeflow" / "keys")]
    return results, buckets, left


@pytest.fixture(scope="module")
def scale(launch):
    results, (bucket, _), left = launch
    return bucket, suite(results, "scale"), left


@pytest.fixture(scope="module")
def pernode(launch):
    results, (_, bucket), left = launch
    return suite(results, "one_node"), suite(results, "two_nodes"), left, bucket


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


# ---- keys once a node --------------------------------------------------------------------------
def test_ranks_of_one_node_receive_no_table_and_map_one_file(pernode):
    ranks, _, _, _ = pernode
    assert all(r["table_equal"] for r in ranks)
    assert [r["received_table"] for r in ranks] == [0, 0]  # rank 0 made it; rank 1 maps its file
    assert ranks[0]["table"] == ranks[1]["table"]  # one path, one inode


def test_an_index_in_the_store_is_downloaded_once_and_mapped_by_the_node(pernode):
    ranks, _, _, bucket = pernode
    cold, warm = ranks[0]["cold"], ranks[0]["warm"]
    assert cold["lists"] == 3  # rank 0 lists 250 objects in pages of 100, once for the job
    assert warm == {"gets": 1, "lists": 0}  # one GET of the index for the job, not one a rank
    assert [r["received_index"] for r in ranks] == [0, 0]
    assert ranks[0]["index"] == ranks[1]["index"]
    seen = sorted(u for r in ranks for u in r["seen"])  # and it reads as the listing: exactly once
    assert seen == [f"s3://{bucket}/data/{i:05d}.bin" for i in range(PERNODE_N)]


def test_one_rank_a_node_receives_the_bytes_and_writes_its_nodes_file(pernode):
    _, ranks, left, _ = pernode
    assert all(r["table_equal"] for r in ranks)
    assert ranks[0]["received_table"] == 0
    assert ranks[1]["received_table"] == ranks[1]["table"]["nbytes"] > 0  # once, the whole file
    assert ranks[0]["table"]["path"] != ranks[1]["table"]["path"]  # each node its own file
    assert all(r["table"]["path"].startswith(r["cache"]) for r in ranks)
    assert left == []  # every node's file went with the job
