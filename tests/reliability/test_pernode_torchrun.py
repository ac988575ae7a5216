"""Keys are sent once per node, not once per rank: under ``torchrun --nproc_per_node=2`` a key
table made on rank 0 and an index read from the store reach one rank of each node, which writes
the node's file; the other ranks of the node map it (see torchrun_pernode.py)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeflow.testing.proxy import DelayProxy

from ._launch import torchrun
from .conftest import suite

pytestmark = [pytest.mark.torchrun, pytest.mark.s3, pytest.mark.slow, pytest.mark.timeout(300)]

N = 250


@pytest.fixture(scope="module")
def pernode(s3, tmp_path_factory):
    bucket = s3.make_bucket("pernode-torchrun")
    client = s3.client()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: client.put_object(Bucket=bucket, Key=f"data/{i:05d}.bin", Body=b"x"),
                      range(N)))
    out = tmp_path_factory.mktemp("pernode")
    with DelayProxy(s3.endpoint, delay_ms=1) as proxy:
        results = torchrun("torchrun_pernode.py", out, proxy.url, bucket, timeout=280,
                           env={"XDG_CACHE_HOME": str(out / "cache")})
    assert results["world_size"] == 2
    left = [f for d in ("cache", "node0", "node1") if (out / d / "pipeflow" / "keys").exists()
            for f in os.listdir(out / d / "pipeflow" / "keys")]
    return suite(results, "one_node"), suite(results, "two_nodes"), left, bucket


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
    assert seen == [f"s3://{bucket}/data/{i:05d}.bin" for i in range(N)]


def test_one_rank_a_node_receives_the_bytes_and_writes_its_nodes_file(pernode):
    _, ranks, left, _ = pernode
    assert all(r["table_equal"] for r in ranks)
    assert ranks[0]["received_table"] == 0
    assert ranks[1]["received_table"] == ranks[1]["table"]["nbytes"] > 0  # once, the whole file
    assert ranks[0]["table"]["path"] != ranks[1]["table"]["path"]  # each node its own file
    assert all(r["table"]["path"].startswith(r["cache"]) for r in ranks)
    assert left == []  # every node's file went with the job
