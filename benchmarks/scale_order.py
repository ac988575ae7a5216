"""Figures for docs/scale.md (assignment, order and resume state), printed as JSON.

    PYTHONPATH=. python -m benchmarks.scale_order [--quick]

* ``state``: the size of ``StatefulDataLoader.state_dict()`` (pickled, as checkpoints store
  it) with 8 DataLoader workers, after 40 batches, for ``shuffle(10000)`` read by assignment
  (``from_items(...).shuffle(10000).batch(32)``) and for a ``shuffle(10000)`` after an
  expansion, which stays a buffer shuffle;
* ``shard``: CPU seconds one shard of 8 (rank 0 of 8, no workers) spends to read its share of
  ``from_items(range(N)).shuffle(10000).shard_by_rank()``;
* ``census``: a simulated job of 64 ranks x 8 workers over the pure functions of
  ``pipeflow.assign``: every index once, and each shard's count and CPU time;
* ``lookup``: microseconds per place of the global order.

Runs against whatever ``pipeflow`` is on the path, so the same script measures an older
checkout (the parts it does not have are skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import time
from collections import Counter
from typing import Any

import pipeflow as pf


def expand(i: int) -> list[int]:
    return [i * 100 + j for j in range(100)]


def state_sizes(workers: int = 8, batches: int = 40) -> dict[str, int]:
    from torchdata.stateful_dataloader import StatefulDataLoader

    pipes = {
        "shuffle(10000) by assignment": pf.from_items(range(400_000)).shuffle(10_000, seed=1).batch(32),
        "shuffle(10000) after unbatch": (pf.from_items(range(4_000)).map(expand).unbatch()
                                         .shuffle(10_000, seed=1).batch(32)),
    }
    out = {}
    for name, pipe in pipes.items():
        loader = StatefulDataLoader(pipe, batch_size=None, num_workers=workers)
        it = iter(loader)
        for _ in range(batches):
            next(it)
        out[name] = len(pickle.dumps(loader.state_dict()))
        del it, loader
    return out


def shard_cost(n: int) -> float:
    os.environ.update(RANK="0", WORLD_SIZE="8")
    try:
        pipe = pf.from_items(range(n)).shuffle(10_000, seed=1).shard_by_rank()
        t0 = time.process_time()
        got = sum(1 for _ in pipe)
        spent = time.process_time() - t0
    finally:
        del os.environ["RANK"], os.environ["WORLD_SIZE"]
    assert got in (n // 8, n // 8 + 1)
    return spent


def census(n: int, ranks: int = 64, workers: int = 8, unit: int = 32) -> dict[str, Any]:
    from pipeflow.assign import Order, Split

    order, split = Order(n, 10_000, 5), Split(ranks, workers, unit)
    seen: Counter[int] = Counter()
    counts, seconds = [], []
    for r in range(ranks):
        for w in range(workers):
            t0 = time.process_time()
            places = [order[split.position(r, w, k)] for k in range(split.count(r, w, n))]
            seconds.append(time.process_time() - t0)
            counts.append(len(places))
            seen.update(places)
    exact = len(seen) == n and set(seen.values()) == {1}
    return {"n": n, "shards": ranks * workers, "exact": exact, "items_per_shard": [min(counts), max(counts)],
            "cpu_s_per_shard": [round(min(seconds), 4), round(max(seconds), 4)],
            "cpu_s_total": round(sum(seconds), 2)}


def lookup_us(n: int = 10**8, samples: int = 200_000) -> float:
    from pipeflow.assign import Order

    order = Order(n, 10_000, 3)
    t0 = time.process_time()
    for p in range(0, samples * 499, 499):
        order[p]
    return (time.process_time() - t0) / samples * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--quick", action="store_true", help="smaller N (a smoke run)")
    args = parser.parse_args()
    n = 20_000 if args.quick else 400_000
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                                      f"Python {platform.python_version()}",
                           "pipeflow": os.path.dirname(pf.__file__)}
    out["state_bytes_8_workers"] = state_sizes(workers=2 if args.quick else 8)
    out[f"shard_cpu_s_rank0_of_8_n{n}"] = round(shard_cost(n), 3)
    try:
        out["census_64x8"] = census(50_000 if args.quick else 1_000_000)
        out["lookup_us_n1e8"] = round(lookup_us(), 2)
    except ImportError:
        out["census_64x8"] = "pipeflow.assign not in this version"
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
