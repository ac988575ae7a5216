"""SPDL (Meta's ``spdl`` 0.8): its pipeline engine, an asyncio event loop that runs each stage's
synchronous function on a thread pool, written as its documentation recommends.

Runs in its own side venv (:data:`benchmarks.peers._sidevenv.SPDL`). SPDL has no S3 client, so
the fetch stages call boto3 (one client, shared by the pool's threads, with as many pooled
connections as fetches in flight). The settings follow SPDL's guides ("Concurrency", "Best
Practices", the ImageNet example): many fetches in flight, decode about one task per core, the
decode applied to a whole batch after ``aggregate`` (``spdl.io.load_image_batch`` turns the batch
into one NCHW tensor without a tensor per image), a thread pool as large as the concurrency of
all stages together, a sink buffer of 3. One difference from the other rows: SPDL delivers items
in completion order (its default), so batches are not in the source's order.

The rows:

* S1 (one object per field): a seeded permutation of the samples -> fetch the sample's objects
  (``fetch_concurrency`` samples in flight, one GET at a time each) -> ``aggregate``.
* S2 (tar shards): the shard URLs -> a stage that streams each shard (``get_object``'s body read
  by SPDL's own tar reader, ``spdl.io.iter_tarfile``) and yields its samples, ``shards_in_flight``
  shards at once -> ``aggregate`` -> the batch decode, with FFmpeg (``spdl.io``; its scaler is
  not PIL's bilinear, so pixels differ a little) or with pipeflow's decoder (the very call of
  the pipeflow rows), so the engine and the decoder can be told apart.
* S4 (decode-bound, in memory): the blobs -> the decode of the other S4 rows on two threads (the
  pipeline's pool) or two processes (a ``ProcessPoolExecutor`` given to the stage) ->
  ``aggregate``.
* S5 (per-stage overhead): the chains of :mod:`benchmarks.overhead` as SPDL stages, alternated
  with pipeflow's in one process (:func:`overhead`).

    python -m benchmarks.peers.spdl_peer probe                 # prints {"spdl": ..., "ffmpeg": ...}
    python -m benchmarks.peers.spdl_peer overhead ITEMS REPEATS  # prints the S5 rows as JSON
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import _common

#: how the S2 rows decode a batch
DECODERS = ("none", "ffmpeg", "pipeflow")


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass(frozen=True)
class SpdlSettings:
    """The knobs SPDL's docs ask a user to set, with the values they recommend here.

    ``fetch_concurrency``: S1 fetches in flight (as many GETs as pipeflow's ``loader()`` row
    keeps in flight); ``shards_in_flight``: S2 shards streamed at once; ``decode_concurrency``:
    decode tasks at once (about one per core); ``batch_size`` as every other row.
    """

    fetch_concurrency: int = 64
    shards_in_flight: int = 8
    decode_concurrency: int = field(default_factory=_cores)
    batch_size: int = 4
    buffer_size: int = 3

    def __post_init__(self) -> None:
        for name in ("fetch_concurrency", "shards_in_flight", "decode_concurrency", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SpdlSettings.{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.buffer_size, int) or self.buffer_size < 1:
            raise ValueError(f"SpdlSettings.buffer_size must be an int >= 1, got {self.buffer_size!r}")

    def threads(self, *concurrencies: int) -> int:
        """The pool size for stages of these concurrencies: each task holds a thread while it runs,
        so a smaller pool would cap the stages below what they were given."""
        return max(1, sum(concurrencies))


class SpdlLoader:
    """A re-iterable over an SPDL pipeline: each pass builds and starts a fresh pipeline, and a
    pass left early (the harness breaks at its budget) stops it, threads and pools included."""

    def __init__(self, build: Callable[[], tuple[Any, Callable[[], None]]], timeout: float = 300.0) -> None:
        self._build, self._timeout = build, timeout

    def __iter__(self) -> Iterator[Any]:
        pipeline, release = self._build()
        try:
            with pipeline.auto_stop():
                yield from pipeline.get_iterator(timeout=self._timeout)
        finally:
            release()


def _builder(source: Iterable[Any]) -> Any:
    from spdl.pipeline import PipelineBuilder

    return PipelineBuilder().add_source(source)


def _nothing() -> None:
    return None


# ---- S1: one object per field -------------------------------------------------------------------
def _s3_client(connections: int) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3", endpoint_url=_common.endpoint(), region_name=_common.region(),
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=connections))


def _fetch_sample(client: Any, bucket: str, base: str, fields: tuple[str, ...], index: int) -> dict[str, Any]:
    return {f: client.get_object(Bucket=bucket, Key=f"{base}/{index:06d}.{f}")["Body"].read() for f in fields}


class _FetchSample:
    """``index -> {field: bytes}``: the GETs of one sample, one after the other."""

    def __init__(self, client: Any, prefix: str, fields: list[str]) -> None:
        self.client, self.fields = client, tuple(fields)
        self.bucket, base = _common.split(prefix.rstrip("/") + "/")
        self.base = base.rstrip("/")

    def __call__(self, index: int) -> dict[str, Any]:
        return _fetch_sample(self.client, self.bucket, self.base, self.fields, index)


def make_single(prefix: str, count: int, fields: list[str], *, seed: int = 0,
                settings: dict[str, Any] | None = None) -> SpdlLoader:
    """S1: a permutation of the sample indices, ``fetch_concurrency`` samples fetched at once."""
    s = SpdlSettings(**(settings or {}))
    client = _s3_client(s.fetch_concurrency)
    fetch = _FetchSample(client, prefix, fields)

    def build() -> tuple[Any, Callable[[], None]]:
        order = list(range(count))
        random.Random(seed).shuffle(order)
        pipeline = (_builder(order).pipe(fetch, concurrency=s.fetch_concurrency).aggregate(s.batch_size)
                    .add_sink(s.buffer_size).build(num_threads=s.threads(s.fetch_concurrency)))
        return pipeline, _nothing

    return SpdlLoader(build)


# ---- S2: tar shards -----------------------------------------------------------------------------
def group_members(members: Iterable[tuple[str, Any]]) -> Iterator[dict[str, Any]]:
    """Consecutive tar members with the same stem -> ``{"__key__": stem, ext: bytes, ...}``
    (WebDataset's convention, as the shards are written); an extension seen twice in a row of one
    stem is a malformed shard and raises ``ValueError`` rather than losing a member."""
    sample: dict[str, Any] = {}
    for name, data in members:
        stem, _, ext = name.rpartition("/")[2].partition(".")
        if sample and sample["__key__"] != stem:
            yield sample
            sample = {}
        if ext in sample:
            raise ValueError(f"tar member {name!r}: {ext!r} twice in sample {stem!r}")
        sample["__key__"] = stem
        sample[ext] = bytes(data)
    if sample:
        yield sample


class _ShardSamples:
    """``shard URL -> samples``: one streaming GET read by SPDL's tar reader."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def __call__(self, url: str) -> Iterator[dict[str, Any]]:
        from spdl.io import iter_tarfile

        bucket, key = _common.split(url)
        body = self.client.get_object(Bucket=bucket, Key=key)["Body"]
        try:
            for sample in group_members(iter_tarfile(body)):
                del sample["__key__"]
                yield sample
        finally:
            body.close()


def _ffmpeg_batch(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A batch decoded and resized to 224x224 by FFmpeg in one call, as an NCHW uint8 tensor."""
    import spdl.io
    import torch

    buffer = spdl.io.load_image_batch([s["jpg"] for s in samples], width=224, height=224, pix_fmt="rgb24")
    return {"jpg": spdl.io.to_torch(buffer).permute(0, 3, 1, 2),
            "cls": torch.tensor([int(s["cls"]) for s in samples])}


def _pipeflow_batch(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The same batch through pipeflow's decode call (that of the pipeflow rows), then stacked."""
    from torch.utils.data import default_collate

    from benchmarks.pipeflow_cases import PHOTO_DECODE
    from pipeflow.formats.decoders import DecodeOptions, decode_sample

    options = DecodeOptions(**PHOTO_DECODE)
    return default_collate([decode_sample(s, options) for s in samples])


BATCH_DECODERS: dict[str, Callable[[list[dict[str, Any]]], dict[str, Any]]] = {
    "ffmpeg": _ffmpeg_batch, "pipeflow": _pipeflow_batch}


def make_shards(shards: list[str], *, decoder: str = "none",
                settings: dict[str, Any] | None = None) -> SpdlLoader:
    """S2: the shards streamed ``shards_in_flight`` at once, batched, decoded per batch."""
    if decoder not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
    s = SpdlSettings(**(settings or {}))
    client = _s3_client(s.shards_in_flight)

    def build() -> tuple[Any, Callable[[], None]]:
        b = _builder(list(shards)).pipe(_ShardSamples(client), concurrency=s.shards_in_flight)
        b = b.aggregate(s.batch_size)
        stages = [s.shards_in_flight]
        if decoder != "none":
            b = b.pipe(BATCH_DECODERS[decoder], concurrency=s.decode_concurrency)
            stages.append(s.decode_concurrency)
        return b.add_sink(s.buffer_size).build(num_threads=s.threads(*stages)), _nothing

    return SpdlLoader(build)


# ---- S4: decode-bound, data in memory -----------------------------------------------------------
def make_decode(layout: str, count: int, image_size: int, workers: int, *, method: str,
                batch_size: int = 4) -> SpdlLoader:
    """S4: the decode of the other S4 rows (PIL, the shape returned) on ``workers`` threads of the
    pipeline's pool, or on a ``ProcessPoolExecutor`` of ``workers`` processes given to the stage."""
    from concurrent.futures import ProcessPoolExecutor

    from benchmarks.pipeflow_cases import _decode_shape, _in_memory

    if method not in ("thread", "process"):
        raise ValueError(f"method must be 'thread' or 'process', got {method!r}")
    blobs = _in_memory(layout, count, image_size)

    def build() -> tuple[Any, Callable[[], None]]:
        pool = ProcessPoolExecutor(workers) if method == "process" else None
        pipeline = (_builder(blobs).pipe(_decode_shape, concurrency=workers, executor=pool)
                    .aggregate(batch_size).add_sink(3).build(num_threads=workers))
        return pipeline, (lambda: pool.shutdown(cancel_futures=True)) if pool else _nothing

    return SpdlLoader(build)


# ---- S5: per-stage overhead ---------------------------------------------------------------------
def _identity(x: Any) -> Any:
    return x


def _spdl_inline(n: int) -> Iterable[Any]:
    # the five stages of benchmarks.overhead's inline chain: map, map, batch, unbatch, map
    def build() -> tuple[Any, Callable[[], None]]:
        b = _builder(range(n)).pipe(_identity).pipe(_identity).aggregate(8).disaggregate().pipe(_identity)
        return b.add_sink(3).build(num_threads=1), _nothing

    return SpdlLoader(build)


def _spdl_parallel(n: int) -> Iterable[Any]:
    # map, map on 2 workers, batch, unbatch, prefetch(8) (the sink's buffer)
    def build() -> tuple[Any, Callable[[], None]]:
        b = _builder(range(n)).pipe(_identity).pipe(_identity, concurrency=2).aggregate(8).disaggregate()
        return b.add_sink(8).build(num_threads=2), _nothing

    return SpdlLoader(build)


def overhead(items: int, repeats: int) -> list[dict[str, Any]]:
    """S5 against SPDL: items/s through the same chains, alternated in one process; medians."""
    from benchmarks import overhead as ov

    rows = []
    for name, ours, theirs in (("inline (5 stages)", ov._pipeflow_inline, _spdl_inline),
                               ("threads + prefetch", ov._pipeflow_parallel, _spdl_parallel)):
        n = items if "inline" in name else items // 4
        a_s, b_s = [], []
        for _ in range(repeats):
            a_s.append(ov._items_per_second(ours, n))
            b_s.append(ov._items_per_second(theirs, n))
        a, b = statistics.median(a_s), statistics.median(b_s)
        rows.append({"chain": name, "items": n, "pipeflow_items_per_s": round(a),
                     "spdl_items_per_s": round(b), "ratio": round(a / b, 2)})
    return rows


# ---- what this environment can run ----------------------------------------------------------------
def probe() -> dict[str, Any]:
    """SPDL's version, and whether its FFmpeg decoder loads and decodes a small JPEG here."""
    import io
    from importlib.metadata import version

    out: dict[str, Any] = {"spdl": version("spdl"), "ffmpeg": False}
    try:
        import spdl.io
        from PIL import Image

        jpeg = io.BytesIO()
        Image.new("RGB", (32, 24), (200, 10, 10)).save(jpeg, "JPEG")
        buffer = spdl.io.load_image_batch([jpeg.getvalue()], width=16, height=16)
        shape = tuple(spdl.io.to_numpy(buffer).shape)
        out["ffmpeg"] = shape == (1, 16, 16, 3)
        if not out["ffmpeg"]:
            out["why"] = f"decoded shape {shape}"
    except Exception as exc:  # a missing library shows here as an ImportError or OSError
        out["why"] = f"{type(exc).__name__}: {exc}"[:400]
    return out


def main(argv: list[str]) -> None:
    if argv[:1] == ["probe"]:
        print(json.dumps(probe()), flush=True)
    elif argv[:1] == ["overhead"]:
        t0 = time.perf_counter()
        rows = overhead(int(argv[1]), int(argv[2]))
        print(json.dumps({"rows": rows, "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    else:
        raise SystemExit("usage: python -m benchmarks.peers.spdl_peer probe | overhead ITEMS REPEATS")


if __name__ == "__main__":
    main(sys.argv[1:])
