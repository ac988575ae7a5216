"""One global order at any topology, under ``torchrun --nproc_per_node=2`` (gloo): with a fixed
global batch, global step i holds the same samples on 2 ranks x {0, 2, 3} DataLoader workers
as in one process without workers."""

from __future__ import annotations

import pytest

from .conftest import FIGURES, suite
from .torchrun_census import GLOBAL_BATCH, WORKERS, order_pipeline

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(360)]


@pytest.mark.parametrize("nw", WORKERS)
def test_global_steps_match_one_process(torchrun_results, monkeypatch, nw):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    reference = order_pipeline(GLOBAL_BATCH)
    reference.set_epoch(1)
    expected = [list(batch) for batch in reference]
    ranks = [part[f"w{nw}"] for part in suite(torchrun_results, "order")]
    steps = max(len(r) for r in ranks)
    got = [[k for r in ranks if i < len(r) for k in r[i]] for i in range(steps)]
    assert got == expected
    FIGURES["samples checked"] += sum(len(step) for step in got)
