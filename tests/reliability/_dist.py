"""What every script launched under ``torchrun`` by the reliability tests shares: joining the
gloo process group, running named suites so that a failure on one rank is reported (with its
traceback) instead of hanging the other, gathering every rank's result to rank 0 and writing
``OUT/results.json`` atomically, where :func:`tests.reliability._launch.torchrun` reads it.

The launcher puts the checkout on ``PYTHONPATH``, so the scripts import this module as
``tests.reliability._dist``.
"""

from __future__ import annotations

import datetime
import faulthandler
import gc
import json
import os
import signal
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import torch.distributed as dist


def init(timeout_s: float = 60.0) -> tuple[int, int]:
    """Join the job's gloo process group; ``(rank, world size)``."""
    stacks_on_signals()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def stacks_on_signals() -> None:
    """Leave a clue when a rank stalls: the Python stack of each of its threads, on stderr (which
    torchrun's ``--tee`` also writes to the rank's own log file).

    SIGUSR1, sent by the launcher to every rank of a launch past its timeout before it kills
    them, prints the stacks and carries on. SIGTERM, sent by torchrun to the ranks still running
    once one has failed (e.g. its collective timed out waiting for a stalled peer), prints them
    and then terminates as before. Forked children (DataLoader workers) drop the SIGTERM dump:
    the DataLoader terminates a worker slow to exit as a matter of course."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    os.register_at_fork(after_in_child=_no_stacks_on_sigterm)


def _no_stacks_on_sigterm() -> None:
    faulthandler.unregister(signal.SIGTERM)


def attempt(fn: Callable[..., Any], *args: Any) -> dict[str, Any]:
    """``{"ok": True, "data": fn(*args)}``, or the error and traceback of this rank: the other
    ranks carry on to the next collective call, and the test names the rank that failed."""
    try:
        return {"ok": True, "data": fn(*args)}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}


def gather(local: Any) -> list[Any]:
    """Every rank's ``local``, in rank order, on every rank."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return gathered


def write_results(out_dir: str, results: Mapping[str, Any]) -> None:
    """On rank 0: ``OUT/results.json`` with the world size added, written whole or not at all
    (a test never reads half a file from a rank that died while writing)."""
    if dist.get_rank() != 0:
        return
    tmp = os.path.join(out_dir, "results.json.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"world_size": dist.get_world_size(), **results}, fh)
    os.replace(tmp, os.path.join(out_dir, "results.json"))


def collect() -> None:
    """Free what a failed or abandoned iteration left in reference cycles (a DataLoader iterator
    and its workers, a DDP model) here and now: left to a later collection, it runs in a forked
    DataLoader worker (which cannot shut down its parent's workers) or after the process group is
    gone (a DDP reducer destroyed then aborts the rank, and the suite's own error is lost)."""
    gc.collect()


def finish() -> int:
    """Wait for every rank, leave the process group; the script's exit status."""
    collect()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def run_suites(out_dir: str, suites: Mapping[str, Callable[[], Any]], *, timeout_s: float = 60.0) -> int:
    """The whole life of a launched script: join, run each suite on every rank (one gather per
    suite, in order), write ``{name: [rank 0's result, rank 1's, ...]}``, leave."""
    init(timeout_s)
    results = {}
    for name, fn in suites.items():
        local = attempt(fn)
        collect()
        results[name] = gather(local)
    write_results(out_dir, results)
    return finish()
