"""Exactly once across ``torchrun --nproc_per_node=2`` x DataLoader workers {0, 2, 3}.

One torchrun launch runs every configuration (shard-level, sample-level and automatic sharding,
with and without shuffling) and gathers what each rank saw; the tests below check the census.
"""

from __future__ import annotations

from collections import Counter

import pytest

from . import _data
from .conftest import FIGURES, suite

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(360)]

CONFIGS = [f"{level}-{order}-w{nw}" for level in ("shard", "sample", "auto")
           for order in ("ordered", "shuffled") for nw in (0, 2, 3)]


@pytest.fixture(scope="module")
def census(torchrun_results):
    return suite(torchrun_results, "census")


def _keys(batches):
    return [key for batch in batches for key in batch]


@pytest.mark.parametrize("config", CONFIGS)
def test_every_sample_exactly_once_across_ranks_and_workers(census, config):
    expected = _data.all_keys(10)
    per_rank = [_keys(rank_data[config]["epoch0"]) for rank_data in census]
    counts = Counter(k for keys in per_rank for k in keys)
    duplicated = sorted(k for k, c in counts.items() if c > 1)
    lost = sorted(set(expected) - set(counts))
    assert not duplicated, f"{config}: duplicated {duplicated[:10]}"
    assert not lost, f"{config}: lost {lost[:10]}"
    assert sorted(counts) == sorted(expected)
    FIGURES["samples checked"] += sum(counts.values())
    assert all(per_rank), f"{config}: a rank got nothing: {[len(k) for k in per_rank]}"


@pytest.mark.parametrize("config", [c for c in CONFIGS if "shuffled" in c])
def test_shuffled_order_is_a_function_of_seed_and_epoch(census, config):
    for rank_data in census:
        runs = rank_data[config]
        assert runs["epoch0"] == runs["epoch0_again"], "same seed and epoch must give the same order"
        assert _keys(runs["epoch0"]) != _keys(runs["epoch1"]), "a new epoch must reshuffle"
        # a new epoch is still exactly once across ranks (checked on the union below)
    union = Counter(k for rank_data in census for k in _keys(rank_data[config]["epoch1"]))
    assert sorted(union) == sorted(_data.all_keys(10)) and set(union.values()) == {1}


def test_unshuffled_sample_level_split_is_round_robin(census):
    # without DataLoader workers the split is exactly item i -> rank i % world
    expected = _data.all_keys(10)
    for rank, rank_data in enumerate(census):
        assert _keys(rank_data["sample-ordered-w0"]["epoch0"]) == expected[rank::2]


@pytest.mark.parametrize("config", [f"several-{how}-w{nw}" for how in ("mix", "interleave", "zip")
                                    for nw in (0, 2, 3)])
def test_several_sources_exactly_once_across_ranks_and_workers(census, config):
    keys = _data.all_keys(10)
    half = len(keys) // 2
    per_rank = [_keys(rank_data[config]["epoch0"]) for rank_data in census]
    if config.startswith("several-zip"):
        # each shard zips its own share of both sources: partners keep their index
        pairs = [pair for keys_ in per_rank for pair in keys_]
        assert all(keys.index(b) - keys.index(a) == half for a, b in pairs), config
        per_rank = [[k for pair in keys_ for k in pair] for keys_ in per_rank]
    counts = Counter(k for keys_ in per_rank for k in keys_)
    assert [k for k, c in counts.items() if c > 1] == [], f"{config}: duplicated"
    assert sorted(counts) == sorted(keys[:2 * half]), f"{config}: lost"
    assert all(per_rank), f"{config}: a rank got nothing"
    FIGURES["samples checked"] += sum(counts.values())
