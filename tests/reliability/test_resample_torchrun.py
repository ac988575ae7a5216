"""resample() and shuffle(by="key") across ``torchrun --nproc_per_node=2`` x DataLoader workers
{0, 2} (the "resample" suite of the shared torchrun launch)."""

from __future__ import annotations

from collections import Counter

import pytest

from . import _data
from .conftest import suite

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(360)]


@pytest.fixture(scope="module")
def results(torchrun_results):
    return suite(torchrun_results, "resample")


def _flat(batches):
    return [item for batch in batches for item in batch]


@pytest.mark.parametrize("nw", [0, 2])
def test_each_rank_and_worker_draws_its_own_reproducible_stream(results, nw):
    shards = set(_data.shard_sizes(10))
    streams = []
    for rank_data in results:
        runs = rank_data[f"resample-w{nw}"]
        drawn = _flat(runs["epoch0"])
        assert len(drawn) == 12 * max(nw, 1) and set(drawn) <= shards
        assert runs["epoch0_again"] == runs["epoch0"] and runs["epoch1"] != runs["epoch0"]
        streams.append(drawn)
    assert streams[0] != streams[1]


@pytest.mark.parametrize("nw", [0, 2])
def test_key_shuffle_keeps_samples_whole_and_each_once(results, nw):
    urls = [f"s3://b/pairs/{i:03d}.{field}" for i in range(40) for field in ("image", "label")]
    per_rank = [_flat(rank_data[f"key-shuffle-w{nw}"]) for rank_data in results]
    counts = Counter(url for items in per_rank for url in items)
    assert sorted(counts) == sorted(urls) and set(counts.values()) == {1}
    for items in per_rank:
        assert all(a.rsplit(".", 1)[0] == b.rsplit(".", 1)[0] for a, b in zip(items[::2], items[1::2]))
    assert per_rank[0] != sorted(per_rank[0])
