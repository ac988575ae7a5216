"""Uneven data must not hang DDP: under torchrun (2 ranks, gloo, a real DDP model doing one
gradient all_reduce per batch) equalize() gives every rank the same number of steps, including
with fewer shards than ranks x workers; an empty shard is a clear error, not a hang."""

from __future__ import annotations

from collections import Counter

import pytest

from . import _data
from .conftest import FIGURES, suite

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(360)]


@pytest.fixture(scope="module")
def equalized(torchrun_results):
    return suite(torchrun_results, "equalize")


def _shards(config):
    nw = int(config.rsplit("-w", 1)[1])
    return 2 * max(nw, 1)


def test_every_rank_runs_the_same_number_of_steps_and_samples(equalized):
    configs = list(equalized[0])
    assert len(configs) == 16
    for config in configs:
        steps = [len(rank_data[config]) for rank_data in equalized]
        samples = [sum(map(len, rank_data[config])) for rank_data in equalized]
        assert len(set(steps)) == 1 and steps[0] > 0, (config, steps)
        assert len(set(samples)) == 1, (config, samples)
        FIGURES["samples checked"] += sum(samples)


@pytest.mark.parametrize("num_shards", [10, 4])
@pytest.mark.parametrize("nw", [0, 2, 3])
def test_drop_loses_less_than_one_item_per_shard_and_duplicates_nothing(equalized, num_shards, nw):
    config = f"sample-{num_shards}-drop-w{nw}"
    expected = set(_data.all_keys(num_shards))
    counts = Counter(k for r in equalized for batch in r[config] for k in batch)
    assert set(counts.values()) == {1}, "drop mode never repeats an item"
    assert set(counts) <= expected
    assert len(expected) - len(counts) == len(expected) % _shards(config)


@pytest.mark.parametrize("num_shards", [10, 4])
@pytest.mark.parametrize("nw", [0, 2, 3])
def test_pad_delivers_everything_and_repeats_less_than_one_item_per_shard(equalized, num_shards, nw):
    config = f"sample-{num_shards}-pad-w{nw}"
    expected = set(_data.all_keys(num_shards))
    counts = Counter(k for r in equalized for batch in r[config] for k in batch)
    assert set(counts) == expected, "pad mode delivers every item"
    shards = _shards(config)
    assert sum(counts.values()) - len(expected) == (-len(expected)) % shards


def test_dataloader_batching_with_pad_delivers_everything(equalized):
    counts = Counter(k for r in equalized for batch in r["dataloader-batching-pad-w3"] for k in batch)
    assert set(counts) == set(_data.all_keys(10))


def test_empty_shard_is_a_clear_error_on_the_rank_that_has_it(torchrun_results):
    rank0, rank1 = suite(torchrun_results, "empty_shard")
    # 4 shards over 2 ranks x 3 workers: rank 0 holds shards 0-2, rank 1 only shard 3
    assert rank0["raised"] is None
    assert rank1["raised"] == "EmptyShardError"
    assert "rank 1 of 2" in rank1["message"] and "received no items" in rank1["message"]
