"""pipe.stats(all_ranks=True) under ``torchrun --nproc_per_node=2`` x DataLoader workers {0, 2, 3}."""

from __future__ import annotations

import pytest

from .conftest import suite
from .stats_ranks import ITEMS

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(360)]


@pytest.fixture(scope="module")
def ranks(torchrun_results):
    return suite(torchrun_results, "stats")


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_stats_sum_over_ranks_and_workers(ranks, workers):
    per_rank = [r[f"w{workers}"] for r in ranks]
    # each rank counts what it delivered; summed over ranks it is the whole data set
    assert [r["local_items"] for r in per_rank] == [r["delivered"] for r in per_rank]
    assert sum(r["delivered"] for r in per_rank) == ITEMS
    for r in per_rank:
        assert r["all_items"] == ITEMS
        assert r["all_processes"] == 2 * max(1, workers)
        assert r["bottleneck"] is not None
