"""The ``stats`` suite of the shared torchrun launch (torchrun_census.py): pipe.stats() on each
rank and summed over ranks, with 0, 2 and 3 DataLoader workers."""

from __future__ import annotations

from torch.utils.data import DataLoader

import pipeflow as pf

ITEMS = 120


def per_workers() -> dict[str, object]:
    """What this rank delivered and what stats() says, locally and over all ranks, per worker count."""
    mine: dict[str, object] = {}
    for workers in (0, 2, 3):
        pipe = pf.from_items(range(ITEMS)).map(abs).batch(4)
        delivered = sum(len(b) for b in DataLoader(pipe, batch_size=None, num_workers=workers))
        local, every = pipe.stats(), pipe.stats(all_ranks=True)
        mine[f"w{workers}"] = {"delivered": delivered, "local_items": local["map"]["items"],
                               "all_items": every["map"]["items"], "all_processes": every.processes,
                               "bottleneck": every.bottleneck}
    return mine
