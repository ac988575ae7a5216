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
