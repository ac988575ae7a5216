"""Time to the first item of a process ``map``, and the CPU it took, in a fresh interpreter.

``from_items(range(n)).map(wait_first, ...).map(decode, workers=2, method="process")``: the
first (inline) stage waits ``--upstream-s`` before its first item, as listing a bucket or
opening the first shard does; the process map then needs its fork server (which imports the
mapped function's module: torch, numpy, PIL) and its workers. ``--no-prestart`` leaves the
fork server to the first submitted item, as before it was started when the map stage starts
(the pipeline's first next()). ``fresh-forkserver`` names the start method
(``PIPEFLOW_START_METHOD=forkserver``), so the fork server is a fresh interpreter; the default
case forks a warm one from the owner when it runs no other thread. CPU is the whole process
tree's (owner, fork server, workers) up to the first item.

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
from typing import Any

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_waited: list[bool] = []
#: default (a warm fork server where it can be), the fresh-interpreter fork server named, and
#: the default with the server left to the first submitted item
CASES = ("prestart", "fresh-forkserver", "no-prestart")


def wait_first(item: Any) -> Any:
    if not _waited:
        _waited.append(True)
        time.sleep(float(os.environ.get("STARTUP_UPSTREAM_S", "0")))
    return item


def _tree_cpu() -> float:
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def child_main(prestart: bool) -> None:
    import pipeflow as pf
    import pipeflow.stages.map as map_stage
    from benchmarks import photos
    from benchmarks.s4_engine import decode_224_numpy  # by its importable name, as a user's module

    if not prestart:
        map_stage.prestart = lambda *args, **kwargs: False
    blobs = [photos.jpeg("imagenet", i) for i in range(8)]
    cpu0 = _tree_cpu()
    pipe = pf.from_items(blobs).map(wait_first).map(decode_224_numpy, workers=2, method="process")
    t0 = time.perf_counter()
    it = iter(pipe)
    next(it)
    first = time.perf_counter() - t0
    cpu = _tree_cpu() - cpu0
    it.close()
    print("RESULT " + json.dumps({"first_s": first, "cpu_s": cpu}), flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    p.add_argument("--upstream-s", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    args = p.parse_args(argv)
    if args.child:
        child_main(args.child != "no-prestart")
        return
    rows = []
    for r in range(args.repeats):
        for upstream in args.upstream_s:
            for case in args.cases:
                env = {**os.environ, "STARTUP_UPSTREAM_S": str(upstream)}
                if case == "fresh-forkserver":
                    env["PIPEFLOW_START_METHOD"] = "forkserver"
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), ROOT]))
                out = subprocess.run([sys.executable, "-m", "benchmarks.process_startup", "--child", case],
                                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
                lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
                if not lines:
                    raise RuntimeError(out.stderr[-2000:])
                row = {"case": case, "upstream_s": upstream, "repeat": r, **json.loads(lines[-1][7:])}
                rows.append(row)
                print(f"[{r}] upstream {upstream:.1f} s {case:<16} first item {row['first_s']:.3f} s "
                      f"cpu {row['cpu_s']:.2f} s", flush=True)
    print("\nmedian [min .. max]:")
    for upstream in args.upstream_s:
        for case in args.cases:
            f = [r["first_s"] for r in rows if (r["case"], r["upstream_s"]) == (case, upstream)]
            c = [r["cpu_s"] for r in rows if (r["case"], r["upstream_s"]) == (case, upstream)]
            print(f"  upstream {upstream:.1f} s {case:<16} first {statistics.median(f):.3f} "
                  f"[{min(f):.3f}..{max(f):.3f}] s, cpu {statistics.median(c):.2f} "
                  f"[{min(c):.2f}..{max(c):.2f}] s")


if __name__ == "__main__":
    main()
