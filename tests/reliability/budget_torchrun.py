"""Launched by ``torchrun --nproc_per_node=2`` from test_budget_torchrun.py: each rank reads its
share of the objects with ``open(read=True, request_rate=RATE)`` behind a DataLoader with two
workers, through a proxy that refuses a share of the GETs (retried by the backend); writes what
every rank read and what its stats() say to ``OUT/results.json``.

Usage: torchrun --nproc_per_node=2 ... budget_torchrun.py OUT_DIR ENDPOINT RATE
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from torch.utils.data import DataLoader

import pipeflow as pf
from tests.reliability import _dist

#: DataLoader workers per rank
WORKERS = 2
#: quick retries: a refused GET waits tens of milliseconds (plus its turn under the budget)
RETRY = {"base_delay": 0.01, "max_delay": 0.05, "max_attempts": 20}


def _named_size(record: Any) -> list[Any]:
    return [record.name, len(record.data)]


def read(urls: list[str], endpoint: str, rate: float) -> dict[str, Any]:
    pipe = (pf.from_items(urls)
            .open("boto3", read=True, request_rate=rate, endpoint=endpoint, retry=RETRY)
            .map(_named_size))
    got = list(DataLoader(pipe, batch_size=None, num_workers=WORKERS))
    stats = pipe.stats()
    return {"got": got, "processes": stats.processes, "request_rate": stats["open"]["request_rate"],
            "retries": stats["open"].get("retries", 0), "rate_wait_s": stats["open"].get("rate_wait_s", 0)}


def main() -> int:
    out, endpoint, rate = sys.argv[1], sys.argv[2], float(sys.argv[3])
    _dist.init(timeout_s=120)
    with open(os.path.join(out, "urls.json")) as fh:
        urls = json.load(fh)
    mine = _dist.attempt(read, urls, endpoint, rate)
    _dist.collect()
    _dist.write_results(out, {"budget": _dist.gather(mine)})
    return _dist.finish()


if __name__ == "__main__":
    sys.exit(main())
