"""A worker process killed with SIGKILL mid-epoch: a clear error, no hang, no orphans."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from torch.utils.data import DataLoader

import pipeflow as pf
from pipeflow.errors import WorkerCrashedError
from pipeflow.executor import warm

from . import _data

pytestmark = [pytest.mark.timeout(90), pytest.mark.filterwarnings("ignore:This DataLoader will create")]


def _descendants() -> dict[int, psutil.Process]:
    return {p.pid: p for p in psutil.Process().children(recursive=True)}


def _infrastructure(procs) -> set[int]:
    # multiprocessing's forkserver and resource tracker are shared and long-lived by design
    # (the forkserver's children, the workers, share its command line: tell them by parent)
    me = os.getpid()
    out = set()
    for pid, proc in procs.items():
        try:
            cmd, parent = " ".join(proc.cmdline()), proc.ppid()
        except psutil.Error:
            continue
        warm_server = pid == warm.server_pid()  # a fork of this process: known by its pid
        if parent == me and ("forkserver" in cmd or "resource_tracker" in cmd or "moto.server" in cmd
                             or warm_server):
            out.add(pid)
    return out


def _settled(before: set[int], timeout: float = 15.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while True:
        now = _descendants()
        extra = set(now) - before - _infrastructure(now)
        extra = {pid for pid in extra if now[pid].status() != psutil.STATUS_ZOMBIE}
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.1)


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _poll(check, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _samples(n_shards: int = 8) -> pf.Pipeline:
    return pf.from_items(list(_data.shard_sizes(n_shards))).map(_data.expand).unbatch()


@pytest.mark.parametrize("num_workers", [1, 3])
def test_sigkill_of_a_dataloader_worker_is_a_clear_error(num_workers):
    before = set(_descendants())
    loader = DataLoader(_samples().map(_data.slow_key), batch_size=None, num_workers=num_workers)
    it = iter(loader)
    next(it)
    workers = [pid for pid in set(_descendants()) - before]
    assert workers
    os.kill(workers[0], signal.SIGKILL)
    with pytest.raises(RuntimeError, match=r"DataLoader worker .* (exited|killed)"):
        for _ in it:
            pass
    del it, loader
    assert _settled(before) == set()


def test_sigkill_of_a_map_process_worker_raises_worker_crashed_error():
    before = set(_descendants())
    it = iter(_samples().map(_data.slow_key, workers=2, method="process"))
    next(it)
    now = _descendants()
    workers = [pid for pid in set(now) - before - _infrastructure(now)]
    assert workers, "no process worker found"
    os.kill(workers[0], signal.SIGKILL)
    # wait until the worker is really dead, so the next items meet a pool that lost it
    assert _poll(lambda: _dead(workers[0])), f"worker {workers[0]} survived SIGKILL"
    with pytest.raises(WorkerCrashedError, match="died"):
        for _ in it:
            pass
    it.close()
    assert _settled(before) == set()

