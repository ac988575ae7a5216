"""Launched by test_stall_torchrun.py under ``torchrun --nproc_per_node=2``: rank 0 stalls (its
main thread in ``stall_on_rank_0``, a second thread in ``side_thread_waits``, a forked worker
process in ``stall_in_a_worker``) while rank 1 waits for it at a barrier, so the test can check
that the launcher's report names where rank 0 hung.

Usage: torchrun --nproc_per_node=2 ... stall_torchrun.py OUT_DIR GLOO_TIMEOUT_S
"""

from __future__ import annotations

import multiprocessing
import sys
import threading
import time
from typing import Any

import torch.distributed as dist

from tests.reliability import _dist


def side_thread_waits(never: threading.Event) -> None:
    never.wait()


def stall_on_rank_0() -> None:
    time.sleep(3600)


def stall_in_a_worker(started: Any) -> None:
    started.set()
    time.sleep(3600)


def main() -> int:
    rank, _ = _dist.init(timeout_s=float(sys.argv[2]))
    if rank == 0:
        threading.Thread(target=side_thread_waits, args=(threading.Event(),), daemon=True).start()
        fork = multiprocessing.get_context("fork")
        started = fork.Event()
        fork.Process(target=stall_in_a_worker, args=(started,), daemon=True).start()
        started.wait(60)
        print("rank 0 stalls", file=sys.stderr, flush=True)
        stall_on_rank_0()
    else:
        print("rank 1 waits at the barrier", file=sys.stderr, flush=True)
    dist.barrier()
    return _dist.finish()


if __name__ == "__main__":
    sys.exit(main())
