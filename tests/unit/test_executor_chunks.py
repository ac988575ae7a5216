"""Process maps send several items per task; every item still has its own outcome."""

from __future__ import annotations

import pickle
import threading
import time

import pytest

import pipeflow as pf
from pipeflow.executor.chunks import RemoteTraceback
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
