"""The shared-memory result transport, in one process: what is moved, what comes back, cleanup."""

from __future__ import annotations

import mmap
import os
import pickle

import numpy as np
import pytest
import torch

from pipeflow.executor import shm

pytestmark = pytest.mark.skipif(not shm.available(), reason="no writable /dev/shm")


@pytest.fixture
def prefix():
    name = shm.pool_prefix(987654)
    shm.set_worker_prefix(name)
    yield name
    shm.set_worker_prefix("")
    shm.sweep(name)


def _mine(prefix):
    return [n for n in os.listdir(shm.SHM_DIR) if n.startswith(prefix)]


def _result(_):
    return {"t": torch.arange(100_000, dtype=torch.int64).reshape(100, 1000), "a": np.ones((300, 300)),
            "small": torch.ones(3), "nested": [(np.zeros(70_000, np.uint8),)], "s": "text"}


def test_large_values_cross_as_handles_and_come_back_equal(prefix):
    sent = shm.run_task(_result, None)
    wire = pickle.loads(pickle.dumps(sent))
    assert len(pickle.dumps(sent)) < 2000  # handles, not 1.5 MB of pickled bytes
    assert len(_mine(prefix)) == 3
    out = shm.restore(wire)
    assert _mine(prefix) == []  # unlinked on receipt; the mappings live on in the results
    expected = _result(None)
    assert torch.equal(out["t"], expected["t"]) and np.array_equal(out["a"], expected["a"])
    assert torch.equal(out["small"], expected["small"]) and out["s"] == "text"
    nested = out["nested"][0]
    assert isinstance(nested, tuple) and np.array_equal(nested[0], expected["nested"][0][0])


def test_discard_and_sweep_remove_unread_segments(prefix):
    shm.discard(shm.run_task(_result, None))
    assert _mine(prefix) == []
    shm.run_task(_result, None)
    assert _mine(prefix)
    shm.sweep(prefix)
    assert _mine(prefix) == []


def test_out_of_mappings_falls_back_to_a_private_copy(prefix, monkeypatch):
    sent = shm.run_task(_result, None)

    def refuse(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", refuse)
    out = shm.restore(sent)
    assert torch.equal(out["t"], _result(None)["t"]) and _mine(prefix) == []
    out["a"][0, 0] = 5.0  # writable, owned by the result


def _block(i):
    return np.full(200_000, i % 251, dtype=np.uint8)


def _through(slots, i):
    """One task as a pool runs it: a slot lent, the worker writes, the owner restores."""
    lent = slots.lend()
    sent = shm.run_in_slot(lent, _block, i)
    return shm.restore(pickle.loads(pickle.dumps(sent)), slots, lent and lent[0]), lent


def test_results_reuse_a_slot_once_their_arrays_are_gone(prefix):
    slots = shm.Slots(prefix)
    try:
        first, lent = _through(slots, 1)
        assert lent is None and _mine(prefix) == []  # size unknown yet: a fresh, unlinked segment
        names = set()
        for i in range(20):
            out, lent = _through(slots, i)
            assert int(out[0]) == i % 251 and int(out[-1]) == i % 251
            names.add(lent[0])
            del out  # the slot goes back with its last view
        assert len(names) == 1 and len(_mine(prefix)) == 1
    finally:
        slots.reset(close=True)
    assert _mine(prefix) == []


def test_a_slot_is_never_lent_while_an_array_views_it(prefix):
    slots = shm.Slots(prefix)
    try:
        _through(slots, 0)
        held = [_through(slots, i) for i in range(1, 30)]
        assert len({lent[0] for _, lent in held}) == 29  # every live result has its own slot
        view = held[5][0][1000:1010]  # a view of a view keeps the slot too
        del held
        again = [_through(slots, 100 + i)[0] for i in range(29)]
        assert (view == 6).all() and all(int(a[7]) == (100 + i) % 251 for i, a in enumerate(again))
    finally:
        slots.reset(close=True)


def test_results_larger_than_their_slot_take_fresh_segments_and_grow_the_slots(prefix):
    slots = shm.Slots(prefix)
    try:
        _through(slots, 0)
        lent = slots.lend()
        big = np.arange(2_000_000, dtype=np.uint8)
        out = shm.restore(shm.run_in_slot(lent, lambda _: big, None), slots, lent[0])
        assert np.array_equal(out, big)
        generation = slots.generation
        grown = slots.lend()
        assert grown[1] >= big.nbytes and slots.generation > generation  # the small slot retired
        assert len(_mine(prefix)) == 1
    finally:
        slots.reset(close=True)


def test_a_worker_drops_its_mappings_of_retired_slots(prefix):
    slots = shm.Slots(prefix)
    try:
        _through(slots, 0)
        out, lent = _through(slots, 1)
        assert lent[0] in shm._mappings
        del out
        slots.reset()  # the pool goes idle: slots unlinked, a new generation
        assert _mine(prefix) == []
        _through(slots, 2)
        _, lent = _through(slots, 3)
        assert list(shm._mappings) == [lent[0]]
    finally:
        slots.reset(close=True)


def test_a_slot_removed_under_a_worker_falls_back_to_a_fresh_segment(prefix):
    slots = shm.Slots(prefix)
    try:
        _through(slots, 0)
        lent = slots.lend()
        os.unlink(os.path.join(shm.SHM_DIR, lent[0]))  # as a pool shutting down does
        sent = shm.run_in_slot(lent, _block, 7)
        assert sent.offset is None  # its own segment, not the slot
        out = shm.restore(sent, slots, lent[0])
        assert int(out[9]) == 7 and _mine(prefix) == []
    finally:
        slots.reset(close=True)


def _payload(i, n=300_000):
    return bytes((i + j) % 256 for j in range(256)) * (n // 256)


def _echo(item):
    return item


def test_large_bytes_inputs_cross_in_the_slot_and_arrive_as_equal_bytes(prefix):
    slots = shm.Slots(prefix)
    try:
        item = {"__key__": "k", "jpg": _payload(1), "cls": b"7", "png": _payload(2, 100_000)}
        need = shm.input_bytes(item)
        assert need == 299_776 + 99_840 and shm.input_bytes(b"small") == 0 and shm.input_bytes(3) == 0
        slots.observe(need)
        lent = slots.lend()
        packed = shm.pack_input(item, slots, lent)
        assert len(pickle.dumps(packed)) < 1000  # places in the slot, not 400 KB of bytes
        got = shm.run_with_input(lent, _echo, pickle.loads(pickle.dumps(packed)))
        assert got == item and type(got["jpg"]) is bytes and got["cls"] == b"7"
        shm.restore(got, slots, lent[0])  # nothing views the slot: it goes back
        again = slots.lend()
        assert again[0] == lent[0]
        top = _payload(3)
        out = shm.run_with_input(again, _echo, shm.pack_input(top, slots, again))
        assert out == top and type(out) is bytes
    finally:
        slots.reset(close=True)
    assert _mine(prefix) == []
