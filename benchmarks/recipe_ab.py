"""The ``s3connector-shards`` recipe against the article code it reproduces, variants alternated.

One pass each over the same tar shards (~116 KB samples) behind the delay proxy (T = 20 ms),
2 DataLoader workers, batches of 4, rounds alternating the variants so load on the machine hits
each alike. Per pass: samples/s, the client's CPU (main process and workers), the server's and
the proxy's CPU, and the requests the proxy counted. The server's CPU per pass tells a loader
that makes the server work more from one that keeps it less busy.

Variants:

* ``original``: ``S3IterableDataset`` + :mod:`tarfile` (:mod:`benchmarks.peers.s3torch`);
* ``recipe``: ``recipes.load("s3connector-shards", url=...)``, defaults;
* ``nocheck``: the recipe with its version checks (a HEAD per range after the first) turned
  into no-ops, to show what they cost; not a configuration pipeflow offers;
* ``recipe-old``: the recipe with the ``RangedBody`` of another ``_ranged.py`` (``--old-ranged``),
  e.g. one saved from an earlier commit, for an A/B of a change to it.

    python -m benchmarks.recipe_ab --server moto --shard-mb 64 --shards 8 --rounds 5
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import psutil

import pipeflow.backends.s3torchconnector as crt
from benchmarks.large_shard_trace import _server, _shard
from benchmarks.peers import s3torch
from benchmarks.pipeflow_cases import make_recipe
from pipeflow.testing.proxy import ProxyProcess

_CHECK = crt._Version.check
_BODY = crt.RangedBody


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def _client_cpu(before: Any, after: Any) -> float:
    """CPU of this process and its reaped children (the DataLoader workers) between two reads."""
    fields = ("user", "system", "children_user", "children_system")
    return float(sum(getattr(after, f) - getattr(before, f) for f in fields))


def _loader(variant: str, prefix: str, old_body: Any) -> Any:
    """The variant's DataLoader; the patches are made before its workers fork, so they inherit
    them."""
    if variant == "original":
        return s3torch.make_iterable(prefix, workers=2)
    crt._Version.check = (lambda self: None) if variant == "nocheck" else _CHECK  # type: ignore[method-assign]
    crt.RangedBody = old_body if variant == "recipe-old" else _BODY  # type: ignore[misc]
    return make_recipe("s3connector-shards", prefix, 2)


def _one_pass(variant: str, prefix: str, old_body: Any) -> tuple[int, float, float]:
    loader = _loader(variant, prefix, old_body)
    me = psutil.Process()
    before, start, samples = me.cpu_times(), time.perf_counter(), 0
    for batch in loader:
        samples += len(batch["cls"])
    wall = time.perf_counter() - start
    return samples, wall, _client_cpu(before, me.cpu_times())


def _load_body(path: str | None) -> Any:
    if not path:
        return None
    spec = importlib.util.spec_from_file_location("pipeflow.backends._ranged_old", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.RangedBody


def _row(variant: str, measured: tuple[int, float, float], server_s: float, proxy_s: float,
         requests: dict[str, int]) -> dict[str, Any]:
    samples, wall, client = measured
    return {"variant": variant, "samples": samples, "samples_per_s": round(samples / wall),
            "wall_s": round(wall, 2), "client_cpu_pct": round(100 * client / wall),
            "server_cpu_s": round(server_s, 2), "server_cpu_pct": round(100 * server_s / wall),
            "proxy_cpu_pct": round(100 * proxy_s / wall), "requests": requests}


def _rounds(args: argparse.Namespace, endpoint: str, server: psutil.Process) -> list[dict[str, Any]]:
    old_body = _load_body(args.old_ranged)
    rows = []
    with ProxyProcess(endpoint, delay_ms=args.delay_ms) as proxy:
        os.environ["AWS_ENDPOINT_URL"] = proxy.url
        proxy_proc = psutil.Process(proxy.pid)
        for r in range(args.rounds):
            for variant in args.variants.split(","):
                s0, p0, q0 = _cpu(server), _cpu(proxy_proc), proxy.stats()["requests"]
                measured = _one_pass(variant, "s3://data/s/", old_body)
                q1 = proxy.stats()["requests"]
                row = _row(variant, measured, _cpu(server) - s0, _cpu(proxy_proc) - p0,
                           {k: q1[k] - q0.get(k, 0) for k in q1})
                row["round"] = r
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--server", choices=("moto", "s3rver"), default="moto")
    ap.add_argument("--shard-mb", type=int, default=64)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--variants", default="original,recipe,nocheck")
    ap.add_argument("--old-ranged", default=None, help="a _ranged.py whose RangedBody 'recipe-old' uses")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    with _server(args.server) as (endpoint, put):
        # the server: the largest process this one started (moto's, or node's for s3rver)
        server = max(psutil.Process().children(recursive=True), key=lambda p: p.memory_info().rss)
        for i in range(args.shards):
            put(f"s/{i:04d}.tar", _shard(args.shard_mb, i))
        rows = _rounds(args, endpoint, server)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)
    _summary(rows, lambda r: r["variant"])


def _summary(rows: list[dict[str, Any]], key: Callable[[dict[str, Any]], str]) -> None:
    for variant in dict.fromkeys(key(r) for r in rows):
        mine = [r for r in rows if key(r) == variant]
        print(variant, "median samples/s", statistics.median(r["samples_per_s"] for r in mine),
              [r["samples_per_s"] for r in mine], "server CPU s/pass", [r["server_cpu_s"] for r in mine])


if __name__ == "__main__":
    main()
