"""Launched by ``torchrun --nproc_per_node=2``: one listing per job, and exactly once over a
listing, an index in the store and a large ``from_items``, at 0/2/3 DataLoader workers started
with fork and 3 started with spawn. LIST requests are read from the proxy in front of the server
(rank 0 asks it before and after each ``list_objects`` call, between barriers).

Usage: torchrun --nproc_per_node=2 ... torchrun_scale.py OUT_DIR PROXY_URL BUCKET
"""

from __future__ import annotations

import json
import operator
import os
import sys
import urllib.request

import torch.distributed as dist
from torch.utils.data import DataLoader

import pipeflow as pf
from pipeflow.keytable import SHARE_MIN, KeyTable, keys_dir
from pipeflow.stages._onejob import on_lead
from tests.reliability import _dist

#: (DataLoader workers, start method): 2 and 3 workers split each rank's share evenly and not;
#: spawn (3 workers, the uneven split) re-creates every source from its pickle in fresh
#: interpreters. Spawn is nearly all of the launch's time (each worker imports torch), so it
#: runs once per source, not once per worker count: the split does not depend on the start method.
CASES = [(0, None), (2, "fork"), (3, "fork"), (3, "spawn")]


def lists(proxy: str) -> int:
    with urllib.request.urlopen(proxy + "/__proxy__/stats", timeout=10) as resp:
        return int(json.loads(resp.read())["lists"])


def counted(proxy: str, make):
    """``make()`` on every rank, and the LIST requests the whole job sent meanwhile."""
    dist.barrier()
    before = lists(proxy)
    pipe = make()
    dist.barrier()
    return pipe, lists(proxy) - before


def run(pipe: pf.Pipeline, workers: int, context: str | None) -> list[str]:
    loader = DataLoader(pipe, batch_size=None, num_workers=workers, multiprocessing_context=context)
    return list(loader)


def suite(proxy: str, bucket: str) -> dict[str, object]:
    url = f"s3://{bucket}/data/"
    opts = {"endpoint": proxy, "page_size": 100}
    url_of = operator.attrgetter("url")
    listing, listed = counted(proxy, lambda: pf.list_objects(url, threads=1, **opts))
    # a listing this small travels as a tuple: a table made on rank 0 takes the path of a large one
    urls = [info.url for info in listing._node.kwargs["objects"]]
    table = on_lead(lambda: KeyTable.build(urls))
    held = {"path": table.path, "inode": os.stat(table.path).st_ino,
            "files": sorted(os.listdir(keys_dir()))}
    dist.barrier()  # both ranks looked at the cache directory before anything else is made
    parallel, listed_parallel = counted(proxy, lambda: pf.list_objects(url, threads=4, **opts))
    index, listed_index = counted(proxy, lambda: pf.list_objects(
        url, manifest=f"s3://{bucket}/_index/data.pfi", **opts))
    again, listed_again = counted(proxy, lambda: pf.list_objects(
        url, manifest=f"s3://{bucket}/_index/data.pfi", **opts))
    keys = [f"k{i:07d}" for i in range(SHARE_MIN + 11)]
    # the parallel listing is the same listing (the integration tests check it key by key):
    # only its requests are counted here
    seen = {"parallel-listed": sorted(map(url_of, parallel._node.kwargs["objects"]))}
    sources = {"listing": listing.map(url_of), "index": again.map(url_of), "items": pf.from_items(keys),
               "broadcast": pf.from_items(table)}
    before = lists(proxy)
    for name, pipe in sources.items():
        for workers, context in CASES:
            seen[f"{name}-w{workers}-{context or 'main'}"] = run(pipe, workers, context)
    dist.barrier()
    return {"seen": seen, "held": held, "lists": {"listing": listed, "parallel": listed_parallel,
                                    "index_cold": listed_index, "index_warm": listed_again,
                                    "loaders": lists(proxy) - before},
            "kinds": {n: type(p._node.args[0] if n == "items" else p._node.kwargs["objects"]).__name__
                      for n, p in (("items", sources["items"]), ("index", again))}}


def main() -> int:
    out_dir, proxy, bucket = sys.argv[1:4]
    return _dist.run_suites(out_dir, {"scale": lambda: suite(proxy, bucket)}, timeout_s=120)


if __name__ == "__main__":
    sys.exit(main())
