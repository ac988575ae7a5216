"""Per-stage overhead: items/s through chains of trivial stages, pipeflow vs torchdata.nodes.

Both libraries run the same graphs in one process run, on the same items, alternating
repetitions so background noise hits both alike; the report is the ratio of medians.

    python -m benchmarks.overhead [--items N] [--repeats R]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import pipeflow as pf


def _identity(x: Any) -> Any:
    return x


def _pipeflow_inline(n: int) -> Iterable[Any]:
    # five stages after the source: map, map, batch, unbatch, map
    return (pf.from_items(range(n)).map(_identity).map(_identity).batch(8).unbatch().map(_identity))


def _pipeflow_parallel(n: int) -> Iterable[Any]:
    return (pf.from_items(range(n)).map(_identity).map(_identity, workers=2).batch(8).unbatch()
            .prefetch(8))


def _nodes_inline(n: int) -> Iterable[Any]:
    from torchdata import nodes as tn

    node = tn.IterableWrapper(range(n))
    node = tn.Mapper(node, _identity)
    node = tn.Mapper(node, _identity)
    node = tn.Batcher(node, batch_size=8, drop_last=False)
    node = tn.Unbatcher(node)
    node = tn.Mapper(node, _identity)
    return tn.Loader(node)


def _nodes_parallel(n: int) -> Iterable[Any]:
    from torchdata import nodes as tn

    node = tn.IterableWrapper(range(n))
    node = tn.Mapper(node, _identity)
    node = tn.ParallelMapper(node, _identity, num_workers=2, method="thread", in_order=True)
    node = tn.Batcher(node, batch_size=8, drop_last=False)
    node = tn.Unbatcher(node)
    node = tn.Prefetcher(node, prefetch_factor=8)
    return tn.Loader(node)


def _items_per_second(make: Callable[[int], Iterable[Any]], n: int) -> float:
    t0 = time.perf_counter()
    count = sum(1 for _ in make(n))
    elapsed = time.perf_counter() - t0
    if count != n:
        raise AssertionError(f"{make.__name__} yielded {count} items, expected {n}")
    return n / elapsed


CHAINS = {
    "inline (5 stages)": (_pipeflow_inline, _nodes_inline),
    "threads + prefetch": (_pipeflow_parallel, _nodes_parallel),
}


def run(items: int = 100_000, repeats: int = 5) -> list[dict[str, Any]]:
    """Measure every chain; returns one row per chain with items/s and the ratio."""
    rows = []
    for name, (ours, theirs) in CHAINS.items():
        n = items if "inline" in name else items // 4
        ours_s, theirs_s = [], []
        for _ in range(repeats):
            ours_s.append(_items_per_second(ours, n))
            theirs_s.append(_items_per_second(theirs, n))
        a, b = statistics.median(ours_s), statistics.median(theirs_s)
        rows.append({"chain": name, "items": n, "pipeflow_items_per_s": round(a),
                     "torchdata_nodes_items_per_s": round(b), "ratio": round(a / b, 2)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    rows = run(args.items, args.repeats)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'chain':<22} {'pipeflow/s':>12} {'nodes/s':>12} {'ratio':>7}")
    for r in rows:
        print(f"{r['chain']:<22} {r['pipeflow_items_per_s']:>12,} {r['torchdata_nodes_items_per_s']:>12,} "
              f"{r['ratio']:>7.2f}")


if __name__ == "__main__":
    main()
