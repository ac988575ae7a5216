"""The ``loader`` suite of the shared torchrun launch (torchrun_census.py): Pipeline.loader() in
each rank's training process (no DataLoader workers)."""

from __future__ import annotations

import json

import torch

import pipeflow as pf
from tests.reliability import _data

NUM_SHARDS = 10


def pipeline(shuffle: bool) -> pf.Pipeline:
    """Automatic sharding (no shard_by_rank()): sample-level over ranks, no worker split."""
    pipe = pf.from_items([{"__key__": key} for key in _data.all_keys(NUM_SHARDS)])
    if shuffle:
        pipe = pipe.shuffle(32, seed=11)
    return pipe.map(_data.slow_identity, workers=2).map(_data.key_of)


def batches(loader: pf.Pipeline, stop: int | None = None) -> list[list[str]]:
    out = []
    for batch in loader:
        out.append(list(batch))
        if stop is not None and len(out) == stop:
            break
    return out


def ddp_steps(loader, model: torch.nn.Module) -> int:
    """One gradient all_reduce per batch: both ranks must agree on the number of steps."""
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    steps = 0
    for batch in loader:
        model(torch.ones(len(batch), 1)).sum().backward()
        opt.step()
        steps += 1
    return steps


def run() -> dict[str, object]:
    out: dict[str, object] = {}
    for shuffle in (False, True):
        name = "shuffled" if shuffle else "ordered"
        loader = pipeline(shuffle).loader(batch_size=4, collate=False)
        out[name] = {"epoch0": batches(loader), "epoch1": batches(loader),
                     "direct": [list(b) for b in pipeline(shuffle).batch(4)]}
        # save after 3 batches, resume in a fresh loader: the rest of this rank's epoch
        first = pipeline(shuffle).loader(batch_size=4, collate=False)
        head = batches(first, 3)
        state = json.loads(json.dumps(first.state_dict()))
        first.close()
        resumed = pipeline(shuffle).loader(batch_size=4, collate=False)
        resumed.load_state_dict(state)
        out[name]["resumed"] = head + batches(resumed)
    loader = pipeline(False).equalize(total=len(_data.all_keys(NUM_SHARDS))).loader(batch_size=4)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
    out["ddp_steps"] = ddp_steps(loader, model)
    stats = loader.stats(all_ranks=True)
    out["stats"] = {"batches_all_ranks": stats["batch"]["items"],
                    "local_batches": loader.stats()["batch"]["items"]}
    return out
