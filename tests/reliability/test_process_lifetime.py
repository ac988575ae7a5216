"""Process workers: they die with their owner, are reused across epochs, and their large results
travel through shared memory that is never left behind (close, error, crash, SIGKILL)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

import pipeflow as pf
from pipeflow.errors import WorkerCrashedError
from pipeflow.executor import shm

from . import _procs

pytestmark = [pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
SHM = Path(shm.SHM_DIR)

# A user's script: a process map, some items, then the owner ends abruptly. It prints the pids
# of every process it started and the shared-memory segments in use, then exits or waits.
SCRIPT = """
import json, os, sys, time, psutil
import pipeflow as pf
from tests.reliability._procs import slow_big
if __name__ == "__main__":
    it = iter(pf.from_items(range(10_000)).map(slow_big, workers=2, method="process", max_inflight=8))
    for _ in range(3):
        next(it)
    pids = [p.pid for p in psutil.Process().children(recursive=True)]
    print(json.dumps(pids), flush=True)
    slots = [n for n in os.listdir("/dev/shm") if n.startswith(f"pipeflow-{os.getpid()}-0-s")]
    print(json.dumps(slots), flush=True)
    if sys.argv[1] == "exit":
        os._exit(0)
    time.sleep(600)
"""


def _alive(pids):
    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _wait_for(check, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _segments(prefix=None):
    # default: the result segments of pools this process owns (named after the owner's pid);
    # other jobs on the machine (another test run, a stats channel) cannot add to those
    prefix = prefix or f"pipeflow-{os.getpid()}-"
    return {p.name for p in SHM.iterdir() if p.name.startswith(prefix)} if SHM.is_dir() else set()


@pytest.mark.parametrize(("how", "inflight"), [("os._exit", 8), ("SIGKILL", 8), ("SIGKILL", 4)])
def test_no_process_outlives_an_abrupt_end_of_its_owner(how, inflight, tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT.replace("max_inflight=8", f"max_inflight={inflight}"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(script), "exit" if how == "os._exit" else "wait"],
                            stdout=subprocess.PIPE, env=env, cwd=tmp_path)
    try:
        line = proc.stdout.readline()
        pids = json.loads(line)
        assert len(pids) >= 4, pids  # fork server, resource tracker, 2 workers
        slots = json.loads(proc.stdout.readline())
        assert slots or inflight == 8  # one item per task: reusable slots exist when the owner dies
        owner = proc.pid
        if how == "SIGKILL":
            os.kill(owner, signal.SIGKILL)
        proc.wait(30)
        assert _wait_for(lambda: not _alive(pids)), f"survivors: {_alive(pids)}"
        # nobody holds the owner's stdout any more: a reader (`| tail`) sees EOF, no hang
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready and proc.stdout.read() == b""
        assert _wait_for(lambda: not _segments(f"pipeflow-{owner}-")), _segments(f"pipeflow-{owner}-")
    finally:
        proc.kill()
        proc.stdout.close()


def _check_results(results, n):
    assert [r["__key__"] for r in results] == [f"k{i}" for i in range(n)]
    for i, r in enumerate(results):
        assert isinstance(r["image"], torch.Tensor) and r["image"].dtype == torch.uint8
        assert r["image"].shape == (3, 224, 224) and int(r["image"][2, 100, 7]) == i % 251
        assert isinstance(r["depth"], np.ndarray) and r["depth"].dtype == np.float32
        assert float(r["depth"][255, 0]) == float(i) and r["depth"].flags.writeable
        assert r["small"].tolist() == [i, i + 1, i + 2, i + 3]
        assert torch.equal(r["list"][0], torch.arange(40_000, dtype=torch.int32) + i)


def test_large_results_arrive_through_shared_memory_and_leave_nothing():
    before = _segments()
    seen = []
    real_read = shm._read

    def spy(handle):
        seen.append(handle.name)
        return real_read(handle)

    shm._read = spy
    try:
        results = list(pf.from_items(range(12)).map(_procs.big_sample, workers=2, method="process"))
    finally:
        shm._read = real_read
    _check_results(results, 12)
    assert len(seen) == 12 * 3  # image, depth, list[0]; "small" was pickled
    results[3]["image"] += 1  # the memory is the result's own
    assert int(results[3]["image"][0, 0, 0]) == 4
    assert _segments() <= before


def test_results_reuse_slots_and_results_still_held_are_never_overwritten():
    before = _segments()
    seen = []
    real_read = shm._read

    def spy(handle):
        seen.append((handle.name, handle.offset))
        return real_read(handle)

    shm._read = spy
    try:
        held = []
        for i, r in enumerate(pf.from_items(range(160)).map(_procs.big_sample, workers=2, method="process")):
            if i % 2 == 0:  # every other result stays alive (its slot must not be reused)
                held.append(r)
    finally:
        shm._read = real_read
    for j, r in enumerate(held):
        i = 2 * j
        assert r["__key__"] == f"k{i}" and int(r["image"][2, 100, 7]) == i % 251
        assert float(r["depth"][255, 0]) == float(i)
        assert torch.equal(r["list"][0], torch.arange(40_000, dtype=torch.int32) + i)
    in_slots = [name for name, offset in seen if offset is not None]
    assert len(in_slots) > len(seen) // 2  # most results went into slots...
    assert len(set(in_slots)) < len(in_slots) // 3  # ...which were reused (3 arrays a result)
    assert _segments() <= before  # the epoch ended: the idle pool keeps nothing in /dev/shm


@pytest.mark.parametrize("how", ["close", "exception", "crash", "sigkill"])
def test_no_segment_is_left_after_close_error_crash_or_sigkill(how):
    before = _segments()
    others = _workers()  # pools other tests left warm (their pipelines still alive) are not ours
    fn = {"close": _procs.slow_big, "exception": _procs.big_or_raise_on_5, "crash": _procs.big_or_die_on_5,
          "sigkill": _procs.slow_big}[how]
    pipe = pf.from_items(range(200)).map(fn, workers=2, method="process", max_inflight=8)
    it = iter(pipe)
    if how == "close":
        for _ in range(4):
            next(it)
        it.close()
    elif how == "exception":
        with pytest.raises(ValueError, match="bad item 5"):
            list(it)
    elif how == "crash":
        with pytest.raises(WorkerCrashedError):
            list(it)
    else:
        next(it)
        workers = [p for p in psutil.Process().children(recursive=True)
                   if p.ppid() != os.getpid() and p.pid not in others]  # forked by the fork server
        assert workers
        os.kill(workers[0].pid, signal.SIGKILL)
        with pytest.raises(WorkerCrashedError):
            list(it)
    it.close()
    assert _wait_for(lambda: _segments() <= before, 15), _segments() - before


def _workers():
    return {p.pid for p in psutil.Process().children(recursive=True) if p.ppid() != os.getpid()}


def test_process_pool_is_reused_across_epochs_and_dropped_with_the_pipeline():
    import gc

    others = _workers()  # pools other tests left warm are not ours (they may end meanwhile)
    pipe = pf.from_items(range(20)).map(_procs.big_sample, workers=2, method="process")
    assert len(list(pipe)) == 20
    first = _workers() - others
    assert len(first) >= 1
    pipe.set_epoch(5)
    _check_results(list(pipe), 20)
    assert _workers() - others == first  # the same warm workers served the next epochs
    assert len(list(pipe)) == 20 and _workers() - others == first
    del pipe
    gc.collect()
    assert _wait_for(lambda: not (_workers() & first), 15), _workers() & first


def test_a_crashed_pool_is_not_reused():
    pipe = pf.from_items(range(10)).map(_procs.big_or_die_on_5, workers=2, method="process")
    with pytest.raises(WorkerCrashedError):
        list(pipe)
    ok = pf.from_items(range(5)).map(_procs.big_sample, workers=2, method="process")
    _check_results(list(ok), 5)


# A fresh interpreter (the fork server is one per process): is a fork server running after
# describing the pipeline, after iter(), and when the upstream stage makes its first item?
PRESTART = """
import json, psutil
import pipeflow as pf
from tests.reliability._procs import big_sample

seen = []

def servers():
    return [p for p in psutil.Process().children() if "forkserver" in " ".join(p.cmdline())]

def probe(i):
    if not seen:
        seen.append(servers())
    return i

if __name__ == "__main__":
    pipe = pf.from_items(range(4)).map(probe).map(big_sample, workers=2, method="process")
    described = len(servers())
    it = iter(pipe)
    next(it)
    started = seen[0]
    print(json.dumps({"described": described, "upstream": len(started),
                      "preload": started[0].cmdline() if started else [],
                      "same": [p.pid for p in started] == [p.pid for p in servers()]}), flush=True)
    it.close()
"""


@pytest.mark.parametrize("start_method", ["forkserver", "fork"])
def test_the_fork_server_starts_before_upstream_stages_produce_items(start_method, tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(PRESTART)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "PIPEFLOW_START_METHOD": start_method}
    out = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["described"] == 0  # describing a pipeline starts nothing
    if start_method == "fork":
        assert seen["upstream"] == 0
        return
    # running when the upstream stage made its first item, with the mapped function's module
    # to import, and the very server that then forked the workers
    assert seen["upstream"] == 1 and seen["same"]
    assert "tests.reliability._procs" in " ".join(seen["preload"])


# A fresh interpreter again: by default the fork server is a fork of the owner, taken when the
# owner runs no other thread, after torch's OpenMP team has run in it (which hangs a fork that
# then runs an operator on several threads: the workers run torch on one).
WARM = """
import json, sys, threading
from multiprocessing import forkserver
import psutil, torch
import pipeflow as pf
from pipeflow.executor import warm
from tests.reliability._procs import parallel_ops

if __name__ == "__main__":
    x = torch.randn(1500, 1500)
    (x @ x.permute(1, 0).contiguous()).sum()  # the owner's OpenMP team now exists
    if sys.argv[1] == "thread":
        stop = threading.Event()
        threading.Thread(target=stop.wait, daemon=True).start()
    print("unflushed ", end="")  # a pipe: still in the buffer when the owner forks
    pipe = pf.from_items(range(6)).map(parallel_ops, workers=2, method="process")
    described = warm.server_pid()
    it = iter(pipe)
    first = next(it)
    server = forkserver._forkserver._forkserver_pid
    parents = {p.ppid() for p in psutil.Process().children(recursive=True) if p.ppid() != server}
    workers = [p for p in psutil.Process(server).children()]
    rest = list(it)
    print(json.dumps({"described": described, "warm": warm.server_pid(), "server": server,
                      "cmdline": psutil.Process(server).cmdline(), "workers": len(workers),
                      "items": [first, *rest]}), flush=True)
"""


@pytest.mark.parametrize("threads", ["alone", "thread"])
def test_the_default_fork_server_is_a_warm_fork_when_the_owner_runs_no_other_thread(threads, tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(WARM)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("PIPEFLOW_START_METHOD", None)
    out = subprocess.run([sys.executable, str(script), threads], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=90)  # a worker stuck on the OpenMP team fails here
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("unflushed") == 1  # not once more per worker
    seen = json.loads(out.stdout.split("unflushed ", 1)[1].strip().splitlines()[-1])
    assert seen["described"] == 0  # describing a pipeline starts nothing
    assert seen["items"] == [i + 1 for i in range(6)] and seen["workers"] == 2
    if threads == "alone":
        assert seen["warm"] == seen["server"]  # the server multiprocessing uses is the fork
        assert "forkserver" not in " ".join(seen["cmdline"])
    else:  # another thread might hold a lock the fork would copy: a fresh interpreter instead
        assert seen["warm"] == 0
        assert "forkserver" in " ".join(seen["cmdline"])
