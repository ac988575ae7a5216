"""Launched by ``torchrun --nproc_per_node=2`` from test_faults_torchrun.py: every rank reads its
share of the fault suite's objects with each S3 backend in turn while the test takes the store
down once per backend, after both ranks have read something; writes what every rank read to
``OUT/results.json``.

Usage: torchrun --nproc_per_node=2 ... faults_torchrun.py OUT_DIR ENDPOINT BACKEND...
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import traceback

import torch.distributed as dist

import pipeflow as pf
from pipeflow.testing.faults import digest


def read_share(out: str, endpoint: str, backend: str, urls: list[str], rank: int) -> list:
    # automatic sharding: each rank reads every other object; a short backoff cap keeps the
    # launch short (the budget is the default one)
    pipe = pf.from_items(urls).open(backend, workers=1, read=True, endpoint=endpoint,
                                    retry={"max_delay": 1.0}).map(digest)
    got = []
    for item in pipe:
        got.append(list(item))
        if len(got) == 1:  # this rank's store has answered: say so, wait for the outage
            open(os.path.join(out, f"started-{backend}-{rank}"), "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(out, f"go-{backend}")):
                if time.monotonic() > deadline:
                    raise TimeoutError("the outage never started")
                time.sleep(0.02)
    retries = pipe.stats().counters("open").get("retries", 0)
    return [got, retries]


def main() -> None:
    out, endpoint, backends = sys.argv[1], sys.argv[2], sys.argv[3:]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    with open(os.path.join(out, "urls.json")) as f:
        urls = json.load(f)
    mine: dict = {}
    for backend in backends:
        try:
            mine[backend] = {"ok": True, "data": read_share(out, endpoint, backend, urls, rank)}
        except BaseException as exc:  # reported to the test with the rank's traceback
            mine[backend] = {"ok": False, "error": repr(exc), "traceback": traceback.format_exc()}
            open(os.path.join(out, f"started-{backend}-{rank}"), "w").close()
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        results = {"world_size": dist.get_world_size(),
                   **{b: [part[b] for part in gathered] for b in backends}}
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
