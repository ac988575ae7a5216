"""002: the Amazon S3 Connector for PyTorch.

* ``map``: ``S3MapDataset.from_prefix`` over single-sample objects; the listing is sorted, so
  the fields of sample ``i`` are consecutive items; the wrapper pairs them up.
* ``iterable``: ``S3IterableDataset.from_prefix`` over tar shards with
  ``enable_sharding=True``; each shard's reader is parsed with :mod:`tarfile` in streaming mode
  and members are grouped by key (what the AWS benchmark does with WebDataset-style shards).

The client is configured as the local server needs (``force_path_style``).
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from typing import Any

from torch.utils.data import Dataset, IterableDataset

from . import _common


def _config() -> Any:
    from s3torchconnector import S3ClientConfig

    return S3ClientConfig(force_path_style=True)


def _read(reader: Any) -> tuple[str, bytes]:
    return reader.key, reader.read()


class PairedMapDataset(Dataset):
    """Sample ``i`` = the ``n_fields`` consecutive objects of a sorted ``S3MapDataset``."""

    def __init__(self, prefix: str, n_fields: int, decode: bool):
        from s3torchconnector import S3MapDataset

        self.objects = S3MapDataset.from_prefix(prefix, region=_common.region(), endpoint=_common.endpoint(),
                                                transform=_read, s3client_config=_config())
        self.n_fields = n_fields
        self.decode = decode

    def __len__(self) -> int:
        return len(self.objects) // self.n_fields

    def __getitem__(self, index: int) -> dict[str, Any]:
        sample = {}
        for j in range(self.n_fields):
            key, data = self.objects[index * self.n_fields + j]
            sample[key.rsplit(".", 1)[1]] = data
        return _common.decode_sample(sample) if self.decode else sample


def _tar_samples(reader: Any) -> Iterator[dict[str, Any]]:
    current: dict[str, Any] = {}
    current_key = None
    with tarfile.open(fileobj=reader, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            key, _, ext = member.name.rpartition(".")
            if key != current_key and current:
                yield current
                current = {}
            current_key = key
            f = tar.extractfile(member)
            assert f is not None
            current[ext] = f.read()
    if current:
        yield current


class TarShards(IterableDataset):
    def __init__(self, prefix: str, decode: bool):
        from s3torchconnector import S3IterableDataset

        self.shards = S3IterableDataset.from_prefix(
            prefix, region=_common.region(), endpoint=_common.endpoint(), s3client_config=_config(),
            enable_sharding=True)
        self.decode = decode

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for reader in self.shards:
            for sample in _tar_samples(reader):
                yield _common.decode_224(sample) if self.decode else sample


def make_map(prefix: str, n_fields: int, workers: int, batch_size: int = 4, decode: bool = False) -> Any:
    return _common.loader(PairedMapDataset(prefix, n_fields, decode), workers=workers, batch_size=batch_size)


def make_iterable(prefix: str, workers: int, batch_size: int = 4, decode: bool = False) -> Any:
    return _common.loader(TarShards(prefix, decode), workers=workers, batch_size=batch_size)
