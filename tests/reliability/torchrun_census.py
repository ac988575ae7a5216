"""Launched by ``torchrun --nproc_per_node=2``: runs many loader configurations in one launch and
writes what every rank saw to ``OUT/results.json`` (gathered to rank 0 with all_gather_object).

Usage: torchrun --nproc_per_node=2 ... torchrun_census.py OUT_DIR [SUITE ...]
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import traceback

import torch.distributed as dist
from torch.utils.data import DataLoader

import pipeflow as pf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.reliability import _data  # noqa: E402

NUM_SHARDS = 10
WORKERS = (0, 2, 3)


def census_pipeline(level: str, shuffle: bool, shards: list[str]) -> pf.Pipeline:
    pipe = pf.from_items(shards)
    if level == "auto":  # no shard_by_rank(): pipeflow shards the source itself
        pipe = pf.from_items([s for shard in shards for s in _data.expand(shard)])
        if shuffle:
            pipe = pipe.shuffle(32, seed=11)
    else:
        if shuffle:
            pipe = pipe.shuffle(len(shards), seed=11)  # shard-level shuffle, identical on every rank
        if level == "shard":
            pipe = pipe.shard_by_rank()
        pipe = pipe.map(_data.expand).unbatch()
        if shuffle:
            pipe = pipe.shuffle(16, seed=11)
        if level == "sample":
            pipe = pipe.shard_by_rank()
    return pipe.map(_data.slow_identity, workers=2).prefetch(2).map(_data.key_of).batch(4)


def run_loader(pipe: pf.Pipeline, num_workers: int, epoch: int) -> list[list[str]]:
    pipe.set_epoch(epoch)
    loader = DataLoader(pipe, batch_size=None, num_workers=num_workers)
    return [list(batch) for batch in loader]


def suite_census(rank: int) -> dict[str, object]:
    shards = list(_data.shard_sizes(NUM_SHARDS))
    out: dict[str, object] = {}
    for level in ("shard", "sample", "auto"):
        for shuffle in (False, True):
            for nw in WORKERS:
                pipe = census_pipeline(level, shuffle, shards)
                name = f"{level}-{'shuffled' if shuffle else 'ordered'}-w{nw}"
                runs = {"epoch0": run_loader(pipe, nw, 0)}
                if shuffle:
                    runs["epoch0_again"] = run_loader(pipe, nw, 0)
                    runs["epoch1"] = run_loader(pipe, nw, 1)
                out[name] = runs
    return out


SUITES = {"census": suite_census}


def main() -> int:
    out_dir = sys.argv[1]
    suites = sys.argv[2:] or list(SUITES)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    results: dict[str, object] = {"world_size": world}
    for suite in suites:
        try:
            local = {"ok": True, "data": SUITES[suite](rank)}
        except Exception as exc:  # reported, so the test shows which rank failed and why
            local = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                     "traceback": traceback.format_exc()}
        gathered: list[object] = [None] * world
        dist.all_gather_object(gathered, local)
        results[suite] = gathered
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
