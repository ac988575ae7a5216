"""Process maps send several items per task; every item still has its own outcome."""

from __future__ import annotations

import io
import pickle
import threading
import time

import pytest

import pipeflow as pf
from pipeflow.executor.chunks import RemoteTraceback, submit_in_turn
from pipeflow.executor.pool import make_pool
from pipeflow.executor.window import Window, WindowOptions, default_limit

from ._core_helpers import double, fail_on_13, lambda_on_5, wait_for_file


def test_chunk_size_follows_the_in_flight_bound():
    default = Window(double, WindowOptions(workers=2, method="process"))
    assert default.limit == default_limit(2, "process") == 4
    assert default.chunk == 1  # the default: one item per task
    assert Window(double, WindowOptions(workers=2, method="process", limit=16)).chunk == 4
    assert Window(double, WindowOptions(workers=2, method="process", limit=9)).chunk == 2
    assert Window(double, WindowOptions(workers=2, method="thread")).chunk == 1
    assert Window(double, WindowOptions(workers=2, method="thread")).limit == 4


def test_an_error_inside_a_chunk_names_its_own_item_and_keeps_the_worker_traceback():
    got = []
    with pytest.raises(KeyError) as info:
        for x in pf.from_items(range(20)).map(fail_on_13, workers=2, method="process", max_inflight=16):
            got.append(x)
    assert got == list(range(13))  # the items before it in the same task were delivered
    assert any("on 13" in n for n in info.value.__notes__)
    assert isinstance(info.value.__cause__, RemoteTraceback)
    assert "fail_on_13" in str(info.value.__cause__)


def test_an_unpicklable_result_fails_its_item_only():
    pipe = pf.from_items(range(12)).map(lambda_on_5, workers=2, method="process", on_error="skip",
                                              max_inflight=16)
    assert list(pipe) == [x for x in range(12) if x != 5]
    assert pipe.stats()["map"]["skipped"] == 1
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)) as info:
        list(pf.from_items(range(12)).map(lambda_on_5, workers=2, method="process", max_inflight=16))
    assert any("on 5" in n for n in info.value.__notes__)


# 12: four chunks of 3 (a bound that is a multiple of 2 * workers is met); 13: still chunks of 3,
# and a fifth chunk waits for room for all of it, so the window stays at 12
@pytest.mark.parametrize("inflight,bound", [(12, 12), (13, 12)])
def test_a_chunked_process_window_pulls_exactly_its_bound(tmp_path, inflight, bound):
    gate = tmp_path / "open"
    pulled = []

    def record(x):
        pulled.append(x)
        return (x, str(gate))

    it = iter(pf.from_items(range(1000)).map(record).map(wait_for_file, workers=2, method="process",
                                                                    max_inflight=inflight))
    consumer = threading.Thread(target=lambda: next(it))
    consumer.start()
    deadline = time.monotonic() + 30
    while len(pulled) < bound and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # a window in which a missing bound would keep reading
    assert len(pulled) == bound
    gate.touch()
    consumer.join(30)
    assert not consumer.is_alive()
    it.close()


# ---- thread workers -------------------------------------------------------------------------
class _Numbers:
    """A window's source: 0, 1, 2, ... up to ``n``, its position the next number."""

    def __init__(self, n: int) -> None:
        self.n, self.i = n, 0

    def __next__(self) -> int:
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i - 1

    def state_dict(self) -> dict[str, int]:
        return {"next": self.i}


def _drain(window: Window, source: _Numbers) -> list:
    out = []
    while (task := window.next_task(source)) is not None:
        try:
            out.append(window.wait(task))
        except KeyError as exc:
            out.append(exc)
        window.complete(task)
    return out


def test_a_thread_window_puts_several_quick_items_in_a_task_and_keeps_each_outcome(monkeypatch):
    from pipeflow.executor import window as window_module

    monkeypatch.setattr(window_module, "CHUNK_S", 60.0)  # every item "quick", however loaded
    calls = []

    def record(x):
        calls.append((x, threading.current_thread().name))
        return fail_on_13(x)

    window = Window(record, WindowOptions(workers=2, method="thread", chunk=4))
    window.restart()
    try:
        out = _drain(window, _Numbers(40))
    finally:
        window.shutdown()
    assert [x for x in out if not isinstance(x, KeyError)] == [x for x in range(40) if x != 13]
    assert isinstance(out[13], KeyError) and "bad item 13" in str(out[13])
    assert window.chunk == 4  # quick items: as many as allowed once the first were timed
    assert window.limit == 4 * default_limit(2, "thread")  # the limit counts tasks of 4
    assert sorted(x for x, _ in calls) == list(range(40))  # each computed once


def test_slow_items_go_one_per_thread_task_and_an_explicit_limit_counts_items(monkeypatch):
    from pipeflow.executor import window as window_module

    monkeypatch.setattr(window_module, "CHUNK_S", 1e-9)  # every item "slow"
    window = Window(double, WindowOptions(workers=2, method="thread", chunk=4))
    window.restart()
    try:
        assert _drain(window, _Numbers(20)) == [2 * x for x in range(20)]
        assert window.chunk == 1 and window.limit == default_limit(2, "thread")
    finally:
        window.shutdown()
    monkeypatch.undo()
    bounded = Window(double, WindowOptions(workers=2, method="thread", chunk=4, limit=8))
    bounded.restart()
    try:
        assert _drain(bounded, _Numbers(20)) == [2 * x for x in range(20)]
        assert bounded.chunk == 2 and bounded.limit == 8  # two tasks per worker within 8 items
    finally:
        bounded.shutdown()


def test_items_of_a_thread_chunk_cancelled_before_their_turn_are_not_computed():
    started, release, calls = threading.Event(), threading.Event(), []

    def hold_first(x):
        calls.append(x)
        if x == 0:
            started.set()
            release.wait(30)
        return x

    pool = make_pool(1, "thread")
    try:
        futures = submit_in_turn(pool.submit, hold_first, [0, 1, 2, 3])
        assert started.wait(30)
        assert not futures[0].cancel()  # running: its outcome is still delivered
        assert all(f.cancel() for f in futures[1:])
        release.set()
        assert futures[0].result(30) == 0
    finally:
        pool.shutdown()
    assert calls == [0]


def test_a_thread_chunk_the_pool_never_ran_leaves_no_item_waiting():
    started, release = threading.Event(), threading.Event()

    def block(_):
        started.set()
        return release.wait(30)

    pool = make_pool(1, "thread")
    blocker = pool.submit(block, None)
    assert started.wait(30)  # the only worker is busy
    futures = submit_in_turn(pool.submit, double, [1, 2, 3])
    pool.shutdown(wait=False)  # drops the queued chunk
    release.set()
    blocker.result(30)
    assert all(f.cancelled() for f in futures)


def test_decode_in_thread_chunks_delivers_every_sample_in_order_and_counts_them():
    from PIL import Image

    def jpeg(i: int) -> bytes:
        buf = io.BytesIO()
        Image.new("RGB", (16, 16), (i, 0, 0)).save(buf, format="JPEG")
        return buf.getvalue()

    samples = [{"__key__": f"{i:03d}", "jpg": jpeg(i) if i != 7 else b"not a jpeg"} for i in range(30)]
    pipe = pf.from_items(samples).decode("numpy", workers=2, on_error="skip")
    keys = [s["__key__"] for s in pipe]
    assert keys == [f"{i:03d}" for i in range(30) if i != 7]
    assert pipe.stats()["decode"]["skipped"] == 1
    assert pipe.stats()["decode"]["items"] == 29
