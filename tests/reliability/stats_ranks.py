"""Launched by ``torchrun --nproc_per_node=2``: pipe.stats() on each rank and summed over ranks,
with 0, 2 and 3 DataLoader workers; rank 0 writes OUT/results.json.

Usage: torchrun --nproc_per_node=2 ... stats_ranks.py OUT_DIR
"""

from __future__ import annotations

import datetime
import json
import os
import sys

import torch.distributed as dist
from torch.utils.data import DataLoader

import pipeflow as pf

ITEMS = 120


def main() -> int:
    out_dir = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    mine: dict[str, object] = {}
    for workers in (0, 2, 3):
        pipe = pf.from_items(range(ITEMS)).map(abs).batch(4)
        delivered = sum(len(b) for b in DataLoader(pipe, batch_size=None, num_workers=workers))
        local, every = pipe.stats(), pipe.stats(all_ranks=True)
        mine[f"w{workers}"] = {"delivered": delivered, "local_items": local["map"]["items"],
                               "all_items": every["map"]["items"], "all_processes": every.processes,
                               "bottleneck": every.bottleneck}
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        tmp = os.path.join(out_dir, "results.json.tmp")
        with open(tmp, "w") as fh:
            json.dump({"world_size": dist.get_world_size(), "ranks": gathered}, fh)
        os.replace(tmp, os.path.join(out_dir, "results.json"))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
