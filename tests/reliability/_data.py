"""Synthetic datasets and module-level callables shared by the reliability tests and the
helper scripts they launch (picklable, so they work with spawn and process workers)."""

from __future__ import annotations

import time


#: shard name -> number of samples; deliberately uneven
def shard_sizes(num_shards: int) -> dict[str, int]:
    return {f"shard-{i:02d}": 5 + (i * 7) % 6 for i in range(num_shards)}


def all_keys(num_shards: int) -> list[str]:
    return [f"{name}/{j:03d}" for name, n in shard_sizes(num_shards).items() for j in range(n)]


def expand(shard: str) -> list[dict[str, str]]:
    """A stand-in for open().untar().group_pairs(): one shard name -> its samples."""
    index = int(shard.rsplit("-", 1)[1])
    n = 5 + (index * 7) % 6
    return [{"__key__": f"{shard}/{j:03d}", "__url__": shard} for j in range(n)]


def slow_identity(sample: dict[str, str]) -> dict[str, str]:
    time.sleep(0.0005 * (len(sample["__key__"]) % 3))
    return sample


def key_of(sample: dict[str, str]) -> str:
    return sample["__key__"]
