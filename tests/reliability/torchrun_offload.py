"""Launched by ``torchrun --nproc_per_node=2``: each rank offloads a prefix to one Ray cluster and
trains on its share with ``Pipeline.loader()``. Writes what every rank received to
``OUT/results.json`` (through :mod:`tests.reliability._dist`).

Suites:

* ``offload``: one epoch, two cluster workers per rank (the source is read by assignment):
  global step *k* of both ranks is the prefix's *k*-th batch.
* ``save``: each rank takes ``SAVE_AT`` batches of the same prefix (its ``shard_by_rank()``
  makes a state resumable at any number of ranks; the cluster workers the first epoch kept
  serve it) and returns them with its loader's ``state_dict()``: the test merges the two states
  and resumes them on one rank.
* ``resume``: each rank resumes the merged state in ``MERGED`` (saved by one rank with one
  cluster worker) with two cluster workers per rank, and returns what it received.

Usage: torchrun --nproc_per_node=2 ... torchrun_offload.py OUT_DIR RAY_ADDRESS MERGED
"""

from __future__ import annotations

import json
import os
import sys

import pipeflow as pf
from tests.reliability import _dist

N = 96
UNIT = 4  # per-rank batch: a global step of 8 places
SAVE_AT = 5  # batches each rank takes before its checkpoint


def tag(batch):
    return {"pid": os.getpid(), "items": batch}


def elastic_prefix() -> pf.Pipeline:
    """The prefix every suite offloads (the test builds the same one)."""
    return pf.from_items(range(N)).shuffle(16, seed=5).shard_by_rank().batch(UNIT).map(tag)


#: one description for the first two suites: the cluster workers of an epoch that ended
#: normally wait for the next pipeline over it (a new one is a new process importing torch)
PREFIX = elastic_prefix()


def suite_offload(address: str) -> dict[str, object]:
    loader = PREFIX.offload(workers=2, cpus=0.5, address=address).loader(batch_size=None, collate=False)
    got = [{"pid": b["pid"], "items": list(b["items"])} for b in loader]
    return {"batches": [b["items"] for b in got], "pids": sorted({b["pid"] for b in got}),
            "trainer_pid": os.getpid()}


def suite_save(address: str) -> dict[str, object]:
    loader = PREFIX.offload(workers=2, cpus=0.5, address=address).loader(batch_size=None, collate=False)
    it = iter(loader)
    got = [next(it) for _ in range(SAVE_AT)]
    state = loader.state_dict()
    loader.close()  # closing mid-epoch ends this rank's cluster workers
    return {"seen": [list(b["items"]) for b in got], "pids": sorted({b["pid"] for b in got}),
            "state": state}


def suite_resume(address: str, merged_path: str) -> dict[str, object]:
    with open(merged_path, encoding="utf-8") as fh:
        merged = json.load(fh)
    loader = elastic_prefix().offload(workers=2, cpus=0.5, address=address).loader(
        batch_size=None, collate=False).resume_from(merged)
    return {"rest": [list(b["items"]) for b in loader]}


def main() -> int:
    out_dir, address, merged = sys.argv[1], sys.argv[2], sys.argv[3]
    suites = {"offload": lambda: suite_offload(address), "save": lambda: suite_save(address),
              "resume": lambda: suite_resume(address, merged)}
    return _dist.run_suites(out_dir, suites, timeout_s=170)


if __name__ == "__main__":
    sys.exit(main())
