"""Launched by ``torchrun --nproc_per_node=2``: reads one-object-per-sample pairs from the S3
server named by ``AWS_ENDPOINT_URL`` (the counting proxy) with DataLoader workers, automatic and
explicit key sharding, and writes the sample keys every rank saw to ``OUT/results.json``.

Usage: torchrun --nproc_per_node=2 ... pairs_by_key_torchrun.py OUT_DIR PREFIX
"""

from __future__ import annotations

import sys

from torch.utils.data import DataLoader

import pipeflow as pf
from tests.reliability import _dist

#: (name, shard_by_rank(by=...) or None for automatic sharding, DataLoader workers)
CONFIGS = [("auto-w0", None, 0), ("auto-w2", None, 2), ("shard_by_rank-w2", "auto", 2),
           ("key-w3", "key", 3)]


def keys_seen(prefix: str, by: str | None, workers: int) -> list[str]:
    listing = pf.list_objects(prefix, backend="boto3")
    pipe = listing if by is None else listing.shard_by_rank(by=by)
    pipe = pipe.open(read=True, workers=8).group_pairs(required=("image", "label"))
    out = []
    for sample in DataLoader(pipe, batch_size=None, num_workers=workers):
        if sample["image"] != f"image {int(sample['label'])}".encode():
            raise AssertionError(f"{sample['__key__']}: image and label of different samples")
        out.append(sample["__key__"])
    return out


def main() -> int:
    out_dir, prefix = sys.argv[1], sys.argv[2]
    return _dist.run_suites(out_dir, {name: (lambda by=by, workers=workers: keys_seen(prefix, by, workers))
                                      for name, by, workers in CONFIGS})


if __name__ == "__main__":
    sys.exit(main())
