"""CPU per sample of the S2 decode groups' pipeline in the training process, against a bare loop
of the same decode call, local tar shards, no server.

The S2 decode groups (``pipeflow bench --s2-groups decode``) decode JPEGs to 224x224 uint8 CHW
tensors with ``decode("torch", resize=(224, 224))``. Over S3 a run's CPU also holds the client's
requests and the server's share of the cores; here the shards are local files and every case
runs in a fresh interpreter, so what is left is the CPU pipeflow adds around the decode:

* ``bare``: ``decode_sample`` (the decode stage's own call, same options) over the JPEGs in
  memory, one thread, torch on one intra-op thread: the decode alone;
* ``bare-collate``: the same, and the samples stacked in batches of 4 as ``default_collate``
  does (what every loader row also pays);
* ``loader-inline`` / ``loader-2`` / ``loader-auto``: ``from_items(shards).open("local").untar()
  .group_pairs().map(strip).decode(..., workers=0 | 2 | "auto").loader(batch_size=4)``, the
  decode group's pipeline (``benchmarks.pipeflow_cases.photo_shards``) on local files;
* ``loader-auto-at-one``: ``loader-auto`` with its tuner made to settle at one decode at a time
  (no step up counts as a gain, so it tries two once and goes back), what ``"auto"`` does where
  the second core is busy with other work; pipeflow's own measurement starts once it settled.

CPU is the process's (every thread), from the first batch (warm-up, imports and pools
excluded) to the last, with the voluntary context switches per sample (every thread's waits:
the decode hand-off's wake-ups and the GIL's); cases alternate inside each repeat. A loader row
also shows the decode calls the stage ran at once at the end (``workers`` in ``stats()``: what
``"auto"`` settled at).

``--baseline DIR`` measures a change: every loader case runs twice in each repeat, alternated,
the second time (``case@base``) importing ``pipeflow`` from ``DIR`` (a checkout of the commit
to compare with, e.g. ``git worktree add --detach /tmp/base main``); the bare loops are shared.
Only that checkout's ``pipeflow`` package is imported (through a link in a scratch directory):
its ``benchmarks`` would otherwise shadow this one.

    python -m benchmarks.decode_cpu --kind imagenet photo --repeats 3
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = ("bare", "bare-collate", "loader-inline", "loader-2", "loader-auto", "loader-auto-at-one")
#: samples the ``loader-auto-at-one`` case lets pass before measuring: its tuner settles after
#: three intervals of 0.25 s
SETTLE_SAMPLES = 800
BATCH = 4


def write_local_shards(directory: str, kind: str, count: int, per_shard: int) -> list[str]:
    """``count`` samples (``{i:06d}.jpg`` + ``.cls``) in tar files of ``per_shard`` samples."""
    from benchmarks import photos

    blobs = [photos.jpeg(kind, i) for i in range(min(photos.DISTINCT, count))]
    paths = []
    for first in range(0, count, per_shard):
        path = os.path.join(directory, f"{kind}-{first // per_shard:05d}.tar")
        with tarfile.open(path, "w") as tar:
            for i in range(first, min(first + per_shard, count)):
                members = ((f"{i:06d}.jpg", blobs[i % len(blobs)]), (f"{i:06d}.cls", str(i % 1000).encode()))
                for name, data in members:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


# ---- child side ---------------------------------------------------------------------------------
def _bare(spec: dict[str, Any]) -> Any:
    import torch

    from benchmarks import photos
    from benchmarks.pipeflow_cases import PHOTO_DECODE
    from pipeflow.formats.decoders import DecodeOptions, decode_sample

    torch.set_num_threads(1)
    blobs = [photos.jpeg(spec["kind"], i) for i in range(photos.DISTINCT)]
    options = DecodeOptions(**PHOTO_DECODE)
    collate = torch.utils.data.default_collate if spec["case"] == "bare-collate" else list
    batch: list[Any] = []
    for i in range(spec["count"]):
        batch.append(decode_sample({"jpg": blobs[i % len(blobs)], "cls": str(i % 1000).encode()}, options))
        if len(batch) == BATCH:
            yield collate(batch)
            batch = []


def _strip(sample: dict[str, Any]) -> dict[str, Any]:
    return {"jpg": sample["jpg"], "cls": sample["cls"]}


def _loader(spec: dict[str, Any]) -> Any:
    import pipeflow as pf
    from benchmarks.pipeflow_cases import PHOTO_DECODE

    workers: Any = {"loader-inline": 0, "loader-2": 2}.get(spec["case"], "auto")
    if spec["case"] == "loader-auto-at-one":
        from pipeflow.executor import autotune

        autotune.GAIN = float("inf")  # no step pays: it tries two at once, then holds one
    pipe = pf.from_items(spec["shards"]).open("local").untar().group_pairs().map(_strip)
    return pipe.decode(**PHOTO_DECODE, workers=workers).loader(batch_size=BATCH)


def child_main(spec: dict[str, Any]) -> None:
    source = _bare(spec) if spec["case"].startswith("bare") else _loader(spec)
    batches = iter(source)
    next(batches)  # warm: imports, pools, the first shard
    if spec["case"] == "loader-auto-at-one":
        for _ in range(SETTLE_SAMPLES // BATCH):
            next(batches)
    switches0 = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
    cpu0, t0, n = time.process_time(), time.perf_counter(), 0
    for batch in batches:
        n += len(batch["jpg"]) if isinstance(batch, dict) else len(batch)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    # voluntary context switches (every thread's waits: the hand-offs' wake-ups, the GIL's)
    switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - switches0
    result: dict[str, Any] = {"samples": n, "cpu_s": cpu, "wall_s": wall,
                              "switches_per_sample": switches / max(n, 1)}
    if hasattr(source, "stats"):
        import pipeflow

        result["decode_workers"] = source.stats()["decode"].get("workers", 0)
        result["pipeflow"] = os.path.dirname(os.path.dirname(pipeflow.__file__))
    print("RESULT " + json.dumps(result), flush=True)


# ---- parent side --------------------------------------------------------------------------------
def run_one(spec: dict[str, Any], pipeflow_from: str | None = None) -> dict[str, Any]:
    """One case in a fresh interpreter; ``pipeflow_from``: a directory to import ``pipeflow``
    from instead of this tree's (the benchmark's own code still comes from this tree)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [pipeflow_from, ROOT, env.get("PYTHONPATH")]))
    # not run from ROOT when importing another pipeflow: ``-m`` puts the working directory first
    cwd = tempfile.gettempdir() if pipeflow_from else ROOT
    out = subprocess.run([sys.executable, "-m", "benchmarks.decode_cpu", "--child", json.dumps(spec)],
                         cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"{spec['case']} failed: {out.stderr[-2000:]}")
    result = json.loads(lines[-1][7:])
    return {**result, "ms_per_sample": 1000 * result["cpu_s"] / max(result["samples"], 1)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--kind", nargs="+", default=["imagenet", "photo"], choices=("imagenet", "photo"))
    p.add_argument("--count", type=int, default=1600, help="samples per case")
    p.add_argument("--per-shard", type=int, default=200, help="samples per tar shard")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    p.add_argument("--json", help="write every row here")
    p.add_argument("--baseline", metavar="DIR",
                   help="also run each loader case with pipeflow imported from DIR (alternated)")
    args = p.parse_args(argv)
    if args.child:
        child_main(json.loads(args.child))
        return
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pipeflow-decode-cpu-") as tmp:
        shards = {kind: write_local_shards(tmp, kind, args.count, args.per_shard) for kind in args.kind}
        if args.baseline:
            args.baseline = _package_only(args.baseline, tmp)
        for r in range(args.repeats):
            for kind in args.kind:
                for case, base in _schedule(args.cases, args.baseline, reverse=bool(r % 2)):
                    spec = {"case": case, "kind": kind, "count": args.count, "shards": shards[kind]}
                    label = f"{case}@base" if base else case
                    row = {"case": label, "kind": kind, "repeat": r, "load": os.getloadavg()[0],
                           **run_one(spec, base)}
                    rows.append(row)
                    settled = f", decode workers {row['decode_workers']}" if "decode_workers" in row else ""
                    print(f"[{r}] {kind:<8} {label:<19} {row['ms_per_sample']:.3f} CPU ms/sample "
                          f"({row['samples']} samples, {row['wall_s']:.2f} s, load {row['load']:.1f}, "
                          f"{row.get('switches_per_sample', float('nan')):.2f} switches/sample"
                          f"{settled})", flush=True)
    _summary(rows, args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


def _package_only(checkout: str, scratch: str) -> str:
    """A directory holding only a link to ``checkout``'s ``pipeflow`` package."""
    package = os.path.join(os.path.abspath(checkout), "pipeflow")
    if not os.path.isdir(package):
        raise SystemExit(f"--baseline {checkout}: no pipeflow package there")
    only = os.path.join(scratch, "baseline")
    os.makedirs(only)
    os.symlink(package, os.path.join(only, "pipeflow"))
    return only


def _schedule(cases: list[str], baseline: str | None, *, reverse: bool) -> list[tuple[str, str | None]]:
    """The runs of one repeat: ``(case, pipeflow directory or None)``; with a baseline each
    loader case runs against it right after (or, on odd repeats, right before) this tree."""
    runs: list[tuple[str, str | None]] = []
    for case in cases:
        pair: list[tuple[str, str | None]] = [(case, None)]
        if baseline and not case.startswith("bare"):
            pair.append((case, baseline))
        runs += pair[::-1] if reverse else pair
    return runs


def _summary(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print("\nCPU ms/sample, median [min .. max]; / bare: the medians' ratio")
    labels = list(dict.fromkeys(r["case"] for r in rows))
    for kind in args.kind:
        bare = statistics.median(r["ms_per_sample"] for r in rows if (r["kind"], r["case"]) == (kind, "bare"))
        for case in labels:
            ms = [r["ms_per_sample"] for r in rows if (r["kind"], r["case"]) == (kind, case)]
            med = statistics.median(ms)
            print(f"  {kind:<8} {case:<19} {med:.3f} [{min(ms):.3f} .. {max(ms):.3f}]  "
                  f"/ bare {med / bare:.2f}")


if __name__ == "__main__":
    main()
