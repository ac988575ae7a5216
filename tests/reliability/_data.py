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


# ---- tar shards for the end-to-end tests ----------------------------------------------------------
def payload(key: str, size: int = 3000) -> bytes:
    """Deterministic, incompressible-looking bytes for a sample key."""
    import hashlib

    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{key}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:size])


def make_tar(keys: list[str], *, size: int = 3000, drop: set[str] = frozenset()) -> bytes:
    """A plain tar of ``KEY.bin`` + ``KEY.cls`` members (members named in ``drop`` are left out)."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key in keys:
            for name, data in ((f"{key}.bin", payload(key, size)), (f"{key}.cls", key.encode())):
                if name in drop:
                    continue
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mtime = 0
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tar_dataset(num_shards: int, per_shard: int, size: int = 3000) -> dict[str, bytes]:
    """``{"train/shard-00.tar": tar bytes, ...}`` with keys ``s00-000``..."""
    return {f"train/shard-{i:02d}.tar": make_tar([f"s{i:02d}-{j:03d}" for j in range(per_shard)], size=size)
            for i in range(num_shards)}


def check_sample(sample: dict, size: int = 3000) -> str:
    """The key of a grouped sample after verifying its bytes against the whole payload (raises on
    corruption, truncation or an empty field)."""
    key = sample["__key__"]
    if sample["bin"] != payload(key, size) or sample["cls"] != key.encode():
        raise AssertionError(f"sample {key} came back corrupted")
    return key


def slow_key(sample: dict[str, str]) -> str:
    time.sleep(0.02)
    return sample["__key__"]
