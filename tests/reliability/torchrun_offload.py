"""Launched by ``torchrun --nproc_per_node=2``: each rank offloads the same prefix to one Ray
cluster (two workers per rank) and trains on its share with ``Pipeline.loader()``. Writes what
every rank received to ``OUT/results.json``.

Usage: torchrun --nproc_per_node=2 ... torchrun_offload.py OUT_DIR RAY_ADDRESS
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import traceback

import torch.distributed as dist

import pipeflow as pf

N = 96
UNIT = 4  # per-rank batch: a global step of 8 places


def tag(batch):
    return {"pid": os.getpid(), "items": batch}


def run(address: str) -> dict[str, object]:
    prefix = pf.from_items(range(N)).shuffle(16, seed=3).batch(UNIT).map(tag)
    loader = prefix.offload(workers=2, cpus=0.5, address=address).loader(batch_size=None, collate=False)
    got = [{"pid": b["pid"], "items": list(b["items"])} for b in loader]
    return {"batches": [b["items"] for b in got], "pids": sorted({b["pid"] for b in got}),
            "trainer_pid": os.getpid()}


def main() -> int:
    out_dir, address = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=170))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        local = {"ok": True, "data": run(address)}
    except Exception as exc:  # reported, so the test shows which rank failed and why
        local = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, local)
    if rank == 0:
        tmp = os.path.join(out_dir, "results.json.tmp")
        with open(tmp, "w") as fh:
            json.dump({"world_size": world, "offload": gathered}, fh)
        os.replace(tmp, os.path.join(out_dir, "results.json"))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
