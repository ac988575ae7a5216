"""Launched by test_elastic_torchrun.py: one phase of a save on one topology and resumes on
others, states collected with ``gather_object`` and merged on rank 0, as a training script would.

Usage: torchrun --nproc_per_node=N ... torchrun_elastic.py OUT_DIR PHASE SHARED_DIR
  save2x2 (N=2): save after a few batches on 2 ranks x 2 workers.
  mid (N=3):     resume the 2x2 save on 3 x 1; save on 3 x 1.
  last (N=2):    resume the 2x2 save on 2 x 0; resume the 3x1 save on 2 x 2.
"""

from __future__ import annotations

import functools
import json
import os
import sys

import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader

import pipeflow as pf
from tests.reliability import _data, _dist

EPOCH = 1
#: (name, pipeline kind, shuffled)
CASES = (("ordered", "census", False), ("shuffled", "census", True), ("tar", "tar", True))


def tar_paths(shared: str) -> list[str]:
    folder = os.path.join(shared, "tars")
    return sorted(os.path.join(folder, n) for n in os.listdir(folder))


def tar_pipeline(shared: str) -> pf.Pipeline:
    """The webdataset shape on local tar files: shard shuffle, open, untar, group, decode, shuffle."""
    paths = tar_paths(shared)
    return (pf.from_items(paths).shuffle(len(paths), seed=4).shard_by_rank().open(workers=2).untar()
            .group_pairs(required=["bin", "cls"]).decode(handlers={"cls": "bytes"})
            .map(functools.partial(_data.check_sample, size=300)).shuffle(12, seed=4).batch(3))


def make(kind: str, shuffle: bool, shared: str) -> pf.Pipeline:
    return tar_pipeline(shared) if kind == "tar" else pipeline(shuffle)


def pipeline(shuffle: bool) -> pf.Pipeline:
    shards = list(_data.shard_sizes(10))
    pipe = pf.from_items(shards)
    if shuffle:
        pipe = pipe.shuffle(len(shards), seed=7)
    pipe = pipe.shard_by_rank().map(_data.expand).unbatch().map(_data.slow_identity, workers=2)
    if shuffle:
        pipe = pipe.shuffle(16, seed=7)
    return pipe.map(_data.key_of).batch(3)


def save(pipe: pf.Pipeline, workers: int, batches: int, shared: str, name: str) -> list[str]:
    """Deliver ``batches`` (+rank) batches, then merge every rank's loader state on rank 0."""
    pipe.set_epoch(EPOCH)
    loader = StatefulDataLoader(pipe, batch_size=None, num_workers=workers)
    keys: list[str] = []
    for n, batch in enumerate(loader):
        keys += batch
        if n + 1 >= batches + dist.get_rank():
            break
    state = loader.state_dict()
    del loader  # ends its workers, as a job that is stopped would
    states: list[object] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(state, states, dst=0)
    if dist.get_rank() == 0:
        merged = pf.merge_states(states)  # type: ignore[arg-type]
        with open(os.path.join(shared, f"{name}.json"), "w") as fh:
            json.dump(merged, fh)
    dist.barrier()
    return keys


def resume(pipe: pf.Pipeline, workers: int, shared: str, name: str) -> list[str]:
    with open(os.path.join(shared, f"{name}.json")) as fh:
        merged = json.load(fh)
    pipe = pipe.resume_from(merged)
    loader = StatefulDataLoader(pipe, batch_size=None, num_workers=workers)
    return [key for batch in loader for key in batch]


def phase(name: str, shared: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for tag, kind, shuffle in CASES:
        def pipe() -> pf.Pipeline:
            return make(kind, shuffle, shared)  # noqa: B023 - used within this iteration

        if name == "save2x2":
            out[f"save2x2-{tag}"] = save(pipe(), 2, 2, shared, f"save2x2-{tag}")
        elif name == "mid":
            out[f"save2x2-{tag}-on-3x1"] = resume(pipe(), 1, shared, f"save2x2-{tag}")
            out[f"save3x1-{tag}"] = save(pipe(), 1, 3, shared, f"save3x1-{tag}")
        else:
            out[f"save2x2-{tag}-on-2x0"] = resume(pipe(), 0, shared, f"save2x2-{tag}")
            out[f"save3x1-{tag}-on-2x2"] = resume(pipe(), 2, shared, f"save3x1-{tag}")
    return out


def main() -> int:
    out_dir, name, shared = sys.argv[1:4]
    _dist.init()
    # not caught: a rank that fails inside a save's collectives ends the launch (torchrun stops the
    # other rank at once), where a reported error would leave the other rank waiting in them
    _dist.write_results(out_dir, {"ranks": _dist.gather(phase(name, shared))})
    return _dist.finish()


if __name__ == "__main__":
    sys.exit(main())
