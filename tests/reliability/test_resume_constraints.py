"""What may and may not change between saving a state and loading it.

May change (tested in test_resume.py, fresh process): map workers and method, prefetch size,
batch size. Must not change: the data, seeds, shuffle buffers upstream of the sharding, the
stages, the world size, the rank and the number of DataLoader workers; a changed one must be
refused with a clear error, never resumed silently into duplicates or losses.
"""

from __future__ import annotations

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

import pipeflow as pf
from pipeflow.errors import ConfigError

from . import _data

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def _make():
    shards = list(_data.shard_sizes(10))
    return (pf.from_items(shards).shuffle(10, seed=3).shard_by_rank().map(_data.expand).unbatch()
            .map(_data.key_of).batch(4))


def _state_as(monkeypatch, rank, world, steps=2):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    it = iter(_make())
    for _ in range(steps):
        next(it)
    state = it.state_dict()
    it.close()
    return state


def test_same_rank_and_world_size_resumes(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    full = [k for b in _make() for k in b]
    state = _state_as(monkeypatch, 1, 2)
    it = iter(_make())
    it.load_state_dict(state)
    assert [k for b in it for k in b] == full[8:]


@pytest.mark.parametrize("rank,world", [(0, 3), (1, 2)])
def test_resuming_as_another_shard_is_refused(monkeypatch, rank, world):
    state = _state_as(monkeypatch, 0, 2)
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    it = iter(_make())
    with pytest.raises(ConfigError, match=f"saved by rank 0 of 2 .* cannot resume rank {rank} of {world}"):
        it.load_state_dict(state)
    it.close()


def test_loading_a_state_of_another_pipeline_is_a_config_error():
    it = iter(pf.from_items(range(20)).batch(3))
    next(it)
    state = it.state_dict()
    other = iter(pf.from_items(range(20)).shuffle(5).batch(3))
    with pytest.raises(ConfigError, match="another shape"):
        other.load_state_dict(state)
    other.close()


def test_stateful_dataloader_refuses_a_changed_worker_count():
    loader = StatefulDataLoader(_make(), batch_size=None, num_workers=2)
    for i, _ in enumerate(loader):
        if i == 3:
            break
    state = loader.state_dict()
    del loader
    other = StatefulDataLoader(_make(), batch_size=None, num_workers=3)
    other.load_state_dict(state)
    # the worker that loads the state refuses it; the DataLoader re-raises the same type. Which
    # worker raises first is up to the scheduler: worker i of the new loader names worker i of 2
    with pytest.raises(ConfigError, match=r"worker ([01]) of 2\).* \(worker \1 of 3\)"):
        next(iter(other))
