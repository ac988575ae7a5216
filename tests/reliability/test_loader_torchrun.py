"""Pipeline.loader() under ``torchrun --nproc_per_node=2``: each rank's share, the census over
ranks exact in every epoch, resume exact, DDP steps equal, stats summed over ranks."""

from __future__ import annotations

from collections import Counter

import pytest

from . import _data
from .conftest import FIGURES, suite

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(360)]

KEYS = _data.all_keys(10)


@pytest.fixture(scope="module")
def ranks(torchrun_results):
    return suite(torchrun_results, "loader")


def _keys(batches):
    return [key for batch in batches for key in batch]


@pytest.mark.parametrize("order", ["ordered", "shuffled"])
def test_each_rank_gets_the_share_the_pipeline_gives_it_directly(ranks, order):
    # no DataLoader workers: the split is by rank only, as iterating the pipeline in the rank
    for data in ranks:
        assert data[order]["epoch0"] == data[order]["direct"]
        assert 0 < len(_keys(data[order]["epoch0"])) < len(KEYS)


@pytest.mark.parametrize("order", ["ordered", "shuffled"])
@pytest.mark.parametrize("epoch", ["epoch0", "epoch1", "resumed"])
def test_every_sample_exactly_once_across_ranks(ranks, order, epoch):
    counts = Counter(k for data in ranks for k in _keys(data[order][epoch]))
    assert sorted(counts) == sorted(KEYS) and set(counts.values()) == {1}
    assert all(_keys(data[order][epoch]) for data in ranks)
    FIGURES["samples checked"] += sum(counts.values())


@pytest.mark.parametrize("order", ["ordered", "shuffled"])
def test_a_resumed_rank_continues_its_own_epoch_exactly(ranks, order):
    for data in ranks:
        assert data[order]["resumed"] == data[order]["epoch0"]


def test_shuffled_epochs_differ_and_equalized_ranks_step_together(ranks):
    for data in ranks:
        assert _keys(data["shuffled"]["epoch0"]) != _keys(data["shuffled"]["epoch1"])
    steps = [data["ddp_steps"] for data in ranks]
    assert steps[0] == steps[1] == (len(KEYS) // 2 + 3) // 4


def test_stats_sum_over_ranks(ranks):
    local = [data["stats"]["local_batches"] for data in ranks]
    assert all(data["stats"]["batches_all_ranks"] == sum(local) for data in ranks)
    assert sum(local) == sum(data["ddp_steps"] for data in ranks)
