"""Where a DataLoader worker's time goes on large tar shards: time-stamped traces per body piece.

Runs the S2 default pipeline (``benchmarks.pipeflow_cases.tar_shards`` with ``backend=None``)
over tar shards of ~116 KB samples behind the delay proxy (moto, T = 20 ms), 2 DataLoader
workers, batches of 4, and records inside every worker:

* per body piece: the time the reader spent inside obstore's ``next()`` (waiting for bytes) and
  the piece's size;
* the time the worker's main thread waited for the next sample (the prefetch queue) and the
  time it spent elsewhere (collate, handing the batch over);
* the worker's CPU time.

Variants (``--variants``) alternate within one run, so load on the machine hits each alike.
``local`` reads the same shards from local files (no network: the client chain's own bound).
Wall-clock figures depend on the machine's load; waits per MB and CPU per sample much less.

    python -m benchmarks.large_shard_trace --shard-mb 64 --shards 4 --repeats 5
    python -m benchmarks.large_shard_trace --server s3rver --shard-mb 256 --shards 2 \
        --variants ahead0,ahead2,chunk4

``--server s3rver`` reads from the npm s3rver (:mod:`benchmarks.s3rver`), which serves a
ranged GET at the cost of the range, instead of moto. Variants: ``aheadN`` (the body's
read-ahead), ``chunkN`` (N MiB pieces instead of the default 1 MiB), ``local``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import resource
import statistics
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import psutil
import torch

import pipeflow as pf
from benchmarks import s3rver
from benchmarks.pipeflow_cases import tar_shards
from pipeflow.backends import obstore as obstore_backend
from pipeflow.testing.proxy import ProxyProcess
from pipeflow.testing.s3server import local_s3

SAMPLE = 116 * 1024


def _shard(mb: int, seed: int) -> bytes:
    buf = io.BytesIO()
    rnd = os.urandom(SAMPLE)
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(mb * (1 << 20) // (SAMPLE + 2048)):
            for ext, data in (("jpg", rnd[i % 97:] + rnd[:i % 97]), ("cls", str(i % 10).encode())):
                info = tarfile.TarInfo(f"{seed:04d}{i:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class Traced(torch.utils.data.IterableDataset):
    """The pipeline, with the worker's waits and CPU recorded to ``out_dir``."""

    def __init__(self, pipeline: Any, out_dir: str) -> None:
        self.pipeline = pipeline
        self.out_dir = out_dir

    def __iter__(self) -> Iterator[Any]:
        pieces: list[tuple[float, float, int]] = []
        _trace_bodies(pieces)
        task0 = _QUEUE_WAIT[0]
        cpu0, t0 = time.process_time(), time.perf_counter()
        waited, samples = 0.0, 0
        it = iter(self.pipeline)
        try:
            while True:
                a = time.perf_counter()
                try:
                    item = next(it)
                except StopIteration:
                    break
                waited += time.perf_counter() - a
                samples += 1
                yield item
        finally:
            record = {"pid": os.getpid(), "cpu_s": time.process_time() - cpu0,
                      "wall_s": time.perf_counter() - t0, "sample_wait_s": waited, "samples": samples,
                      "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "task_wait_s": _QUEUE_WAIT[0] - task0,
                      "pieces": pieces}
            with open(os.path.join(self.out_dir, f"{os.getpid()}.json"), "w") as fh:
                json.dump(record, fh)


def _trace_bodies(pieces: list[tuple[float, float, int]]) -> None:
    """Time every piece the reader takes from obstore's body (its wait for the network, or for
    the read-ahead queue); ``PIPEFLOW_TRACE_AHEAD`` sets the body's read-ahead."""
    nxt = obstore_backend._Body._next
    init = obstore_backend._Body.__init__
    ahead = os.environ.get("PIPEFLOW_TRACE_AHEAD")

    def timed(self: Any) -> Any:
        a = time.perf_counter()
        piece = nxt(self)
        pieces.append((a, time.perf_counter() - a, len(piece)))
        return piece

    def patched(self: Any, source: Any, *args: Any, **kwargs: Any) -> None:
        if ahead is not None:
            kwargs["ahead"] = int(ahead)
        init(self, source, *args, **kwargs)

    chunk = os.environ.get("PIPEFLOW_TRACE_CHUNK")
    if chunk is not None:
        get = obstore_backend.ObstoreBackend._get

        def sized(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self.options.chunk_size != int(chunk):
                self.options = dataclasses.replace(self.options, chunk_size=int(chunk))
            return get(self, *args, **kwargs)

        obstore_backend.ObstoreBackend._get = sized  # type: ignore[method-assign]  # a tracing patch
    obstore_backend._Body._next = timed  # type: ignore[method-assign]
    obstore_backend._Body.__init__ = patched  # type: ignore[method-assign,assignment]  # a tracing patch


#: seconds this process spent in multiprocessing queue gets (a DataLoader worker: waiting for
#: the main process to hand it its next batch to make)
_QUEUE_WAIT = [0.0]


def _time_queue_gets() -> None:
    import multiprocessing.queues

    get = multiprocessing.queues.Queue.get
    if getattr(get, "_traced", False):
        return

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        a = time.perf_counter()
        try:
            return get(self, *args, **kwargs)
        finally:
            _QUEUE_WAIT[0] += time.perf_counter() - a

    timed._traced = True  # type: ignore[attr-defined]
    multiprocessing.queues.Queue.get = timed  # type: ignore[method-assign]


def run_once(urls: list[str], variant: str, out_dir: str, *, workers: int = 2) -> dict[str, Any]:
    for name in os.listdir(out_dir):
        os.unlink(os.path.join(out_dir, name))
    # "VARIANT+pfN": the DataLoader's prefetch_factor N instead of the benchmark's 2
    variant, _, pf_n = variant.partition("+pf")
    os.environ.pop("PIPEFLOW_TRACE_AHEAD", None)
    os.environ.pop("PIPEFLOW_TRACE_CHUNK", None)
    if variant.startswith("ahead"):  # ahead0: the body as before read-ahead
        os.environ["PIPEFLOW_TRACE_AHEAD"] = variant[len("ahead"):]
    elif variant.startswith("chunk"):  # chunkN: pieces of N MiB
        os.environ["PIPEFLOW_TRACE_CHUNK"] = str(int(variant[len("chunk"):]) << 20)
    backend = "local" if variant == "local" else None
    pipeline = tar_shards(urls, backend=backend)
    _time_queue_gets()  # inherited by the forked workers
    loader = torch.utils.data.DataLoader(Traced(pipeline, out_dir), batch_size=4, num_workers=workers,
                                         prefetch_factor=int(pf_n or 2), persistent_workers=False)
    me = psutil.Process()
    cpu0 = sum(me.cpu_times()[:2])
    t0 = time.perf_counter()
    main_wait = 0.0
    samples = 0
    it = iter(loader)
    children_cpu = 0.0
    while True:
        a = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        main_wait += time.perf_counter() - a
        samples += len(batch["cls"])
    wall = time.perf_counter() - t0
    del it
    workers_rec = [json.load(open(os.path.join(out_dir, n))) for n in sorted(os.listdir(out_dir))]
    children_cpu = sum(w["cpu_s"] for w in workers_rec)
    main_cpu = sum(me.cpu_times()[:2]) - cpu0
    nbytes = sum(p[2] for w in workers_rec for p in w["pieces"])
    read_wait = sum(p[1] for w in workers_rec for p in w["pieces"])
    return {"variant": variant, "samples": samples, "wall_s": wall, "samples_per_s": samples / wall,
            "cpu_ms_per_sample": (children_cpu + main_cpu) * 1e3 / max(samples, 1),
            "worker_cpu_share": children_cpu / max(sum(w["wall_s"] for w in workers_rec), 1e-9),
            "read_wait_ms_per_mb": read_wait * 1e3 / max(nbytes / 1e6, 1e-9) if nbytes else None,
            "read_wait_share": read_wait / max(sum(w["wall_s"] for w in workers_rec), 1e-9),
            "sample_wait_share": sum(w["sample_wait_s"] for w in workers_rec)
            / max(sum(w["wall_s"] for w in workers_rec), 1e-9),
            "main_wait_share": main_wait / wall,
            "task_wait_share": sum(w["task_wait_s"] for w in workers_rec)
            / max(sum(w["wall_s"] for w in workers_rec), 1e-9),
            "pieces": sum(len(w["pieces"]) for w in workers_rec),
            "worker_max_rss_mb": max(w["max_rss_mb"] for w in workers_rec),
            "piece_wait_ms": _quantiles([p[1] * 1e3 for w in workers_rec for p in w["pieces"][1:]])}


def _quantiles(values: list[float]) -> dict[str, float] | None:
    if len(values) < 4:
        return None
    q = statistics.quantiles(values, n=20)
    return {"p50": round(statistics.median(values), 2), "p90": round(q[17], 2), "p95": round(q[18], 2),
            "max": round(max(values), 2), "n_over_15ms": sum(v > 15 for v in values)}


@contextlib.contextmanager
def _server(kind: str) -> Iterator[tuple[str, Callable[[str, bytes], str]]]:
    """The server's endpoint and a ``put(key, data) -> url`` into its bucket ``data``."""
    if kind == "moto":
        with local_s3(buckets=["data"]) as s3:
            yield s3.endpoint, lambda key, data: s3.put("data", key, data)
        return
    import boto3

    env = {**s3rver.CREDENTIALS, "AWS_DEFAULT_REGION": "us-east-1"}
    with s3rver.running() as endpoint, mock.patch.dict(os.environ, env):
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="data")

        def put(key: str, data: bytes) -> str:
            client.put_object(Bucket="data", Key=key, Body=data)
            return f"s3://data/{key}"

        yield endpoint, put


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--shard-mb", type=int, default=64)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--variants", default="default,local")
    ap.add_argument("--out", default=None)
    ap.add_argument("--server", choices=("moto", "s3rver"), default="moto")
    args = ap.parse_args()
    variants = args.variants.split(",")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, _server(args.server) as (endpoint, put):
        shards = [_shard(args.shard_mb, i) for i in range(args.shards)]
        urls = [put(f"s/{i:04d}.tar", d) for i, d in enumerate(shards)]
        local = []
        for i, d in enumerate(shards):
            path = os.path.join(tmp, f"{i:04d}.tar")
            with open(path, "wb") as fh:
                fh.write(d)
            local.append(path)
        del shards, d
        out_dir = os.path.join(tmp, "trace")
        os.mkdir(out_dir)
        # "VARIANT@MS" runs VARIANT behind a proxy of MS ms delay instead of --delay-ms
        delays = {float(v.split("@")[1]) if "@" in v else args.delay_ms for v in variants}
        proxies = {d: ProxyProcess(endpoint, delay_ms=d).start() for d in delays}
        try:
            for r in range(args.repeats):
                for v in variants:
                    delay = float(v.split("@")[1]) if "@" in v else args.delay_ms
                    os.environ["AWS_ENDPOINT_URL"] = proxies[delay].url
                    name = v.split("@")[0]
                    res = run_once(local if name.startswith("local") else urls, name, out_dir)
                    res["variant"], res["delay_ms"] = v, delay
                    res["repeat"] = r
                    results.append(res)
                    shown = {k: (round(x, 3) if isinstance(x, float) else x) for k, x in res.items()}
                    print(json.dumps(shown), flush=True)
        finally:
            for proxy in proxies.values():
                proxy.stop()
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
    for v in variants:
        rows = [r for r in results if r["variant"] == v]
        print(v, "samples/s", [round(r["samples_per_s"]) for r in rows],
              "cpu ms/sample", [round(r["cpu_ms_per_sample"], 3) for r in rows],
              "read wait ms/MB", [round(r["read_wait_ms_per_mb"] or 0.0, 2) for r in rows])


if __name__ == "__main__":
    pf  # noqa: B018  (imported so the workers inherit a loaded pipeflow)
    main()
