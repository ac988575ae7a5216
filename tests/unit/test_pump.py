"""The one background pump (prefetch, the CRT backend's ranged reader, obstore's read-ahead):
one end, one failure carrier, a stop that never leaves the producer blocked."""

from __future__ import annotations

import queue
import threading

import pytest

from pipeflow._pump import Pump


def test_items_arrive_in_order_then_the_end_on_every_later_call():
    pump = Pump(lambda p: [p.put(i) for i in range(5)], maxsize=2).start()
    assert [pump.get() for _ in range(5)] == [0, 1, 2, 3, 4]
    for _ in range(2):
        with pytest.raises(StopIteration):
            pump.get()
    assert pump.ended


class Boom(KeyError):
    pass


def test_a_producer_failure_reaches_the_consumer_with_its_type_every_time():
    def produce(pump: Pump) -> None:
        pump.put("a")
        raise Boom("upstream")

    pump = Pump(produce).start()
    assert pump.get() == "a"
    for _ in range(2):
        with pytest.raises(Boom, match="upstream") as info:
            pump.get()
        assert any(frame.name == "produce" for frame in info.traceback)  # the producer's frames


def test_stop_releases_a_producer_blocked_on_a_full_queue_and_drops_what_it_queued():
    pulled = []
    blocked = threading.Event()

    def produce(pump: Pump) -> None:
        for i in range(1000):
            pulled.append(i)
            if pump.full():
                blocked.set()
            if not pump.put(i):
                return

    pump = Pump(produce, maxsize=3).start()
    assert blocked.wait(5)
    assert pump.stop(join=5)  # the thread has ended
    assert not pump.alive and pump.queue.empty()
    assert len(pulled) <= 5  # backpressure: it never ran ahead of the bound


def test_a_timeout_says_empty_and_a_resize_makes_room_at_once():
    gate = threading.Event()

    def produce(pump: Pump) -> None:
        gate.wait(5)
        for i in range(3):
            pump.put(i)

    pump = Pump(produce, maxsize=1).start()
    with pytest.raises(queue.Empty):
        pump.get(timeout=0.01)
    pump.resize(3)
    gate.set()
    assert [pump.get(), pump.get(), pump.get()] == [0, 1, 2]
    pump.stop(join=5)
