"""S4, focused: pipeflow's ``map`` on thread/process workers against the bare executors.

Every case decodes the same in-memory JPEGs with the same function (PIL with a reduced-scale
draft, resized to 224x224, returned as a uint8 CHW tensor of ~150 KB) on 2 workers, for a fixed
wall time, epoch after epoch over the same items, in a fresh interpreter per case, so start-up
is part of the run and also reported alone:

* ``pipeflow-process`` / ``pipeflow-thread``: ``from_items(blobs).map(fn, workers=2, method=...)``,
  one pipeline iterated once per epoch (as a training loop does);
* ``bare-process`` / ``bare-thread``: one ``ProcessPoolExecutor`` (default start method) /
  ``ThreadPoolExecutor`` kept for the whole run, ``executor.map(fn, blobs, chunksize=C)`` per
  epoch: every item of the epoch submitted at once, as a user of the standard library writes it.

Cases alternate inside each repeat (in reverse order on odd repeats), so a ratio compares runs
seconds apart on this shared machine. The parent samples the child's process tree (CPU time)
between its START and END markers, like :mod:`benchmarks.harness`.

    python -m benchmarks.s4_engine --seconds 30 --repeats 3
    python -m benchmarks.s4_engine --seconds 10 --cases pipeflow-process bare-process --chunksize 1 8
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = ("pipeflow-process", "bare-process", "pipeflow-thread", "bare-thread")


def decode_224(data: bytes) -> Any:
    """JPEG bytes -> 224x224 uint8 CHW tensor (reduced-scale decode first, then bilinear)."""
    img: Image.Image  # an ImageFile until converted
    with Image.open(io.BytesIO(data)) as img:
        img.draft("RGB", (224, 224))
        img = img.convert("RGB").resize((224, 224), Image.Resampling.BILINEAR)
        array = np.asarray(img)
    # the CHW copy in numpy: torch's intra-op threads would time (and, after a fork of a
    # parent that used them, hang) something other than the engine
    return torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))


def decode_224_numpy(data: bytes) -> Any:
    """The same decode, the result as a numpy HWC array (pickles with out-of-band buffers)."""
    with Image.open(io.BytesIO(data)) as img:
        img.draft("RGB", (224, 224))
        return np.asarray(img.convert("RGB").resize((224, 224), Image.Resampling.BILINEAR))


def decode_224_shape(data: bytes) -> tuple[int, ...]:
    """The same decode, only the shape sent back (what ``pipeflow bench --scenarios s4`` maps)."""
    return tuple(decode_224(data).shape)


#: ``--result``: what the mapped function returns
FUNCTIONS = {"tensor": "decode_224", "numpy": "decode_224_numpy", "shape": "decode_224_shape"}


def _blobs(kind: str, count: int) -> list[bytes]:
    from benchmarks import photos

    distinct = [photos.jpeg(kind, i) for i in range(min(count, photos.DISTINCT))]
    return [distinct[i % len(distinct)] for i in range(count)]


# ---- child side ---------------------------------------------------------------------------------
class _Epochs:
    """Iterating this runs one epoch; ``close()`` ends the run."""

    def __init__(self, spec: dict[str, Any], blobs: list[bytes]) -> None:
        self.spec, self.blobs = spec, blobs
        self.pool: Any = None
        self.pipeline: Any = None
        # by its importable name, not as __main__'s: what a user's training script would map
        self.fn = getattr(importlib.import_module("benchmarks.s4_engine"), FUNCTIONS[spec["result"]])
        case = spec["case"]
        if case.startswith("pipeflow-"):
            import pipeflow as pf

            self.pipeline = pf.from_items(blobs).map(self.fn, workers=spec["workers"],
                                                     method=case.split("-")[1],
                                                     max_inflight=spec.get("max_inflight"))

    def __iter__(self) -> Any:
        if self.pipeline is not None:
            return iter(self.pipeline)
        if self.pool is None:
            if self.spec["case"] == "bare-process":
                method = self.spec.get("start_method")
                ctx = multiprocessing.get_context(method) if method else None
                self.pool = ProcessPoolExecutor(self.spec["workers"], mp_context=ctx)
            else:
                self.pool = ThreadPoolExecutor(self.spec["workers"])
        if self.spec["case"] == "bare-process":
            return self.pool.map(self.fn, self.blobs, chunksize=self.spec["chunksize"])
        return self.pool.map(self.fn, self.blobs)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def child_main(spec: dict[str, Any]) -> None:
    blobs = _blobs(spec["kind"], spec["epoch_items"])
    run = _Epochs(spec, blobs)
    seconds = spec["seconds"]
    firsts: list[float] = []
    n = 0
    print("START", flush=True)
    t0 = time.perf_counter()
    done = False
    while not done:
        e0 = time.perf_counter()
        it = iter(run)
        first = True
        for _ in it:
            now = time.perf_counter()
            if first:
                firsts.append(now - e0)
                first = False
            n += 1
            if now - t0 >= seconds:
                done = True
                break
        del it
    elapsed = time.perf_counter() - t0
    print("END", flush=True)
    run.close()
    print("RESULT " + json.dumps({"samples": n, "seconds": elapsed, "firsts": firsts}), flush=True)


# ---- parent side --------------------------------------------------------------------------------
def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.harness import _kill_tree, _Monitor

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    env.setdefault("PYTHONWARNINGS", "ignore")
    env.pop("PIPEFLOW_START_METHOD", None)
    if spec["case"].startswith("pipeflow") and spec.get("start_method"):
        env["PIPEFLOW_START_METHOD"] = spec["start_method"]  # as a user names it
    load0 = os.getloadavg()[0]
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.s4_engine", "--child", json.dumps(spec)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    monitor = _Monitor(proc.pid)
    monitor.start()
    err: list[str] = []
    err_thread = threading.Thread(target=lambda: err.extend(proc.stderr or []), daemon=True)
    err_thread.start()
    result: dict[str, Any] = {}
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line == "START":
                monitor.open()
            elif line == "END":
                monitor.close()
            elif line.startswith("RESULT "):
                result = json.loads(line[7:])
        proc.wait(timeout=120)
    finally:
        monitor.close()
        monitor.stop()
        _kill_tree(monitor, proc)
        err_thread.join(timeout=5)
    if not result:
        raise RuntimeError(f"{spec['case']} failed: {''.join(err)[-2000:]}")
    firsts = result["firsts"]
    return {
        **spec, "samples": result["samples"], "seconds": round(result["seconds"], 3),
        "per_s": round(result["samples"] / result["seconds"], 1),
        "first_item_s": round(firsts[0], 4),
        "epochs": len(firsts),
        "later_first_item_s": round(max(firsts[1:]), 4) if len(firsts) > 1 else None,
        "cpu_ms_per_sample": round(1000 * monitor.cpu_s / max(result["samples"], 1), 3),
        "cpu_pct": round(100 * monitor.cpu_s / monitor.window_s, 1) if monitor.window_s else None,
        "load": (round(load0, 2), round(os.getloadavg()[0], 2)),
    }


def _label(spec: dict[str, Any]) -> str:
    if spec["case"] == "bare-process":
        method = f" {spec['start_method']}" if spec.get("start_method") else ""
        return f"bare-process c{spec['chunksize']}{method}"
    label = spec["case"]
    if spec["case"].startswith("pipeflow") and spec.get("max_inflight"):
        label += f" w{spec['max_inflight']}"
    if spec["case"] == "pipeflow-process" and spec.get("start_method"):
        label += f" {spec['start_method']}"
    return label


def _specs(args: argparse.Namespace) -> list[dict[str, Any]]:
    base = {"result": args.result, "kind": args.kind, "seconds": args.seconds,
            "epoch_items": args.epoch_items, "workers": args.workers}
    out = []
    for case in args.cases:
        if case == "bare-process":
            out += [{**base, "case": case, "chunksize": c, "start_method": m or None}
                    for c in args.chunksize for m in args.bare_start_method]
        elif case == "pipeflow-process":
            out += [{**base, "case": case, "max_inflight": w or None, "start_method": m or None}
                    for w in args.max_inflight for m in args.pipeflow_start_method]
        elif case.startswith("pipeflow"):
            out += [{**base, "case": case, "max_inflight": w or None} for w in args.max_inflight]
        else:
            out.append({**base, "case": case})
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kind", default="imagenet", choices=("imagenet", "photo"))
    p.add_argument("--result", default="tensor", choices=tuple(FUNCTIONS),
                   help="what the function returns: a 224x224 CHW uint8 tensor, an HWC numpy array, "
                        "or only the shape")
    p.add_argument("--epoch-items", type=int, default=2000, help="items per epoch")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    p.add_argument("--chunksize", type=int, nargs="+", default=[1], help="bare-process chunk sizes")
    p.add_argument("--bare-start-method", nargs="+", default=[""],
                   help="start methods of the bare process pool ('' : the platform default, fork on Linux)")
    p.add_argument("--pipeflow-start-method", nargs="+", default=[""],
                   help="start methods of pipeflow's process map ('' : the default, a warm fork server "
                        "where it can be; 'forkserver': a fresh interpreter's)")
    p.add_argument("--max-inflight", type=int, nargs="+", default=[0],
                   help="pipeflow max_inflight values (0: the default)")
    p.add_argument("--json", help="write every row here")
    args = p.parse_args(argv)
    if args.child:
        child_main(json.loads(args.child))
        return
    rows = []
    for r in range(args.repeats):
        specs = _specs(args)
        # the load of a shared machine drifts within a repeat: odd repeats run the cases backwards
        for spec in specs if r % 2 == 0 else specs[::-1]:
            row = run_one(spec)
            row["repeat"] = r
            rows.append(row)
            print(f"[{r}] {_label(spec):<24} {row['per_s']:>8.1f}/s first {row['first_item_s']:.3f} s "
                  f"later epochs' first <= {row['later_first_item_s']} s ({row['epochs']} epochs) "
                  f"cpu {row['cpu_ms_per_sample']} ms/sample {row['cpu_pct']}% load {row['load']}",
                  flush=True)
    _summary(rows)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


def _summary(rows: list[dict[str, Any]]) -> None:
    """Per repeat, each pipeflow row over the bare row of the same method in that repeat."""
    print("\nratios within a repeat (pipeflow / bare, same method):")
    labels = sorted({_label(r) for r in rows if r["case"].startswith("pipeflow")})
    for label in labels:
        for bare_label in sorted({_label(r) for r in rows if r["case"].startswith("bare")}):
            method = label.split()[0].split("-")[1]
            if not bare_label.startswith(f"bare-{method}"):
                continue
            ratios = []
            for rep in sorted({r["repeat"] for r in rows}):
                mine = [r for r in rows if r["repeat"] == rep and _label(r) == label]
                bare = [r for r in rows if r["repeat"] == rep and _label(r) == bare_label]
                if mine and bare:
                    ratios.append(mine[0]["per_s"] / bare[0]["per_s"])
            if ratios:
                print(f"  {label:<24} / {bare_label:<18} median {statistics.median(ratios):.3f} "
                      f"[{min(ratios):.3f} .. {max(ratios):.3f}] over {len(ratios)}")


if __name__ == "__main__":
    main()
