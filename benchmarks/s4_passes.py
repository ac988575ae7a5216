"""S4 with passes of any length: ``loader()`` (threads or processes) against ``DataLoader`` workers.

The quick S4 sizes hold 12 PNGs, so a case there is a series of 12-sample passes, and a
``DataLoader(num_workers=2)`` without persistent workers forks its workers again for every
pass: those rows measure the fork as much as the decode. Here the pass length is a parameter
(``--count``), so the same factories (:mod:`benchmarks.pipeflow_cases`) can be compared in
passes as long as a real epoch. The cases alternate inside each repeat, all in this process
tree (the pool of ``map(method="process")`` stays warm across passes, as it does across
epochs); CPU is the whole tree's, and the training process's share is reported apart (with
process workers it holds the hand-off of every input).

    python -m benchmarks.s4_passes --layout single --count 400 --size 1024 --seconds 6 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import psutil

from benchmarks import pipeflow_cases

CASES = ("dataloader", "loader-process", "loader-thread")


def _cpu(proc: psutil.Process) -> tuple[float, float]:
    """(CPU seconds of the whole tree, reaped children included; of ``proc`` alone)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:  # a DataLoader worker that just ended
            continue
        total += t.user + t.system + t.children_user + t.children_system
    own = proc.cpu_times()
    return total, own.user + own.system


def factory(case: str, layout: str, count: int, size: int) -> Callable[[], Any]:
    """The iterable of one case: S4's own factories, 2 workers, batches of 4."""
    if case == "dataloader":
        return lambda: pipeflow_cases.make_decode_dataloader(layout, count, size, 2)
    method = case.removeprefix("loader-")
    return lambda: pipeflow_cases.make_decode_loader(layout, count, size, 2, method=method)


def measure(make: Callable[[], Any], seconds: float) -> dict[str, float]:
    """Passes over ``make()``'s iterable until ``seconds`` have gone (the last pass finishes)."""
    iterable = make()
    me = psutil.Process()
    samples = passes = 0
    tree0, own0 = _cpu(me)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        passes += 1
        samples += sum(len(batch) for batch in iterable)
    elapsed = time.perf_counter() - t0
    tree1, own1 = _cpu(me)
    close = getattr(iterable, "close", None)
    if callable(close):
        close()
    return {"samples_per_s": samples / elapsed, "cpu_ms_per_sample": 1000 * (tree1 - tree0) / samples,
            "main_cpu_ms_per_sample": 1000 * (own1 - own0) / samples,
            "cpu_pct": 100 * (tree1 - tree0) / elapsed, "passes": passes, "samples": samples,
            "load_1min": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", default="single", choices=("single", "jpeg"))
    ap.add_argument("--count", type=int, default=400, help="samples a pass")
    ap.add_argument("--size", type=int, default=1024, help="image side in pixels")
    ap.add_argument("--seconds", type=float, default=6.0, help="per case and repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    ap.add_argument("--out", help="write every row here as JSON")
    args = ap.parse_args(argv)
    rows = []
    for repeat in range(args.repeats):
        for case in args.cases:
            row = {"case": case, "repeat": repeat, "time": time.strftime("%H:%M:%S"),
                   **measure(factory(case, args.layout, args.count, args.size), args.seconds)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    for case in args.cases:
        mine = [r for r in rows if r["case"] == case]
        rates = [r["samples_per_s"] for r in mine]
        cpu = [r["cpu_ms_per_sample"] for r in mine]
        print(f"{case:15s} median {statistics.median(rates):7.1f} samples/s "
              f"({', '.join(f'{x:.1f}' for x in rates)}), CPU {min(cpu):.2f}-{max(cpu):.2f} ms a sample")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"args": vars(args), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
