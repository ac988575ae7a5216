"""A thread window's hand-off (pipeflow.executor.lane): long-lived runners pulling from one
queue, a slot per item, the consumer woken only when it waits (once per pair where two run)."""

import signal
import threading
import time

import pytest

import pipeflow as pf
from pipeflow.executor import pool as pool_module
from pipeflow.executor.autotune import Tuner
from pipeflow.executor.lane import Lane
from pipeflow.executor.window import Window, WindowOptions
from pipeflow.stages.map import Mapper
from pipeflow.stages.source import ItemSource


def _threads():
    return {t for t in threading.enumerate() if t.name.startswith("pipeflow")}


def _settle(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def _busy_double(x):
    time.sleep(0.002)
    return 2 * x


class _Bad(ValueError):
    pass


def _fail_on_57(x):
    time.sleep(0.001)
    if x == 57:
        raise _Bad(f"item {x}")
    return 2 * x


@pytest.mark.parametrize("workers", [2, "auto"])
def test_thread_map_keeps_order_and_raises_the_failing_items_error_at_its_place(workers):
    got = []
    it = iter(pf.from_items(range(200)).map(_fail_on_57, workers=workers))
    with pytest.raises(_Bad, match="item 57"):
        for value in it:
            got.append(value)
    assert got == [2 * x for x in range(57)]


def test_busy_threads_take_items_without_a_pool_task_each(monkeypatch):
    submits = []
    real = pool_module.WorkerPool.submit

    def counting(self, fn, *args):
        submits.append(fn)
        return real(self, fn, *args)

    monkeypatch.setattr(pool_module.WorkerPool, "submit", counting)
    stage = Mapper(ItemSource(list(range(100))), _busy_double, workers=2, max_inflight=8)
    assert list(stage) == [2 * x for x in range(100)]
    stage.close()
    # a runner keeps taking items while the window has some queued: far fewer tasks than items
    assert 1 <= len(submits) < 25


def test_closing_mid_window_drops_queued_items_and_leaks_no_thread():
    before = _threads()
    started = []

    def slow(x):
        started.append(x)
        time.sleep(0.01)
        return x

    stage = Mapper(ItemSource(list(range(1000))), slow, workers=2, max_inflight=16)
    assert [next(stage) for _ in range(5)] == list(range(5))
    stage.close()
    assert _settle(lambda: _threads() <= before)
    # the queued items never ran: what started is what was delivered plus what was running
    assert len(started) <= 5 + 16
    count = len(started)
    time.sleep(0.05)
    assert len(started) == count


def test_an_interrupt_while_waiting_reaches_the_consumer_at_once():
    release = threading.Event()

    def stuck(x):
        release.wait(10)
        return x

    stage = Mapper(ItemSource(list(range(10))), stuck, workers=2)
    main = threading.main_thread().ident
    timer = threading.Timer(0.2, signal.pthread_kill, args=(main, signal.SIGINT))  # Ctrl-C
    timer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            next(stage)
        assert time.monotonic() - t0 < 5  # not after the stuck call's 10 s
    finally:
        timer.cancel()
        release.set()
        stage.close()


def _thread_submit(fn):
    threading.Thread(target=fn, name="pipeflow-test-runner", daemon=True).start()


def _gated(events, started):
    def call(i):
        started[i].set()
        events[i].wait(10)
        return i
    return call


def test_a_paired_wait_returns_once_the_running_successor_is_done_too():
    events, started = [threading.Event() for _ in range(2)], [threading.Event() for _ in range(2)]
    lane = Lane(_thread_submit, lambda: 2, pair=True)
    first, second = (lane.put(_gated(events, started), i) for i in range(2))
    assert all(s.wait(5) for s in started)
    waiter = threading.Thread(target=lane.wait, args=(first, second))
    waiter.start()
    events[0].set()
    time.sleep(0.1)
    assert first.done() and waiter.is_alive()  # one wake-up for both, not one each
    events[1].set()
    waiter.join(5)
    assert not waiter.is_alive() and second.result() == 1 and first.result() == 0


def test_a_paired_wait_does_not_wait_for_a_successor_not_started():
    events, started = [threading.Event() for _ in range(2)], [threading.Event() for _ in range(2)]
    lane = Lane(_thread_submit, lambda: 1, pair=True)  # one runner: the second item queues
    first, second = (lane.put(_gated(events, started), i) for i in range(2))
    assert started[0].wait(5)
    waiter = threading.Thread(target=lane.wait, args=(first, second))
    waiter.start()
    events[0].set()
    waiter.join(5)
    assert not waiter.is_alive() and first.result() == 0
    events[1].set()
    assert second.result() == 1


def test_cancel_drops_a_queued_item_and_runs_its_callbacks():
    events, started = [threading.Event() for _ in range(2)], [threading.Event() for _ in range(2)]
    lane = Lane(_thread_submit, lambda: 1, pair=False)
    first, second = (lane.put(_gated(events, started), i) for i in range(2))
    assert started[0].wait(5)
    seen = []
    second.add_done_callback(seen.append)
    assert second.cancel() and second.cancelled() and seen == [second]
    assert not first.cancel()  # running: it finishes
    events[0].set()
    assert first.result() == 0
    assert not started[1].is_set()


def test_a_gated_window_runs_at_most_the_tuners_value_at_once():
    running, peak, lock = [0], [0], threading.Lock()

    def track(x):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.003)
        with lock:
            running[0] -= 1
        return x

    tuner = Tuner(1, 4, 1)  # holds one call until it measures a step up
    window = Window(track, WindowOptions(workers=4, gated=True), tuner=tuner)
    stage = Mapper(ItemSource(list(range(40))), track, workers=4)
    stage._window = window
    window.restart()
    assert list(stage) == list(range(40))
    stage.close()
    assert peak[0] == 1
