"""Launched by ``torchrun --nproc_per_node=2``: runs many loader configurations in one launch and
writes what every rank saw to ``OUT/results.json`` (gathered to rank 0 with all_gather_object).
Besides its own suites it runs those of torchrun_loader.py (``loader``) and stats_ranks.py
(``stats``): one launch for every multi-rank test that needs no S3 server.

Usage: torchrun --nproc_per_node=2 ... torchrun_census.py OUT_DIR [SUITE ...]
"""

from __future__ import annotations

import sys
import traceback

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import pipeflow as pf
from tests.reliability import _data, _dist, stats_ranks, torchrun_loader

NUM_SHARDS = 10
WORKERS = (0, 2, 3)
SEVERAL = ("mix", "interleave", "zip")


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


def several_sources(how: str) -> pf.Pipeline:
    """Two sources combined, no shard_by_rank(): automatic sharding must split each of them."""
    keys = _data.all_keys(NUM_SHARDS)
    half = len(keys) // 2
    first, second = pf.from_items(keys[:half]), pf.from_items(keys[half:2 * half])
    if how == "mix":
        pipe = pf.mix([first, second], [1, 1], seed=7)
    elif how == "interleave":
        pipe = pf.interleave([first, second])
    else:
        pipe = first.zip(second).map(list)
    return pipe.batch(3)


def run_loader(pipe: pf.Pipeline, num_workers: int, epoch: int) -> list[list[str]]:
    pipe.set_epoch(epoch)
    loader = DataLoader(pipe, batch_size=None, num_workers=num_workers)
    return [list(batch) for batch in loader]


def suite_census() -> dict[str, object]:
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
    for how in SEVERAL:
        for nw in WORKERS:
            out[f"several-{how}-w{nw}"] = {"epoch0": run_loader(several_sources(how), nw, 0)}
    return out


def ddp_epoch(loader: DataLoader, model: torch.nn.Module) -> list[list[str]]:
    """A DDP training epoch: one gradient all_reduce per batch, as real training does."""
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    seen = []
    for batch in loader:
        keys = list(batch)
        loss = model(torch.ones(len(keys), 1)).sum()
        opt.zero_grad()
        loss.backward()  # DDP's all_reduce: hangs if the ranks disagree on the batch count
        opt.step()
        seen.append(keys)
    return seen


def suite_equalize() -> dict[str, object]:
    """Uneven data: equalize() makes every rank run the same number of DDP steps."""
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
    out: dict[str, object] = {}
    for num_shards in (10, 4):  # 4 shards < 2 ranks x 3 workers
        shards = list(_data.shard_sizes(num_shards))
        total = len(_data.all_keys(num_shards))
        for mode in ("drop", "pad"):
            for nw in WORKERS:
                pipe = (pf.from_items(shards).shuffle(len(shards), seed=5).map(_data.expand).unbatch()
                        .shuffle(16, seed=5).shard_by_rank().equalize(total=total, mode=mode)
                        .map(_data.key_of).batch(3))
                pipe.set_epoch(0)
                out[f"sample-{num_shards}-{mode}-w{nw}"] = ddp_epoch(
                    DataLoader(pipe, batch_size=None, num_workers=nw), model)
    # the total read from the source: from_items over samples, no total= needed
    for nw in WORKERS:
        pipe = (pf.from_items(_data.all_keys(4)).shuffle(8, seed=1).shard_by_rank().equalize()
                .batch(2))
        out[f"inferred-4-drop-w{nw}"] = ddp_epoch(DataLoader(pipe, batch_size=None, num_workers=nw), model)
    # a DataLoader batch_size instead of batch(): still the same number of steps per rank
    pipe = (pf.from_items(_data.all_keys(10)).shard_by_rank().equalize(mode="pad"))
    out["dataloader-batching-pad-w3"] = ddp_epoch(
        DataLoader(pipe, batch_size=4, num_workers=3, collate_fn=list), model)
    return out


def suite_empty_shard() -> dict[str, object]:
    """Shard-level sharding of 4 shards over 2 ranks x 3 workers: some workers get none."""
    shards = list(_data.shard_sizes(4))
    pipe = (pf.from_items(shards).shard_by_rank().map(_data.expand).unbatch().equalize(per_shard=5)
            .map(_data.key_of).batch(5))
    try:
        batches = [list(b) for b in DataLoader(pipe, batch_size=None, num_workers=3)]
    except Exception as exc:
        # the DataLoader's iterator sits in the error's reference cycle: freed now, it stops its
        # workers at once; left to the garbage collector, its index queues' feeder threads can be
        # stopped first, the stop message never reaches the workers and torch waits 5 s for each
        traceback.clear_frames(exc.__traceback__)
        return {"raised": type(exc).__name__, "message": str(exc)}
    return {"raised": None, "batches": batches}


def suite_resample() -> dict[str, object]:
    """resample(): every rank x worker draws its own stream of shards; shuffle(by="key") then
    shard_by_rank(by="key"): whole samples, each once across ranks and workers."""
    shards = list(_data.shard_sizes(NUM_SHARDS))
    urls = [f"s3://b/pairs/{i:03d}.{field}" for i in range(40) for field in ("image", "label")]
    out: dict[str, object] = {}
    for nw in (0, 2):
        pipe = pf.from_items(shards).resample(12, seed=3).batch(4)
        out[f"resample-w{nw}"] = {"epoch0": run_loader(pipe, nw, 0),
                                  "epoch0_again": run_loader(pipe, nw, 0),
                                  "epoch1": run_loader(pipe, nw, 1)}
        pipe = pf.from_items(urls).shuffle(8, seed=2, by="key").shard_by_rank(by="key").batch(4)
        out[f"key-shuffle-w{nw}"] = run_loader(pipe, nw, 0)
    return out



#: the global batch of the order suite: every rank batches GLOBAL_BATCH // world
GLOBAL_BATCH = 8


def order_pipeline(per_rank: int) -> pf.Pipeline:
    """A random-access source shuffled and batched: one global order at any topology."""
    return (pf.from_items(_data.all_keys(NUM_SHARDS)).shuffle(50, seed=9).map(str.upper)
            .batch(per_rank))


def suite_order() -> dict[str, object]:
    """Each rank's batches of epoch 1 with 0, 2 and 3 DataLoader workers."""
    per_rank = GLOBAL_BATCH // dist.get_world_size()
    return {f"w{nw}": run_loader(order_pipeline(per_rank), nw, 1) for nw in WORKERS}


SUITES = {"census": suite_census, "order": suite_order, "equalize": suite_equalize,
          "empty_shard": suite_empty_shard, "resample": suite_resample, "loader": torchrun_loader.run,
          "stats": stats_ranks.per_workers}


def main() -> int:
    names = sys.argv[2:] or list(SUITES)
    return _dist.run_suites(sys.argv[1], {name: SUITES[name] for name in names})


if __name__ == "__main__":
    sys.exit(main())
