"""A function that holds the GIL on a thread map: one thread, two, and ``workers="auto"``.

    python -m benchmarks.thread_gil [--seconds S] [--rounds N]

A tuned thread map starts at the cores and never tries fewer (docs/autotune.md). This measures
what that costs where it could cost most: a pure-Python function that never releases the GIL.
The three configurations run in one process, interleaved (each round rotates their order), for
the same time each; the table shows items/s per round and the median.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import pipeflow as pf

CONFIGS: tuple[Any, ...] = (1, 2, "auto")


def hold_gil(x: int) -> int:
    """About 0.1 ms of pure-Python arithmetic: the GIL is held throughout."""
    total = 0
    for i in range(4000):
        total += i * i
    return total + x


def rate(workers: Any, seconds: float) -> tuple[float, str]:
    """Items/s of ``map(hold_gil, workers=workers)`` over ``seconds``, and what auto chose."""
    pipe = pf.from_items(range(10**9)).map(hold_gil, workers=workers)
    count, t0 = 0, time.perf_counter()
    for _ in pipe:
        count += 1
        if time.perf_counter() - t0 > seconds:
            break
    elapsed = time.perf_counter() - t0
    numbers = pipe.stats()["map"]
    chosen = f"{numbers['workers']:g}/{numbers['inflight']:g}" if "inflight" in numbers else ""
    return count / elapsed, chosen


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="per configuration and round")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    rates: dict[Any, list[float]] = {c: [] for c in CONFIGS}
    chosen = []
    for r in range(args.rounds):
        shift = r % len(CONFIGS)
        for workers in CONFIGS[shift:] + CONFIGS[:shift]:
            value, picked = rate(workers, args.seconds)
            rates[workers].append(value)
            if picked:
                chosen.append(picked)
    print("| map(workers=...) | items/s per round | median |\n|---|---|---:|")
    for workers, values in rates.items():
        print(f"| {workers!r} | {', '.join(f'{v:.0f}' for v in values)} | {statistics.median(values):.0f} |")
    paired = ", ".join(f"{a / b:.2f}" for a, b in zip(rates["auto"], rates[1]))
    print(f"\nauto / one thread, per round: {paired}; auto chose (threads/in flight): {', '.join(chosen)}")


if __name__ == "__main__":
    main()
