"""002: random access through fsspec (s3fs): a map-style dataset that opens every field.

``fsspec.open(url).read()`` per field, as the fsspec-based loader of the AWS benchmark does for
single objects; s3fs sends a HEAD (for the size) before the ranged GET.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset

from . import _common


class FsspecSingleSampleDataset(Dataset):
    def __init__(self, prefix: str, count: int, fields: tuple[str, ...], decode: bool):
        self.prefix = prefix.rstrip("/")
        self.count = count
        self.fields = fields
        self.decode = decode
        self._fs: Any = None

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self._fs is None:  # per worker process; s3fs instances do not survive fork well
            self._fs = _common.s3fs_filesystem()
        sample = {}
        for field in self.fields:
            with self._fs.open(f"{self.prefix}/{index:06d}.{field}", "rb") as fh:
                sample[field] = fh.read()
        return _common.decode_sample(sample) if self.decode else sample


def make(prefix: str, count: int, fields: list[str], workers: int, batch_size: int = 4,
         decode: bool = False) -> Any:
    return _common.loader(FsspecSingleSampleDataset(prefix, count, tuple(fields), decode),
                          workers=workers, batch_size=batch_size)
