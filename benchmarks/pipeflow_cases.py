"""pipeflow's side of every scenario: the pipelines the benchmark runs, as a user would write them.

Each ``make_*`` returns what :mod:`benchmarks.harness` iterates (a ``DataLoader`` over a
pipeline, or the pipeline itself). Decoding uses the same function as the peers
(:func:`benchmarks.peers._common.decode_sample`) so the work per sample is identical.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import torch

import pipeflow as pf
from benchmarks.peers import _common
from pipeflow.formats.decoders import DecodeOptions, decode_sample


def _companions(fields: tuple[str, ...], first_url: str) -> list[str]:
    stem = first_url.rsplit(".", 1)[0]
    return [f"{stem}.{f}" for f in fields]


def _sample(fields: tuple[str, ...], sample: dict[str, Any]) -> dict[str, Any]:
    return {f: sample[f] for f in fields}


def single_objects(
    prefix: str,
    count: int,
    fields: list[str],
    *,
    backend: str | None,
    inflight: int,
    decode: bool = False,
    seed: int = 0,
) -> pf.Pipeline:
    """Random access to one-object-per-field samples: a permutation of the sample keys, split by
    rank and worker, ``inflight`` GETs in flight per DataLoader worker, one GET per object."""
    base = prefix.rstrip("/")
    first = [f"{base}/{i:06d}.{fields[0]}" for i in range(count)]
    pipeline = (
        pf.from_items(first)
        .shuffle(1 << 20, seed=seed)
        .shard_by_rank()
        .map(functools.partial(_companions, tuple(fields)))
        .unbatch()
        .open(backend, read=True, workers=inflight)
        .group_pairs()
        .map(functools.partial(_sample, tuple(fields)))
    )
    return pipeline.map(_common.decode_sample) if decode else pipeline


def make_single(
    prefix: str,
    count: int,
    fields: list[str],
    workers: int,
    *,
    backend: str | None = "boto3",
    inflight: int = 32,
    batch_size: int = 4,
    decode: bool = False,
) -> Any:
    pipeline = single_objects(prefix, count, fields, backend=backend, inflight=inflight, decode=decode)
    return _common.loader(pipeline, workers=workers, batch_size=batch_size)


def make_single_loader(
    prefix: str, count: int, fields: list[str], *, backend: str | None = None, inflight: int = 64,
    batch_size: int = 4, decode: bool = False,
) -> Any:
    """The same pipeline iterated in the training process (``Pipeline.loader``): no DataLoader
    workers, as many GETs in flight as the DataLoader row's two workers keep together."""
    pipeline = single_objects(prefix, count, fields, backend=backend, inflight=inflight, decode=decode)
    return pipeline.loader(batch_size=batch_size)


def tar_shards(shards: list[str], *, backend: str | None, decode: bool = False) -> pf.Pipeline:
    """Sequential reads of tar shards: the shard list split by rank and worker, one streaming
    GET per shard, members grouped into samples."""
    pipeline = pf.from_items(shards).shard_by_rank().open(backend).untar().group_pairs()
    # network reads and tar parsing run on a background thread while the consumer decodes
    pipeline = pipeline.map(_strip).prefetch(64)
    return pipeline.map(_common.decode_sample) if decode else pipeline


def _strip(sample: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sample.items() if not k.startswith("__")}


def make_shards(
    shards: list[str], workers: int, *, backend: str | None = "boto3", batch_size: int = 4,
    decode: bool = False,
) -> Any:
    return _common.loader(
        tar_shards(shards, backend=backend, decode=decode), workers=workers, batch_size=batch_size
    )


def make_shards_loader(shards: list[str], *, backend: str | None = None, batch_size: int = 4,
                       decode: bool = False) -> Any:
    """The S2 pipeline iterated in the training process (``Pipeline.loader``), no workers."""
    return tar_shards(shards, backend=backend, decode=decode).loader(batch_size=batch_size)


def make_cached(
    prefix: str,
    count: int,
    fields: list[str],
    workers: int,
    *,
    cache_dir: str | None,
    backend: str | None = "boto3",
    inflight: int = 32,
    batch_size: int = 4,
) -> Any:
    """The random-access pipeline, through ``cache()`` when ``cache_dir`` is set (the local-disk
    reference passes a directory as ``prefix`` and ``backend="local"``)."""
    base = prefix.rstrip("/")
    first = [f"{base}/{i:06d}.{fields[0]}" for i in range(count)]
    pipeline = (
        pf.from_items(first)
        .shuffle(1 << 20, seed=0)
        .shard_by_rank()
        .map(functools.partial(_companions, tuple(fields)))
        .unbatch()
    )
    if cache_dir:
        pipeline = pipeline.cache(cache_dir, max_bytes=8 << 30, backend=backend, workers=inflight)
    else:
        pipeline = pipeline.open(backend, read=True, workers=inflight)
    pipeline = pipeline.group_pairs().map(functools.partial(_sample, tuple(fields)))
    return _common.loader(pipeline, workers=workers, batch_size=batch_size)


# ---- scenario 4: decode-bound, data in memory ---------------------------------------------------
def _in_memory(layout: str, count: int, image_size: int) -> list[bytes]:
    from pipeflow.testing.datagen import sample_fields

    field = "jpg" if layout.startswith("jpeg") else "image"
    distinct = min(count, 8)  # generating 1024 px PNGs is slow; repeat a few distinct ones
    blobs = [sample_fields(layout, i, image_size=image_size)[field] for i in range(distinct)]
    return [blobs[i % distinct] for i in range(count)]


def _decode_shape(data: bytes) -> tuple[int, ...]:
    # returns the shape only, so process workers do not ship decoded pixels back (neither side does)
    return tuple(_common.decode_image(data).shape)


def _batches(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """``items`` in lists of ``size`` (the last one shorter), as the bare loops hand them out."""
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class _Bare:
    """The reference: the same decode on a bare thread or process pool, no pipeline."""

    decode = staticmethod(_decode_shape)

    def __init__(self, blobs: list[bytes], workers: int, method: str, batch_size: int) -> None:
        self.blobs, self.workers, self.method, self.batch_size = blobs, workers, method, batch_size

    def __iter__(self) -> Iterator[list[Any]]:
        pool_cls = ThreadPoolExecutor if self.method == "thread" else ProcessPoolExecutor
        with pool_cls(self.workers) as pool:
            yield from _batches(pool.map(self.decode, self.blobs, chunksize=1), self.batch_size)


def make_decode(
    layout: str, count: int, image_size: int, workers: int, *, method: str, batch_size: int = 4
) -> Any:
    """``method``: ``"thread"``/``"process"`` (pipeflow ``map``), ``"bare-thread"`` / ``"bare-process"``."""
    blobs = _in_memory(layout, count, image_size)
    if method.startswith("bare-"):
        return _Bare(blobs, workers, method[5:], batch_size)
    return pf.from_items(blobs).map(_decode_shape, workers=workers, method=method).batch(batch_size)


def make_decode_loader(layout: str, count: int, image_size: int, workers: int, *, method: str,
                       batch_size: int = 4) -> Any:
    """S4's pipeline iterated by ``Pipeline.loader`` in this process: the decode on ``workers``
    threads or processes of a ``map``, batched as lists of shapes as the other S4 rows are."""
    blobs = _in_memory(layout, count, image_size)
    pipeline = pf.from_items(blobs).map(_decode_shape, workers=workers, method=method)
    return pipeline.loader(batch_size=batch_size, collate=False)


def make_decode_dataloader(layout: str, count: int, image_size: int, workers: int, *,
                           batch_size: int = 4) -> Any:
    """S4's decode inline in each of ``workers`` DataLoader worker processes (the pipeline split
    among them by automatic sharding), batched as lists by the DataLoader."""
    blobs = _in_memory(layout, count, image_size)
    pipeline = pf.from_items(blobs).map(_decode_shape)
    return _common.loader(pipeline, workers=workers, batch_size=batch_size, collate_fn=list)


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# ---- recipes, loaded by name with their default options -----------------------------------------
def make_recipe(name: str, url: str, workers: int, *, batch_size: int = 4) -> Any:
    """The recipe that reproduces an article's pipeline, as a user loads it: by name, defaults."""
    from pipeflow import recipes

    return _common.loader(recipes.load(name, url=url), workers=workers, batch_size=batch_size)


# ---- S2 decode groups: decode to 224x224 ---------------------------------------------------------
#: what ``photo_shards`` asks ``decode()`` for; the bare loop below runs the very same call
PHOTO_DECODE: dict[str, Any] = {"mode": "torch", "resize": (224, 224)}


def photo_shards(shards: list[str], *, backend: str | None) -> pf.Pipeline:
    """Tar shards decoded to 224x224 uint8 CHW tensors with pipeflow's own ``decode(resize=...)``,
    as a user writes it: no prefetch, the decode's and the open's workers left to autotune."""
    pipeline = pf.from_items(shards).shard_by_rank().open(backend).untar().group_pairs().map(_strip)
    return pipeline.decode(**PHOTO_DECODE)


def make_photo_shards(shards: list[str], workers: int, *, backend: str | None = None,
                      batch_size: int = 4) -> Any:
    return _common.loader(photo_shards(shards, backend=backend), workers=workers, batch_size=batch_size)


def make_photo_shards_loader(shards: list[str], *, backend: str | None = None,
                             batch_size: int = 4) -> Any:
    """The decode group's pipeline iterated in the training process (``Pipeline.loader``)."""
    return photo_shards(shards, backend=backend).loader(batch_size=batch_size)


def _decode_224(data: bytes) -> tuple[int, ...]:
    return tuple(_common.decode_224({"jpg": data, "cls": b"0"})["jpg"].shape)


class _Bare224(_Bare):
    decode = staticmethod(_decode_224)


def make_bare_224(kind: str, count: int, workers: int, *, batch_size: int = 4) -> Any:
    """The same decode (PIL, resize to 224x224) on a bare process pool, the JPEGs in memory."""
    from benchmarks import photos

    blobs = [photos.jpeg(kind, i) for i in range(min(count, photos.DISTINCT))]
    return _Bare224([blobs[i % len(blobs)] for i in range(count)], workers, "process", batch_size)


#: samples a bare-loop worker decodes per task: enough that the pool's IPC is noise
_BARE_CHUNK = 16
_bare_state: dict[str, Any] = {}


def _bare_worker_init(blobs: list[bytes]) -> None:
    # what a DataLoader worker does (torch's _worker_loop), so torch ops cost the same
    torch.set_num_threads(1)
    _bare_state["blobs"] = blobs
    _bare_state["options"] = DecodeOptions(**PHOTO_DECODE)


def _bare_decode_one(i: int) -> dict[str, Any]:
    """Sample ``i`` of the photo shards (:func:`benchmarks.photos.write_shards`), decoded
    exactly as the decode stage of :func:`photo_shards` decodes it."""
    blobs = _bare_state["blobs"]
    return decode_sample({"jpg": blobs[i % len(blobs)], "cls": str(i % 1000).encode()},
                         _bare_state["options"])


def _bare_decode_chunk(indexes: range) -> list[tuple[int, ...]]:
    # only the shapes come back: neither pixels nor JPEG bytes cross the pool, the loop is the decode
    return [tuple(_bare_decode_one(i)["jpg"].shape) for i in indexes]


class _BareOwnDecoder:
    """pipeflow's decode function on a bare process pool, the JPEG bytes already in the workers."""

    def __init__(self, blobs: list[bytes], count: int, workers: int, batch_size: int) -> None:
        self.blobs, self.count, self.workers, self.batch_size = blobs, count, workers, batch_size

    def __iter__(self) -> Iterator[list[Any]]:
        chunks = [range(i, min(i + _BARE_CHUNK, self.count)) for i in range(0, self.count, _BARE_CHUNK)]
        with ProcessPoolExecutor(self.workers, initializer=_bare_worker_init,
                                 initargs=(self.blobs,)) as pool:
            shapes = itertools.chain.from_iterable(pool.map(_bare_decode_chunk, chunks))
            yield from _batches(shapes, self.batch_size)


def make_bare_own_decoder(kind: str, count: int, workers: int, *, batch_size: int = 4) -> Any:
    """The reference for pipeflow's CPU per sample in the decode groups: its own decode call
    (``decode_sample`` with :data:`PHOTO_DECODE`: DCT-scaled JPEG decode, resize, the same
    tensor) over the same JPEGs, in memory, on ``workers`` bare processes."""
    from benchmarks import photos

    blobs = [photos.jpeg(kind, i) for i in range(min(count, photos.DISTINCT))]
    return _BareOwnDecoder(blobs, count, workers, batch_size)


class _InMemoryDecoded(torch.utils.data.IterableDataset):
    """The bare loop's samples, decoded by the same call, as a plain ``IterableDataset``."""

    def __init__(self, blobs: list[bytes], count: int) -> None:
        self.blobs, self.count = blobs, count

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        first, step = (info.id, info.num_workers) if info is not None else (0, 1)
        _bare_state.update(blobs=self.blobs, options=DecodeOptions(**PHOTO_DECODE))
        for i in range(first, self.count, step):
            yield _bare_decode_one(i)


def make_dataloader_own_decoder(kind: str, count: int, workers: int, *, batch_size: int = 4) -> Any:
    """Between the bare loop and the pipeflow row: the same decode call in a plain DataLoader
    (the articles' settings), the JPEGs in memory, so collate and the DataLoader's transfer of
    the batches (shared memory, file descriptors) are paid as by every row that loads tensors."""
    from benchmarks import photos

    blobs = [photos.jpeg(kind, i) for i in range(min(count, photos.DISTINCT))]
    return _common.loader(_InMemoryDecoded(blobs, count), workers=workers, batch_size=batch_size)
