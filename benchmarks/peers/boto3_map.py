"""000: a map-style ``Dataset`` that downloads each sample's objects with boto3.

As in the article: one boto3 client created in ``__init__`` (so forked DataLoader workers
inherit it), ``download_fileobj`` into a ``BytesIO`` for each field (s3transfer sends a HEAD
before the GET), the default sampler, ``batch_size`` samples per batch. Sample ``i`` is the
objects ``{i:06d}.image`` and ``{i:06d}.label`` (``.jpg``/``.cls`` for the JPEG set).
"""

from __future__ import annotations

import io
import re
from typing import Any

from torch.utils.data import Dataset

from . import _common


class BotoSingleSampleDataset(Dataset):
    def __init__(self, base_path: str, count: int, fields: tuple[str, ...], decode: bool = False):
        super().__init__()
        self.base_path = base_path.rstrip("/")
        self.count = count
        self.fields = fields
        self.decode = decode
        self.client = _common.boto3_client()

    def __len__(self) -> int:
        return self.count

    def get_bytes_io(self, path: str) -> io.BytesIO:
        byte_io = io.BytesIO()
        _, bucket, key, _ = re.split("s3://(.*?)/(.*)$", path)
        self.client.download_fileobj(bucket, key, byte_io)
        byte_io.seek(0)
        return byte_io

    def __getitem__(self, index: int) -> dict[str, Any]:
        sample = {f: self.get_bytes_io(f"{self.base_path}/{index:06d}.{f}").read() for f in self.fields}
        return _common.decode_sample(sample) if self.decode else sample


def make(prefix: str, count: int, fields: list[str], workers: int, batch_size: int = 4,
         decode: bool = False) -> Any:
    return _common.loader(BotoSingleSampleDataset(prefix, count, tuple(fields), decode),
                          workers=workers, batch_size=batch_size)
