"""LitData: ``litdata.optimize()`` writes the samples as LitData chunks on the server, then
``litdata.StreamingDataset`` + ``litdata.StreamingDataLoader`` read them back.

Runs in the side venv (:mod:`benchmarks.peers._sidevenv`). The conversion reads the same tar
shards every other library reads and gives each sample to ``optimize`` as a dict of the JPEG
bytes and the class; chunks are about the shard size (``chunk_bytes``). The reader follows the
documented usage for an S3-compatible store (``storage_options={"endpoint_url": ...}``), with a
cache directory emptied before the run and its chunks removed before every later pass over the
data (:class:`ColdPasses`: otherwise LitData reads its second pass from local disk). One change
so that it runs against a local ``http://`` endpoint: LitData builds its obstore client with
fixed client options, and obstore refuses plain HTTP unless ``allow_http`` is set (S3 itself is
HTTPS), so :func:`allow_http` adds that option to LitData's module-level options before any
client is made. Images are kept as bytes (decoding them with
torchvision, LitData's own image serializer, is not possible here: see the side venv notes) and
decoded with the same PIL function as every other library.

    python -m benchmarks.peers.litdata_peer convert '<json>'   # prints CONVERTED <seconds>
"""

from __future__ import annotations

import functools
import json
import shutil
import sys
import time
from typing import Any

from . import _common, _convert


def allow_http() -> None:
    from litdata.streaming import downloader

    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}


def _samples(shards: list[str], index: int) -> Any:
    yield from _convert.shard_samples(shards[index])


def convert(shards: list[str], output: str, chunk_mb: float, workdir: str) -> float:
    import os

    from litdata import optimize

    allow_http()
    os.environ.setdefault("DATA_OPTIMIZER_CACHE_FOLDER", os.path.join(workdir, "litdata-optimize-cache"))
    t0 = time.perf_counter()
    # inputs are indices: optimize() would take s3:// strings for files to download itself
    optimize(fn=functools.partial(_samples, shards), inputs=list(range(len(shards))),
             output_dir=output, chunk_bytes=int(chunk_mb * 1e6),
             num_workers=1, mode="overwrite", verbose=False,
             storage_options={"endpoint_url": _common.endpoint()})
    return time.perf_counter() - t0


def _transform(decode: bool, sample: dict[str, Any]) -> dict[str, Any]:
    return _common.decode_224(sample) if decode else sample


def make(url: str, cache_dir: str, workers: int, batch_size: int = 4, decode: bool = False) -> Any:
    from litdata import StreamingDataLoader, StreamingDataset

    allow_http()
    shutil.rmtree(cache_dir, ignore_errors=True)  # a cold cache: every chunk comes from the server
    dataset = StreamingDataset(url, cache_dir=cache_dir, transform=functools.partial(_transform, decode),
                               storage_options={"endpoint_url": _common.endpoint()})
    loader = StreamingDataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=_collate)
    return ColdPasses(loader, cache_dir)


class ColdPasses:
    """The loader, with LitData's local chunk cache emptied before every pass over the data.

    A case reads the data set again until its minimum samples and seconds are met; LitData keeps
    every chunk it downloaded on local disk (its cache holds up to 100 GB by default), so without
    this its second and later passes read local files while every other library reads the server
    again. The index LitData downloaded when the data set was made stays; chunks are fetched again.
    """

    def __init__(self, loader: Any, cache_dir: str) -> None:
        self._loader = loader
        self._cache_dir = cache_dir

    def __iter__(self) -> Any:
        drop_chunks(self._cache_dir)
        return iter(self._loader)


def drop_chunks(cache_dir: str) -> int:
    """Remove every file under ``cache_dir`` but the ``index.json`` files; returns how many."""
    import os

    dropped = 0
    for root, _dirs, files in os.walk(cache_dir):
        for name in files:
            if name != "index.json":
                os.remove(os.path.join(root, name))
                dropped += 1
    return dropped


def _collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    # in DataLoader workers LitData hands the JPEG field over as a buffer, not bytes, and torch's
    # default_collate refuses buffers of unequal length; keep them as a list of bytes, as the
    # other libraries' batches have them
    import torch
    from torch.utils.data import default_collate

    out: dict[str, Any] = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        if isinstance(values[0], (int, float, torch.Tensor)):
            out[key] = default_collate(values)
        else:
            out[key] = [v if isinstance(v, (bytes, str)) else bytes(v) for v in values]
    return out


if __name__ == "__main__":
    if sys.argv[1] == "convert":
        args = json.loads(sys.argv[2])
        print(f"CONVERTED {convert(**args):.3f}", flush=True)
