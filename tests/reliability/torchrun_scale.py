"""Launched by ``torchrun --nproc_per_node=2``: the scale of the job in one launch.

``scale``: one listing per job, and exactly once over a listing, an index in the store and a large
``from_items``, at 0/2/3 DataLoader workers started with fork and 3 started with spawn. LIST
requests are read from the proxy in front of the server (rank 0 asks it before and after each
``list_objects`` call, between barriers).

``one_node``: a key table and an index in the store reach one rank a node, the other ranks of the
node map the file it writes (two ranks on one node: nothing is sent, rank 1 maps rank 0's file; the
index is downloaded once for the job). ``two_nodes``, last: the same ranks again, each claiming
``LOCAL_RANK`` 0 and its own cache directory, as ranks on two nodes would (rank 1 receives the
bytes and writes its own file).

Usage: torchrun --nproc_per_node=2 ... torchrun_scale.py OUT_DIR PROXY_URL SCALE_BUCKET PERNODE_BUCKET
"""

from __future__ import annotations

import json
import operator
import os
import sys
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

import pipeflow as pf
from pipeflow.keytable import SHARE_MIN, KeyTable, keys_dir
from pipeflow.stages import _onejob
from pipeflow.stages._onejob import on_lead, received_bytes
from tests.reliability import _dist

#: (DataLoader workers, start method): 2 and 3 workers split each rank's share evenly and not;
#: spawn (3 workers, the uneven split) re-creates every source from its pickle in fresh
#: interpreters. Spawn is nearly all of the launch's time (each worker imports torch), so it
#: runs once, not once per worker count (the split does not depend on the start method), and one
#: DataLoader reads every source (:class:`Sources`), not one DataLoader a source.
CASES = [(0, None), (2, "fork"), (3, "fork"), (3, "spawn")]


def requests(proxy: str) -> dict[str, int]:
    """Object GETs and LISTs the proxy has seen so far (a listing is a GET on the bucket)."""
    with urllib.request.urlopen(proxy + "/__proxy__/stats", timeout=10) as resp:
        stats = json.loads(resp.read())
    return {"gets": stats["requests"].get("GET", 0) - stats["lists"], "lists": stats["lists"]}


def counted(proxy: str | None, make: Callable[[], Any]) -> tuple[Any, dict[str, int], int]:
    """``make()`` on every rank; the object GETs and LISTs the whole job sent meanwhile (none
    counted without a proxy), and the table bytes this rank received from rank 0."""
    dist.barrier()
    before, got = requests(proxy) if proxy else {}, received_bytes()
    value = make()
    dist.barrier()
    after = requests(proxy) if proxy else {}
    return value, {k: after[k] - before[k] for k in after}, received_bytes() - got


def run(pipe: pf.Pipeline, workers: int, context: str | None) -> list[str]:
    loader = DataLoader(pipe, batch_size=None, num_workers=workers, multiprocessing_context=context)
    return list(loader)


class Sources(IterableDataset):
    """Several pipelines read one after another by the same DataLoader workers: every pipeline is
    still pickled, re-created and split over the workers as it would be alone, for the price of
    one set of worker start-ups. Items travel to the training process in runs of up to ``CHUNK``
    with their pipeline's name (tens of thousands of items one message each cost seconds)."""

    CHUNK = 500

    def __init__(self, pipes: dict[str, pf.Pipeline]) -> None:
        self.pipes = pipes

    def __iter__(self) -> Iterator[tuple[str, list[Any]]]:
        for name, pipe in self.pipes.items():
            run: list[Any] = []
            for item in pipe:
                run.append(item)
                if len(run) == self.CHUNK:
                    yield name, run
                    run = []
            if run:
                yield name, run


def run_each(pipes: dict[str, pf.Pipeline], workers: int, context: str | None) -> dict[str, list[Any]]:
    """What each pipeline gave, read by one DataLoader (in the order it arrived)."""
    loader = DataLoader(Sources(pipes), batch_size=None, num_workers=workers,
                        multiprocessing_context=context)
    seen: dict[str, list[Any]] = {name: [] for name in pipes}
    for name, run in loader:
        seen[name].extend(run)
    return seen


def held(table: KeyTable) -> dict[str, object]:
    """Where a table lives: its file, the file's inode, its size."""
    return {"path": table.path, "inode": os.stat(table.path).st_ino, "nbytes": table.nbytes()}


# ---- scale --------------------------------------------------------------------------------------
def scale(proxy: str, bucket: str) -> dict[str, object]:
    url = f"s3://{bucket}/data/"
    opts = {"endpoint": proxy, "page_size": 100}
    url_of = operator.attrgetter("url")
    listing, listed, _ = counted(proxy, lambda: pf.list_objects(url, threads=1, **opts))
    # a listing this small travels as a tuple: a table made on rank 0 takes the path of a large one
    urls = [info.url for info in listing._node.kwargs["objects"]]
    table = on_lead(lambda: KeyTable.build(urls))
    files = {**held(table), "files": sorted(os.listdir(keys_dir()))}
    dist.barrier()  # both ranks looked at the cache directory before anything else is made
    parallel, listed_parallel, _ = counted(proxy, lambda: pf.list_objects(url, threads=4, **opts))
    index, listed_index, _ = counted(proxy, lambda: pf.list_objects(
        url, manifest=f"s3://{bucket}/_index/data.pfi", **opts))
    again, listed_again, _ = counted(proxy, lambda: pf.list_objects(
        url, manifest=f"s3://{bucket}/_index/data.pfi", **opts))
    keys = [f"k{i:07d}" for i in range(SHARE_MIN + 11)]
    # the parallel listing is the same listing (the integration tests check it key by key):
    # only its requests are counted here
    seen = {"parallel-listed": sorted(map(url_of, parallel._node.kwargs["objects"]))}
    sources = {"listing": listing.map(url_of), "index": again.map(url_of), "items": pf.from_items(keys),
               "broadcast": pf.from_items(table)}
    before = requests(proxy)["lists"]
    for workers, context in CASES:
        for name, items in run_each(sources, workers, context).items():
            seen[f"{name}-w{workers}-{context or 'main'}"] = items
    dist.barrier()
    lists = {"listing": listed["lists"], "parallel": listed_parallel["lists"],
             "index_cold": listed_index["lists"], "index_warm": listed_again["lists"],
             "loaders": requests(proxy)["lists"] - before}
    return {"seen": seen, "held": files, "lists": lists,
            "kinds": {n: type(p._node.args[0] if n == "items" else p._node.kwargs["objects"]).__name__
                      for n, p in (("items", sources["items"]), ("index", again))}}


# ---- keys once a node ---------------------------------------------------------------------------
def one_node(proxy: str, bucket: str) -> dict[str, object]:
    url, manifest = f"s3://{bucket}/data/", f"s3://{bucket}/_index/data.pfi"
    keys = [f"train/{i:07d}.jpg" for i in range(5_000)]
    table, _, got_table = counted(proxy, lambda: on_lead(lambda: KeyTable.build(keys)))
    opts = {"endpoint": proxy, "page_size": 100, "threads": 1}
    _, cold, _ = counted(proxy, lambda: pf.list_objects(url, manifest=manifest, **opts))
    pipe, warm, got_index = counted(proxy, lambda: pf.list_objects(url, manifest=manifest, **opts))
    index = pipe._node.kwargs["objects"]
    seen = run(pipe.map(url_of_object), 2, "fork")
    return {"table": held(table), "table_equal": list(table) == keys, "received_table": got_table,
            "index": held(index), "received_index": got_index, "cold": cold, "warm": warm,
            "seen": seen}


def url_of_object(info: Any) -> str:
    return str(info.url)


def two_nodes(out_dir: str) -> dict[str, object]:
    """Each rank as if alone on its node: a local rank 0 with its own cache (the ranks that receive
    are found again: what a process group does on its first call). It changes this process for
    good, so it runs last."""
    os.environ["LOCAL_RANK"] = "0"
    os.environ["XDG_CACHE_HOME"] = os.path.join(out_dir, f"node{dist.get_rank()}")
    _onejob._leaders.clear()
    keys = [f"val/{i:06d}.png" for i in range(3_000)]
    table, _, got = counted(None, lambda: on_lead(lambda: KeyTable.build(keys)))
    return {"table": held(table), "table_equal": list(table) == keys, "received_table": got,
            "cache": os.environ["XDG_CACHE_HOME"]}


def main() -> int:
    out_dir, proxy, scale_bucket, pernode_bucket = sys.argv[1:5]
    suites = {"scale": lambda: scale(proxy, scale_bucket),
              "one_node": lambda: one_node(proxy, pernode_bucket),
              "two_nodes": lambda: two_nodes(out_dir)}  # last: it makes each rank a node of its own
    return _dist.run_suites(out_dir, suites, timeout_s=120)


if __name__ == "__main__":
    sys.exit(main())
