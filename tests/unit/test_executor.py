"""The executor: ordering, backpressure, errors across threads and processes, clean shutdown."""

import gc
import threading
import time

import psutil
import pytest

import pipeflow as pf
from pipeflow.errors import WorkerCrashedError
from pipeflow.executor import warm

from ._core_helpers import die_on_3, double, fail_on_13, slow_double


def _threads():
    return {t for t in threading.enumerate() if t.name.startswith("pipeflow")}


def _children():
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _settle(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


@pytest.mark.parametrize("method", ["thread", "process"])
def test_parallel_map_keeps_order_by_default(method):
    out = list(pf.from_items(range(40)).map(slow_double, workers=4, method=method))
    assert out == [2 * x for x in range(40)]


def test_unordered_map_delivers_everything_once():
    out = list(pf.from_items(range(40)).map(slow_double, workers=4, in_order=False))
    assert sorted(out) == [2 * x for x in range(40)]


def test_backpressure_bounds_items_in_flight():
    pulled = []
    gate = threading.Event()

    def record(x):
        pulled.append(x)
        return x

    def blocked(x):
        gate.wait(5)
        return x

    it = iter(pf.from_items(range(1000)).map(record).map(blocked, workers=2, max_inflight=5))
    consumer = threading.Thread(target=lambda: next(it))
    consumer.start()
    assert _settle(lambda: len(pulled) >= 5), pulled
    time.sleep(0.2)  # a window in which a missing bound would keep reading: absence needs one
    assert len(pulled) == 5  # nothing beyond the in-flight bound was read from the source
    gate.set()
    consumer.join(5)
    it.close()


@pytest.mark.parametrize("method", ["thread", "process"])
def test_worker_errors_keep_their_type_and_name_stage_and_item(method):
    with pytest.raises(KeyError) as info:
        list(pf.from_items(range(20)).map(fail_on_13, workers=3, method=method))
    assert "bad item 13" in str(info.value)
    assert any("map(fail_on_13" in n and "13" in n for n in info.value.__notes__)


def test_crashed_worker_process_raises_clearly_without_orphans():
    before = _children()
    with pytest.raises(WorkerCrashedError, match="died"):
        list(pf.from_items(range(10)).map(die_on_3, workers=2, method="process"))
    assert _settle(lambda: _children() <= before | _forkserver(before))


def _forkserver(before):
    # the forkserver and resource tracker are shared, long-lived multiprocessing infrastructure
    # (a warm fork server is a fork of this process: known by its pid, not its command line)
    return {p.pid for p in psutil.Process().children()
            if "from multiprocessing" in _cmdline(p) or p.pid == warm.server_pid()}


def _cmdline(p):
    try:
        return " ".join(p.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return ""


def _break_out(pipe, at=5):
    # a plain for-loop in a frame that ends: the last reference goes away with the frame
    for i, _ in enumerate(pipe):
        if i == at:
            break


def _abandon_in_a_cycle(pipe, at=5):
    # the iterator is reachable only from a reference cycle: reference counting never frees it,
    # only the cycle collector does
    it = iter(pipe)
    for i, _ in enumerate(it):
        if i == at:
            break
    cycle = [it]
    cycle.append(cycle)


@pytest.mark.parametrize("how", ["break", "close", "gc", "exception"])
@pytest.mark.parametrize("method", ["thread", "process"])
@pytest.mark.parametrize("workers", [3, "auto"])
def test_no_leaks_after_break_close_gc_or_error(how, method, workers):
    threads_before, children_before = _threads(), _children()
    size = 4 if workers == 3 else "auto"
    pipe = pf.from_items(range(10_000)).map(slow_double, workers=workers, method=method).prefetch(size)
    if how == "break":
        _break_out(pipe)
    elif how == "gc":
        _abandon_in_a_cycle(pipe)
        gc.collect()
    else:
        it = iter(pipe)
        for i, _ in enumerate(it):
            if i == 5:
                break
        if how == "exception":
            bad = iter(pf.from_items(range(100)).map(fail_on_13, workers=workers, method=method).prefetch(2))
            with pytest.raises(KeyError):
                list(bad)
        it.close()
    # a leak check, not a speed check: process workers get PROCESS_GRACE_SECONDS to finish the
    # task in hand before they are terminated, and a loaded machine stretches that
    assert _settle(lambda: _threads() <= threads_before, timeout=30), _threads()
    assert _settle(lambda: _children() <= children_before | _forkserver(children_before), timeout=30)


def test_keyboard_interrupt_shuts_down_cleanly():
    threads_before = _threads()

    def interrupt(x):
        if x == 7:
            raise KeyboardInterrupt
        return x

    with pytest.raises(KeyboardInterrupt):
        list(pf.from_items(range(100)).map(interrupt).map(double, workers=2).prefetch(2))
    assert _settle(lambda: _threads() <= threads_before)


def _interrupted_while_a_worker_is_busy(context, release_after: float) -> tuple[bool, float]:
    """Raise KeyboardInterrupt in the consumer while the prefetch thread waits on a map worker
    that is stuck until ``release_after`` seconds have passed; (whether the interrupt came out
    before the stuck call was released, the seconds it took to come out)."""
    from pipeflow.iterator import PipelineIterator

    gate = threading.Event()
    releaser = threading.Timer(release_after, gate.set)

    def stuck_from_2(x):
        if x >= 2:
            gate.wait()
        return x

    def interrupt_at_0(x):
        if x == 0:
            raise KeyboardInterrupt
        return x

    pipe = pf.from_items(range(50)).map(stuck_from_2, workers=1).prefetch(1).map(interrupt_at_0)
    it = PipelineIterator(pipe.node, context=context)
    releaser.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in it:
                pass
        return not gate.is_set(), time.monotonic() - t0
    finally:
        releaser.cancel()
        gate.set()


def test_a_dataloader_worker_interrupted_stops_without_waiting_for_its_threads():
    # Ctrl-C: the exiting main process SIGTERMs the workers still alive, skipping their exit
    # handlers (multiprocessing's /tmp/pymp-* directories stay); a worker must not wait on a
    # busy thread before it ends (worker 0 of 2 reads items 0, 2, 4, ...).
    from pipeflow.run_context import RunContext

    in_worker = RunContext(worker_id=0, num_workers=2)
    before_release, seconds = _interrupted_while_a_worker_is_busy(in_worker, release_after=30.0)
    # a hang bound, not a speed figure: waiting on the thread would take its join timeout (10 s)
    assert before_release and seconds < 5.0, seconds


def test_the_training_process_interrupted_still_stops_its_threads_before_returning():
    from pipeflow.run_context import RunContext

    before_release, _ = _interrupted_while_a_worker_is_busy(RunContext(), release_after=1.0)
    assert not before_release


def test_prefetch_reraises_upstream_errors_with_type():
    with pytest.raises(KeyError):
        list(pf.from_items(range(20)).map(fail_on_13).prefetch(3))


def test_large_bytes_items_reach_process_workers_intact_and_leave_nothing_in_dev_shm():
    import hashlib
    import os

    from pipeflow.executor import shm

    from ._core_helpers import digest

    blobs = [bytes([i]) * (70_000 + 50_000 * i) for i in range(8)]  # 70 KB .. 420 KB: slots regrow
    items = [b if i % 2 else {"__key__": str(i), "jpg": b, "cls": b"1"} for i, b in enumerate(blobs)]
    before = {n for n in os.listdir(shm.SHM_DIR) if n.startswith("pipeflow-")} if shm.available() else set()
    got = list(pf.from_items(items).map(digest, workers=2, method="process"))
    for i, (b, out) in enumerate(zip(blobs, got)):
        want = ("bytes", hashlib.sha256(b).hexdigest())
        cls = ("bytes", hashlib.sha256(b"1").hexdigest())
        assert out == (want if i % 2 else {"__key__": str(i), "jpg": want, "cls": cls})
    if shm.available():
        after = {n for n in os.listdir(shm.SHM_DIR) if n.startswith(f"pipeflow-{os.getpid()}-")}
        assert after <= before
