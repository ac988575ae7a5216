"""Mosaic Streaming: ``streaming.MDSWriter`` writes the samples as MDS shards on the server,
then ``streaming.StreamingDataset`` reads them back through a ``DataLoader``.

Runs in the side venv (:mod:`benchmarks.peers._sidevenv`). The conversion reads the same tar
shards as every other library and writes columns ``jpg: bytes`` and ``cls: int`` with
``size_limit`` = the shard size, straight to ``s3://`` (MDSWriter uploads each finished shard).
The reader is the documented one (``remote=`` + ``local=`` cache directory, emptied before the
run, ``batch_size`` given to the dataset as Mosaic asks); the endpoint comes from
``S3_ENDPOINT_URL`` as Mosaic documents for S3-compatible stores. Shared memory left by an
earlier run is cleaned with ``streaming.base.util.clean_stale_shared_memory()`` first.

One change to make it import here: ``streaming`` imports ``torchvision`` at package import (for
its vision dataset classes) and no torchvision can load on this CPU-only torch, so
:func:`without_torchvision` registers placeholders for the two names that import needs; they
raise if called, and nothing in this benchmark calls them.

    python -m benchmarks.peers.mosaic convert '<json>'   # prints CONVERTED <seconds>
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import types
from typing import Any

from . import _common, _convert


def without_torchvision() -> None:
    try:
        import torchvision  # noqa: F401

        return
    except ImportError:
        pass
    # transformers probes for torchvision with find_spec at import: import it before the placeholder
    import transformers.feature_extraction_utils  # noqa: F401

    def missing(*args: Any, **kwargs: Any) -> Any:
        raise ImportError("torchvision is not installed (placeholder for mosaicml-streaming's import)")

    vision = types.ModuleType("torchvision")
    datasets = types.ModuleType("torchvision.datasets")
    transforms = types.ModuleType("torchvision.transforms")
    functional = types.ModuleType("torchvision.transforms.functional")
    datasets.VisionDataset = type("VisionDataset", (), {"__init__": missing})  # type: ignore[attr-defined]
    functional.to_tensor = missing  # type: ignore[attr-defined]
    vision.datasets, vision.transforms = datasets, transforms  # type: ignore[attr-defined]
    transforms.functional = functional  # type: ignore[attr-defined]
    sys.modules.update({"torchvision": vision, "torchvision.datasets": datasets,
                        "torchvision.transforms": transforms,
                        "torchvision.transforms.functional": functional})


def import_streaming() -> Any:
    without_torchvision()
    import streaming

    return streaming


def convert(shards: list[str], output: str, chunk_mb: float, workdir: str) -> float:
    streaming = import_streaming()
    t0 = time.perf_counter()
    columns = {"jpg": "bytes", "cls": "int"}
    with streaming.MDSWriter(out=output, columns=columns, size_limit=int(chunk_mb * 1e6)) as writer:
        for url in shards:
            for sample in _convert.shard_samples(url):
                writer.write(sample)
    return time.perf_counter() - t0


def _dataset_class(decode: bool) -> Any:
    # Mosaic's documented way to transform samples: subclass StreamingDataset
    streaming = import_streaming()

    base: Any = streaming.StreamingDataset

    class Decoded(base):
        def __getitem__(self, index: int) -> Any:
            sample = super().__getitem__(index)
            return _common.decode_224(sample) if decode else sample

    return Decoded


def make(url: str, cache_dir: str, workers: int, batch_size: int = 4, decode: bool = False) -> Any:
    import_streaming()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    shutil.rmtree(cache_dir, ignore_errors=True)  # a cold cache: every shard comes from the server
    dataset = _dataset_class(decode)(remote=url, local=cache_dir, batch_size=batch_size, shuffle=False)
    return _common.loader(dataset, workers=workers, batch_size=batch_size)


if __name__ == "__main__":
    if sys.argv[1] == "convert":
        args = json.loads(sys.argv[2])
        print(f"CONVERTED {convert(**args):.3f}", flush=True)
