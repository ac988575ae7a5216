"""equalize() in one process: counts, padding, errors, options and a mid-epoch round trip."""

from __future__ import annotations

import pickle
import traceback
from collections import Counter

import pytest
from torch.utils.data import DataLoader

import pipeflow as pf
from pipeflow.errors import ConfigError, EmptyShardError

from . import _data


def _loader_items(pipe, nw):
    try:
        return [x for x in DataLoader(pipe, batch_size=None, num_workers=nw)]
    except Exception as exc:
        # free the failed DataLoader now, not in a later test's garbage collection, where torch
        # waited 5 s for each worker (docs/testing.md, "Keeping the suite fast")
        traceback.clear_frames(exc.__traceback__)
        raise


@pytest.mark.parametrize("mode,expected_len", [("drop", 9), ("pad", 12)])
def test_share_is_floor_or_ceil_of_total_over_workers(mode, expected_len):
    pipe = pf.from_items(range(11)).shuffle(4).shard_by_rank().equalize(mode=mode)
    items = _loader_items(pipe, 3)
    assert len(items) == expected_len
    counts = Counter(items)
    if mode == "drop":
        assert set(counts.values()) == {1}
    else:
        assert set(counts) == set(range(11))


def test_single_process_keeps_everything():
    assert sorted(pf.from_items(range(11)).shard_by_rank().equalize()) == list(range(11))


def test_per_shard_pads_short_shards_by_wrapping_and_counts_it():
    pipe = pf.from_items(range(5)).equalize(per_shard=12)
    assert list(pipe) == [0, 1, 2, 3, 4] * 2 + [0, 1]
    assert pipe.stats()["equalize"]["padded"] == 7


def test_unknown_total_is_a_clear_config_error():
    pipe = pf.from_items(["a", "b"]).map(_data.expand).unbatch().equalize()
    with pytest.raises(ConfigError, match="total=N"):
        list(pipe)


def test_empty_shard_raises_instead_of_ending_early():
    pipe = (pf.from_items(["shard-00", "shard-01"]).shard_by_rank().map(_data.expand).unbatch()
            .equalize(per_shard=3))
    with pytest.raises(EmptyShardError, match="worker 2 of 3.*received no items"):
        _loader_items(pipe, 3)


@pytest.mark.parametrize("kwargs", [{"total": -1}, {"total": 2.5}, {"per_shard": "3"},
                                    {"mode": "truncate"}, {"total": True}])
def test_bad_options_fail_where_the_pipeline_is_written(kwargs):
    with pytest.raises(ConfigError):
        pf.from_items(range(3)).equalize(**kwargs)


@pytest.mark.parametrize("stop_at", [0, 3, 7, 11])
def test_mid_epoch_round_trip_including_inside_the_padding(stop_at):
    pipe = pf.from_items(range(5)).shuffle(3, seed=2).equalize(per_shard=12)
    pipe.set_epoch(1)
    full = list(pipe)
    pipe.set_epoch(1)
    it = iter(pipe)
    head = [next(it) for _ in range(stop_at)]
    state = pickle.loads(pickle.dumps(it.state_dict()))
    it.close()
    resumed = iter(pickle.loads(pickle.dumps(pipe)))
    resumed.load_state_dict(state)
    assert head + list(resumed) == full
