"""Launched by ``torchrun --nproc_per_node=2``: a key table and an index in the store reach one
rank a node, the other ranks of the node map the file it writes.

First as launched (two ranks on one node: nothing is sent, rank 1 maps rank 0's file; the index is
downloaded once for the job), then again with every rank claiming ``LOCAL_RANK`` 0 and its own
cache directory, as ranks on two nodes would (rank 1 receives the bytes and writes its own file).

Usage: torchrun --nproc_per_node=2 ... torchrun_pernode.py OUT_DIR PROXY_URL BUCKET
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import traceback
import urllib.request

import torch.distributed as dist
from torch.utils.data import DataLoader

import pipeflow as pf
from pipeflow.keytable import KeyTable
from pipeflow.stages import _onejob
from pipeflow.stages._onejob import on_lead, received_bytes


def requests(proxy: str) -> dict[str, int]:
    with urllib.request.urlopen(proxy + "/__proxy__/stats", timeout=10) as resp:
        stats = json.loads(resp.read())
    return {"gets": stats["requests"].get("GET", 0) - stats["lists"], "lists": stats["lists"]}


def counted(proxy: str, make):
    """``make()`` on every rank; the object GETs and LISTs the whole job sent meanwhile, and the
    table bytes this rank received from rank 0."""
    dist.barrier()
    before, got = requests(proxy), received_bytes()
    value = make()
    dist.barrier()
    after = requests(proxy)
    return value, {k: after[k] - before[k] for k in after}, received_bytes() - got


def held(table: KeyTable) -> dict[str, object]:
    return {"path": table.path, "inode": os.stat(table.path).st_ino, "nbytes": table.nbytes()}


def one_node(proxy: str, bucket: str) -> dict[str, object]:
    url, manifest = f"s3://{bucket}/data/", f"s3://{bucket}/_index/data.pfi"
    keys = [f"train/{i:07d}.jpg" for i in range(5_000)]
    table, _, got_table = counted(proxy, lambda: on_lead(lambda: KeyTable.build(keys)))
    opts = {"endpoint": proxy, "page_size": 100, "threads": 1}
    _, cold, _ = counted(proxy, lambda: pf.list_objects(url, manifest=manifest, **opts))
    pipe, warm, got_index = counted(proxy, lambda: pf.list_objects(url, manifest=manifest, **opts))
    index = pipe._node.kwargs["objects"]
    seen = list(DataLoader(pipe.map(lambda o: o.url), batch_size=None, num_workers=2,
                           multiprocessing_context="fork"))
    return {"table": held(table), "table_equal": list(table) == keys, "received_table": got_table,
            "index": held(index), "received_index": got_index, "cold": cold, "warm": warm,
            "seen": seen}


def two_nodes(out_dir: str) -> dict[str, object]:
    keys = [f"val/{i:06d}.png" for i in range(3_000)]
    table, _, got = counted_local(lambda: on_lead(lambda: KeyTable.build(keys)))
    return {"table": held(table), "table_equal": list(table) == keys, "received_table": got,
            "cache": os.environ["XDG_CACHE_HOME"]}


def counted_local(make):
    dist.barrier()
    got = received_bytes()
    value = make()
    dist.barrier()
    return value, None, received_bytes() - got


def guarded(work, *args):
    try:
        return {"ok": True, "data": work(*args)}
    except Exception as exc:  # reported, so the test shows which rank failed and why
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


def main() -> int:
    out_dir, proxy, bucket = sys.argv[1:4]
    timeout = datetime.timedelta(seconds=120)
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    results: dict[str, object] = {"world_size": world}
    local = guarded(one_node, proxy, bucket)
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, local)
    results["one_node"] = gathered
    dist.barrier()
    # the same ranks as if each were alone on its node: each a local rank 0, each its own cache
    # (the ranks that receive are found again: what a process group does on its first call)
    os.environ["LOCAL_RANK"] = "0"
    os.environ["XDG_CACHE_HOME"] = os.path.join(out_dir, f"node{rank}")
    _onejob._leaders.clear()
    local = guarded(two_nodes, out_dir)
    gathered = [None] * world
    dist.all_gather_object(gathered, local)
    results["two_nodes"] = gathered
    if rank == 0:
        tmp = os.path.join(out_dir, "results.json.tmp")
        with open(tmp, "w") as fh:
            json.dump(results, fh)
        os.replace(tmp, os.path.join(out_dir, "results.json"))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
