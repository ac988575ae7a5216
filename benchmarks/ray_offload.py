"""``offload()`` against the same pipeline in the training process, on one machine.

A decode-bound S2-like pipeline (tar shards of 500x375 JPEGs on local disk, decoded and resized to
224x224, batches of 32 as one uint8 array) runs twice per repeat:

* **local**: the training process, pinned to one core, runs the whole pipeline;
* **offloaded**: the training process, pinned to one core, receives batches from a Ray cluster
  pinned to the other core(s) (``ray.init`` here, with this process's affinity switched to the
  cluster's cores while Ray starts its processes).

It also measures what one batch costs to cross the object store: an actor returns a batch-sized
array, the training process gets it (``ray.get``), one at a time: the bytes and the seconds per
batch, against the seconds one batch costs to compute locally.

Each is measured with an empty training step and with ``--step-ms`` of CPU work per batch in
the training process: the host-side part of a real step, which competes with a local pipeline
for the training process's core and overlaps an offloaded one.

It measures the transport for a torch tensor too: as Ray pickles it (the bytes copied into the
object and out of it) and as ``offload()`` sends it (a numpy view of its bytes, read in place).

Usage: python -m benchmarks.ray_offload [--samples 768] [--repeats 3] [--step-ms 40] [--out FILE.json]
                                        [--transport-only]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import pipeflow as pf
from pipeflow.offload._tensors import pack, unpack

from .photos import jpeg
from .scenarios import machine

BATCH = 32
PER_SHARD = 32


def write_shards(directory: Path, count: int) -> list[str]:
    """``count`` samples (``{i}.jpg`` 500x375, ``{i}.cls``) as tar shards of ``PER_SHARD``."""
    blobs = [jpeg("imagenet", i) for i in range(min(48, count))]
    paths = []
    for start in range(0, count, PER_SHARD):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for i in range(start, min(count, start + PER_SHARD)):
                for name, data in ((f"{i:06d}.jpg", blobs[i % len(blobs)]), (f"{i:06d}.cls", b"1")):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        path = directory / f"{start // PER_SHARD:05d}.tar"
        path.write_bytes(buf.getvalue())
        paths.append(str(path))
    return paths


def stack(samples: list[dict[str, Any]]) -> np.ndarray:
    """A batch as one uint8 array (N, 224, 224, 3): one object in Ray's store, read in place."""
    return np.stack([s["jpg"] for s in samples])


def prefix(paths: list[str], decoders: int) -> pf.Pipeline:
    return (pf.from_items(paths).open(workers=2).untar().group_pairs()
            .decode("numpy", resize=224, workers=decoders).batch(BATCH, collate=stack))


def busy(seconds: float) -> None:
    """Hold the CPU for ``seconds``: the host-side work of a training step (the Python loop,
    kernel launches, logging), which shares the training process's core with its input."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def epoch_rate(pipe: pf.Pipeline, count: int, step_s: float = 0.0) -> float:
    """Samples per second over one epoch, each batch touched and followed by ``step_s`` of a
    training step's CPU work in this process."""
    started = time.perf_counter()
    seen = 0
    for batch in pipe:
        seen += int(batch.shape[0])
        batch[0, 0, 0].sum()  # touch the data
        busy(step_s)
    assert seen == count, (seen, count)
    return seen / (time.perf_counter() - started)


class _Producer:
    """An actor that returns the same batch-sized payload on every call (no compute): a numpy
    array, a torch tensor as Ray pickles it, or a torch tensor as offload() sends it."""

    def __init__(self, n: int) -> None:
        self.batch = np.ones(n, dtype=np.uint8)

    def make(self, kind: str) -> Any:
        if kind == "numpy":
            return self.batch
        import torch

        tensor = torch.from_numpy(self.batch)
        return tensor if kind == "torch, Ray's pickling" else pack(tensor)


#: the payloads the transport is measured with
PAYLOADS = ("numpy", "torch, Ray's pickling", "torch, offload()")


def transport(ray: Any, nbytes: int, repeats: int, rounds: int = 30,
              kind: str = "numpy") -> list[float]:
    """Seconds per batch-sized payload returned by an actor and got here (and for offload()'s
    tensors, wrapped as a tensor again), one at a time (the median of ``rounds`` calls,
    ``repeats`` times)."""
    # no CPU reserved: the offloaded pipeline's idle actors may hold the cluster's CPUs
    actor = ray.remote(num_cpus=0)(_Producer).remote(nbytes)
    ray.get(actor.make.remote(kind))
    out = []
    for _ in range(repeats):
        calls = []
        for _ in range(rounds):
            started = time.perf_counter()
            got = unpack(ray.get(actor.make.remote(kind)))
            _ = got[-1] + 0  # read from it
            calls.append(time.perf_counter() - started)
        out.append(statistics.median(calls))
    ray.kill(actor)
    return out


def transports(ray: Any, nbytes: int, repeats: int) -> dict[str, float]:
    """The median seconds per batch of each payload kind."""
    return {kind: round(statistics.median(transport(ray, nbytes, repeats, kind=kind)), 5)
            for kind in PAYLOADS}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--step-ms", type=float, default=40.0,
                        help="CPU milliseconds of a simulated training step per batch (also 0)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--transport-only", action="store_true",
                        help="only the bytes and seconds per batch through the object store, "
                             "for each payload kind (numpy, torch)")
    args = parser.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("needs two cores: one for the training process, the rest for the cluster")
    trainer, cluster = {cores[0]}, set(cores[1:])
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # one machine: Ray on loopback, not on the machine's network address
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    with tempfile.TemporaryDirectory(prefix="pipeflow-bench-ray-", dir="/tmp") as tmp:
        # Ray's session files (logs, sockets) go with the run, not to /tmp/ray, unless the user
        # chose a place (a socket path must fit in 107 bytes: hence /tmp, not a deeper TMPDIR)
        os.environ.setdefault("RAY_TMPDIR", tmp)
        paths = write_shards(Path(tmp), args.samples)
        os.sched_setaffinity(0, cluster)  # Ray's processes inherit the cluster's cores
        ray.init(num_cpus=len(cluster), include_dashboard=False, object_store_memory=200 << 20,
                 log_to_driver=False)
        os.sched_setaffinity(0, trainer)
        try:
            if args.transport_only:
                nbytes = BATCH * 224 * 224 * 3
                result = {"batch_bytes": nbytes, "repeats": args.repeats,
                          "transport_s_per_batch_by_payload": transports(ray, nbytes, args.repeats)}
            else:
                result = _measure(ray, paths, args.samples, args.repeats, len(cluster),
                                  (0.0, args.step_ms))
        finally:
            ray.shutdown()
    result.update(machine=machine(), load_before=os.getloadavg(),
                  date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return result


def _measure(ray: Any, paths: list[str], count: int, repeats: int, cluster_cores: int,
             steps: tuple[float, ...]) -> dict[str, Any]:
    local = prefix(paths, decoders=1)
    offloaded = prefix(paths, decoders=1).offload(workers=cluster_cores, inflight=2)
    epoch_rate(offloaded, count)  # warm: the actors start, import torch, decode once
    runs: dict[str, list[float]] = {}
    for repeat in range(repeats):
        for step in steps:
            for name, pipe in (("local", local), ("offloaded", offloaded)):
                rate = epoch_rate(pipe, count, step / 1000)
                runs.setdefault(f"{name}, step {step:g} ms", []).append(rate)
                print(f"repeat {repeat + 1}/{repeats}: {name}, step {step:g} ms: {rate:.1f} samples/s",
                      file=sys.stderr, flush=True)
    nbytes = BATCH * 224 * 224 * 3
    per_batch = transport(ray, nbytes, repeats)
    by_payload = transports(ray, nbytes, repeats)
    medians = {name: round(statistics.median(rates), 1) for name, rates in runs.items()}
    compute = BATCH / medians["local, step 0 ms"]
    return {
        "samples": count, "batch": BATCH, "repeats": repeats, "cluster_cores": cluster_cores,
        "runs_samples_per_s": runs, "median_samples_per_s": medians,
        "speedup": {f"step {step:g} ms": round(medians[f"offloaded, step {step:g} ms"]
                                               / medians[f"local, step {step:g} ms"], 2)
                    for step in steps},
        "batch_bytes": nbytes,
        "transport_s_per_batch": round(statistics.median(per_batch), 5),
        "transport_s_per_batch_by_payload": by_payload,
        "compute_s_per_batch": round(compute, 4),
        "transport_share_of_compute": round(statistics.median(per_batch) / compute, 3),
    }


if __name__ == "__main__":
    main()
