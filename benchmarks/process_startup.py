"""Time to the first item of a process ``map``, the CPU it took, and the memory of the process
tree, in a fresh interpreter per run.

``from_items(items).map(wait_first).map(decode, workers=2, method="process")``: the first
(inline) stage waits ``--upstream-s`` before its first item, as listing a bucket or opening the
first shard does; the process map then needs its fork server and its workers. Cases:

* ``prestart`` (the default): the fork server is forked from this process when the map stage
  starts, if it runs no other thread (a warm fork server);
* ``fresh-forkserver``: the start method named (``PIPEFLOW_START_METHOD=forkserver``), so the
  fork server is a fresh interpreter that imports the mapped function's module (torch, numpy,
  PIL) before it forks the first worker;
* ``no-prestart``: the default with the server left to the first submitted item;
* ``bare-fork``: a ``ProcessPoolExecutor(2)`` with fork, ``executor.map(decode, ...)`` over the
  same items, as a user of the standard library writes it.

The pipeline is described first, its CPU reported apart (``describe``: importing pipeflow's
stages); ``cpu`` is the whole process tree's (owner, fork server, resource tracker, workers) from
``iter()`` to the first item. ``pss`` is the tree's proportional set size after ``--items``
items (pages shared by forked processes counted once), ``private`` its private dirty pages.

    python -m benchmarks.process_startup --upstream-s 0 1 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_waited: list[bool] = []
CASES = ("prestart", "fresh-forkserver", "no-prestart", "bare-fork")


def wait_first(item: Any) -> Any:
    if not _waited:
        _waited.append(True)
        time.sleep(float(os.environ.get("STARTUP_UPSTREAM_S", "0")))
    return item


def _tree() -> list[psutil.Process]:
    me = psutil.Process()
    return [me, *me.children(recursive=True)]


def _tree_cpu() -> float:
    total = 0.0
    for p in _tree():
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def _tree_memory_mb() -> tuple[float, float]:
    """(PSS, private dirty) of this process and every process below it, in MB."""
    pss = private = 0
    for p in _tree():
        try:
            with open(f"/proc/{p.pid}/smaps_rollup") as fh:
                for line in fh:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1])
                    elif line.startswith("Private_Dirty:"):
                        private += int(line.split()[1])
        except OSError:
            pass
    return pss / 1024, private / 1024


def _bare(blobs: list[bytes], fn: Any) -> tuple[Iterator[Any], Any]:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork"))
    return pool.map(fn, map(wait_first, blobs)), lambda: pool.shutdown(wait=True, cancel_futures=True)


def child_main(case: str, items: int) -> None:
    import pipeflow as pf
    import pipeflow.stages.map as map_stage
    from benchmarks import photos
    from benchmarks.s4_engine import decode_224_numpy  # by its importable name, as a user's module

    if case == "no-prestart":
        map_stage.prestart = lambda *args, **kwargs: False
    distinct = [photos.jpeg("imagenet", i) for i in range(8)]
    # more than are read: the memory is measured while the workers are busy, not after the epoch
    blobs = [distinct[i % 8] for i in range(items + 9)]
    cpu0 = _tree_cpu()
    if case != "bare-fork":
        pipe = pf.from_items(blobs).map(wait_first).map(decode_224_numpy, workers=2, method="process")
    describe = _tree_cpu() - cpu0
    t0 = time.perf_counter()
    cpu0 = _tree_cpu()
    if case == "bare-fork":
        it, close = _bare(blobs, decode_224_numpy)
    else:
        pipe_it = iter(pipe)
        it, close = pipe_it, pipe_it.close
    next(it)
    first = time.perf_counter() - t0
    cpu = _tree_cpu() - cpu0
    for _ in zip(range(items), it):
        pass
    pss, private = _tree_memory_mb()
    close()
    print("RESULT " + json.dumps({"first_s": first, "cpu_s": cpu, "describe_cpu_s": describe,
                                  "pss_mb": pss, "private_mb": private}), flush=True)


def _run(case: str, upstream: float, items: int) -> dict[str, Any]:
    env = {**os.environ, "STARTUP_UPSTREAM_S": str(upstream)}
    env.pop("PIPEFLOW_START_METHOD", None)
    if case == "fresh-forkserver":
        env["PIPEFLOW_START_METHOD"] = "forkserver"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), ROOT]))
    out = subprocess.run([sys.executable, "-m", "benchmarks.process_startup", "--child", case,
                          "--items", str(items)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(lines[-1][7:])


def _spread(values: list[float], digits: int) -> str:
    return (f"{statistics.median(values):.{digits}f} "
            f"[{min(values):.{digits}f}..{max(values):.{digits}f}]")


def _summary(rows: list[dict[str, Any]], cases: list[str], upstreams: list[float]) -> None:
    print("\nmedian [min .. max]:")
    for upstream in upstreams:
        for case in cases:
            mine = [r for r in rows if (r["case"], r["upstream_s"]) == (case, upstream)]
            print(f"  upstream {upstream:.1f} s {case:<16} "
                  f"first {_spread([r['first_s'] for r in mine], 3)} s, "
                  f"cpu {_spread([r['cpu_s'] for r in mine], 2)} s "
                  f"(+ describe {_spread([r['describe_cpu_s'] for r in mine], 2)} s), "
                  f"pss {_spread([r['pss_mb'] for r in mine], 0)} MB, "
                  f"private {_spread([r['private_mb'] for r in mine], 0)} MB")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    p.add_argument("--upstream-s", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--items", type=int, default=400,
                   help="items read after the first before the tree's memory is measured")
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--json", help="write every row here")
    args = p.parse_args(argv)
    if args.child:
        child_main(args.child, args.items)
        return
    rows = []
    for r in range(args.repeats):
        for upstream in args.upstream_s:
            # the load of a shared machine drifts within a repeat: odd repeats run the cases backwards
            for case in args.cases if r % 2 == 0 else args.cases[::-1]:
                row = {"case": case, "upstream_s": upstream, "repeat": r,
                       **_run(case, upstream, args.items)}
                rows.append(row)
                print(f"[{r}] upstream {upstream:.1f} s {case:<16} first item {row['first_s']:.3f} s "
                      f"cpu {row['cpu_s']:.2f} s (describe {row['describe_cpu_s']:.2f} s) "
                      f"pss {row['pss_mb']:.0f} MB private {row['private_mb']:.0f} MB", flush=True)
    _summary(rows, args.cases, args.upstream_s)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
