"""An in-order thread window whose consumer runs the oldest item itself when no thread has
started it yet (``caller_runs``): which thread ran what, order, errors, interrupts and
positions. Behaviour only, never speed."""

import threading

import pytest

from pipeflow.executor import window as window_module
from pipeflow.executor.window import Window, WindowOptions
from pipeflow.stages.map import WindowedOptions

#: how long the pool's one thread stays busy at most (on code without caller-runs the consumer
#: waits this long for it, then the test fails instead of hanging)
HOLD_S = 3.0


class Counting:
    """A source of 0, 1, 2, ... with a position (what a window pulls from)."""

    def __init__(self, n):
        self.i, self.n = 0, n

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i - 1

    def state_dict(self):
        return {"index": self.i}


class _Interrupt(BaseException):
    """Not an ``Exception``, as ``KeyboardInterrupt`` (which would stop the test run if it escaped)."""


def _busy_pool(window, release):
    """Occupy the window's one thread with an item of a dropped pass (as after a resume): it
    runs until ``release`` is set, so every item of the next pass waits in the pool's queue."""
    started = threading.Event()
    window.restart()
    task = window.next_task(_Holding(started, release))
    assert task is not None
    assert started.wait(HOLD_S)
    window.restart()  # the held item keeps its thread; it is no longer the window's


class _Holding:
    """A one-item source whose item holds a thread (see :func:`_busy_pool`)."""

    def __init__(self, started, release):
        self.item = ("hold", started, release)

    def __next__(self):
        item, self.item = self.item, None
        if item is None:
            raise StopIteration
        return item

    def state_dict(self):
        return {"index": 0 if self.item else 1}


def _window(fn, **kw):
    def run(x):
        if isinstance(x, tuple):
            _, started, release = x
            started.set()
            release.wait(HOLD_S)
            return None
        return fn(x)

    return Window(run, WindowOptions(workers=1, caller_runs=True, **kw))


def test_an_item_no_thread_started_runs_in_the_consumers_thread_in_order(monkeypatch):
    monkeypatch.setattr(window_module, "single_intraop_thread", lambda: True)
    ran = {}

    def record(x):
        ran[x] = threading.get_ident()
        return 2 * x

    release = threading.Event()
    window = _window(record)
    try:
        _busy_pool(window, release)
        source = Counting(4)
        out = []
        for _ in range(2):  # the pool's thread is busy: both are run here, in order
            task = window.next_task(source)
            out.append(window.wait(task))
            window.complete(task)
        assert out == [0, 2]
        assert ran == {0: threading.get_ident(), 1: threading.get_ident()}
        assert window.position(source) == ({"index": 2}, [])
        release.set()  # the thread is free again: the rest may run on it, still in order
        while (task := window.next_task(source)) is not None:
            out.append(window.wait(task))
            window.complete(task)
        assert out == [0, 2, 4, 6]
    finally:
        release.set()
        window.shutdown()


def test_an_item_run_by_the_consumer_fails_or_is_interrupted_at_its_place(monkeypatch):
    monkeypatch.setattr(window_module, "single_intraop_thread", lambda: True)

    def fail(x):
        if x == 1:
            raise ValueError("bad item")
        if x == 2:
            raise _Interrupt
        return x

    release = threading.Event()
    window = _window(fail)
    try:
        _busy_pool(window, release)
        source = Counting(4)
        task = window.next_task(source)
        assert window.wait(task) == 0
        window.complete(task)
        task = window.next_task(source)
        with pytest.raises(ValueError, match="bad item"):
            window.wait(task)
        assert window.position(source) == ({"index": 1}, [])  # still before the failed item
        window.complete(task)  # skipped
        task = window.next_task(source)
        with pytest.raises(_Interrupt):
            window.wait(task)
        assert window.position(source) == ({"index": 2}, [])  # an interrupt loses nothing
    finally:
        release.set()
        window.shutdown()


def test_a_consumer_whose_torch_runs_a_team_of_threads_leaves_the_item_to_the_pool(monkeypatch):
    # a resize in the consumer's thread would run on its team of intra-op threads (see solo)
    monkeypatch.setattr(window_module, "single_intraop_thread", lambda: False)
    ran = {}

    def record(x):
        ran[x] = threading.get_ident()
        return x

    release = threading.Event()
    window = _window(record)
    try:
        _busy_pool(window, release)
        source = Counting(1)
        task = window.next_task(source)
        threading.Timer(0.2, release.set).start()
        assert window.wait(task) == 0
        assert ran[0] != threading.get_ident()
    finally:
        release.set()
        window.shutdown()


def test_only_cpu_bound_work_on_gated_threads_lets_the_consumer_run_an_item():
    assert WindowedOptions(what="decode", workers="auto", kind="cpu").window("d")[0].caller_runs
    assert not WindowedOptions(what="map", workers="auto").window("m")[0].caller_runs
    assert not WindowedOptions(what="decode", workers=2, kind="cpu").window("d")[0].caller_runs
