"""Launched by ``torchrun --nproc_per_node=2`` from test_faults_torchrun.py: every rank reads its
share of the fault suite's objects with every S3 backend at once (a thread per backend) while the
test takes the store down once, after every backend on both ranks has read something; writes
what every rank read to ``OUT/results.json``.

Usage: torchrun --nproc_per_node=2 ... faults_torchrun.py OUT_DIR ENDPOINT BACKEND...
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pipeflow as pf
from pipeflow.testing.faults import digest
from tests.reliability import _dist


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
            # every backend on both ranks starts first: patient, as the launch's own timeout is
            deadline = time.monotonic() + 240
            while not os.path.exists(os.path.join(out, "go")):
                if time.monotonic() > deadline:
                    raise TimeoutError("the outage never started")
                time.sleep(0.02)
            # the store is down: say this backend reads on, so the outage lasts past its next request
            open(os.path.join(out, f"resumed-{backend}-{rank}"), "w").close()
    retries = pipe.stats().counters("open").get("retries", 0)
    return [got, retries]


def read_and_say(out: str, endpoint: str, backend: str, urls: list[str], rank: int) -> list:
    """:func:`read_share`; a rank that fails still says it started and resumed, so the test does
    not wait for it to take the store down or to bring it back."""
    try:
        return read_share(out, endpoint, backend, urls, rank)
    finally:
        for step in ("started", "resumed"):
            open(os.path.join(out, f"{step}-{backend}-{rank}"), "w").close()


def main() -> int:
    out, endpoint, backends = sys.argv[1], sys.argv[2], sys.argv[3:]
    rank, _ = _dist.init(timeout_s=120)
    with open(os.path.join(out, "urls.json")) as f:
        urls = json.load(f)
    # side by side: the outage is waited out once for all of them, not once per backend
    with ThreadPoolExecutor(len(backends), thread_name_prefix="backend") as pool:
        futures = {b: pool.submit(_dist.attempt, read_and_say, out, endpoint, b, urls, rank)
                   for b in backends}
    mine = {backend: future.result() for backend, future in futures.items()}
    gathered = _dist.gather(mine)
    _dist.write_results(out, {b: [part[b] for part in gathered] for b in backends})
    return _dist.finish()


if __name__ == "__main__":
    sys.exit(main())
