"""The engine's own cost per item of a process ``map``: CPU time of the whole process tree.

The mapped function returns an array of zeros (numpy or torch) of a given size, so nearly all
of the CPU is the engine's: moving the task to a worker and the result back. Each case runs in
a fresh interpreter with a warm pool (one epoch first, not measured) and counts the CPU time of
every process of its tree (the owner's threads, the fork server, the workers) over the
measured epochs. CPU time barely moves with the machine's load, unlike wall time.

Cases:

* ``shm``: ``from_items(...).map(fn, workers=2, method="process")``, arrays of at least
  ``--min-bytes`` through shared memory (pipeflow's default threshold when not given);
* ``pickle``: the same with the threshold out of reach, so every result is pickled;
* ``bare``: one ``ProcessPoolExecutor(2)`` (fork), ``executor.map(fn, items)``.

``--consume copy`` copies every result into a preallocated batch buffer, as a collate does
(reading the pages of the result is then part of the cost); ``drop`` only lets it go.

    python -m benchmarks.engine_cost --sizes 150000 600000 2400000 9600000 --repeats 3
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
import psutil
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ENV = "PIPEFLOW_ENGINE_COST_SPEC"
_SPEC: dict[str, Any] = json.loads(os.environ.get(_ENV, "{}"))

if _SPEC.get("min_bytes") is not None:
    # set here, at import, so that the fork server (which imports this module before forking
    # the workers) and the workers see the same threshold as the owner
    from pipeflow.executor import shm as _shm

    _shm.MIN_BYTES = _SPEC["min_bytes"]


def zeros(i: int) -> Any:
    """An array of ``nbytes`` zeros (uint8), as numpy or torch."""
    n = _SPEC["nbytes"]
    array = np.zeros(n, dtype=np.uint8)
    # made by numpy either way: torch's intra-op threads would spin on the CPU being measured
    return torch.from_numpy(array) if _SPEC["kind"] == "torch" else array


def _tree_cpu() -> dict[int, float]:
    me = psutil.Process()
    out = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.Error:
            pass
    return out


def _epochs(spec: dict[str, Any]) -> Any:
    items = list(range(spec["items"]))
    # by its importable name, not as __main__'s: what a user's training script would map
    zeros = importlib.import_module("benchmarks.engine_cost").zeros
    if spec["case"] == "bare":
        pool = ProcessPoolExecutor(spec["workers"])
        return (lambda: pool.map(zeros, items)), pool.shutdown
    import pipeflow as pf

    pipe = pf.from_items(items).map(zeros, workers=spec["workers"], method="process")
    return (lambda: iter(pipe)), (lambda: None)


def child_main() -> None:
    spec = _SPEC
    epoch, close = _epochs(spec)
    batch = np.empty(spec["nbytes"], dtype=np.uint8)
    copy = spec["consume"] == "copy"

    def one_epoch() -> int:
        n = 0
        for value in epoch():
            if copy:
                batch[:] = value.numpy() if isinstance(value, torch.Tensor) else value
            n += 1
        return n

    one_epoch()  # warm: workers started, allocator and caches settled
    before = _tree_cpu()
    t0 = time.perf_counter()
    n = sum(one_epoch() for _ in range(spec["epochs"]))
    wall = time.perf_counter() - t0
    after = _tree_cpu()
    close()
    cpu = sum(used - before.get(pid, 0.0) for pid, used in after.items())
    print("RESULT " + json.dumps({"items": n, "cpu_s": cpu, "wall_s": wall,
                                  "procs": len(after), "lost": sorted(set(before) - set(after))}),
          flush=True)


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    env[_ENV] = json.dumps(spec)
    out = subprocess.run([sys.executable, "-m", "benchmarks.engine_cost", "--child"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"{spec} failed: {out.stderr[-2000:]}")
    result = json.loads(lines[-1][7:])
    return {**spec, **result, "ms_per_item": 1000 * result["cpu_s"] / result["items"]}


def _items_for(nbytes: int, budget: int) -> int:
    return max(50, min(2000, budget // nbytes))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--sizes", type=int, nargs="+", default=[150_000, 600_000, 2_400_000, 9_600_000])
    p.add_argument("--kinds", nargs="+", default=["numpy", "torch"], choices=("numpy", "torch"))
    p.add_argument("--cases", nargs="+", default=["shm", "pickle", "bare"], choices=("shm", "pickle", "bare"))
    p.add_argument("--min-bytes", type=int, default=None, help="the shm threshold of the shm case")
    p.add_argument("--consume", default="copy", choices=("copy", "drop"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--bytes-per-epoch", type=int, default=1_000_000_000,
                   help="items per epoch: this many bytes, between 50 and 2000 items")
    p.add_argument("--json", help="write every row here")
    args = p.parse_args(argv)
    if args.child:
        child_main()
        return
    rows = []
    for r in range(args.repeats):
        for nbytes in args.sizes:
            for kind in args.kinds:
                for case in args.cases:
                    min_bytes = {"shm": args.min_bytes if args.min_bytes is not None else None,
                                 "pickle": 1 << 62, "bare": None}[case]
                    spec = {"case": case, "kind": kind, "nbytes": nbytes, "min_bytes": min_bytes,
                            "consume": args.consume, "workers": args.workers, "epochs": args.epochs,
                            "items": _items_for(nbytes, args.bytes_per_epoch)}
                    row = run_one(spec)
                    row["repeat"] = r
                    rows.append(row)
                    print(f"[{r}] {nbytes:>9} {kind:<5} {case:<6} {row['ms_per_item']:.3f} ms/item "
                          f"({row['items']} items, wall {row['wall_s']:.1f} s)", flush=True)
    print("\nmedian [min .. max] CPU ms per item over repeats:")
    for nbytes in args.sizes:
        for kind in args.kinds:
            cells = []
            for case in args.cases:
                v = [r["ms_per_item"] for r in rows
                     if (r["nbytes"], r["kind"], r["case"]) == (nbytes, kind, case)]
                cells.append(f"{case} {statistics.median(v):.3f} [{min(v):.3f}..{max(v):.3f}]")
            print(f"  {nbytes:>9} {kind:<5} " + "  ".join(cells))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
