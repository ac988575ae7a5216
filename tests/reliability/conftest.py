"""Fixtures of the reliability suite: one torchrun launch shared by every multi-rank test."""

from __future__ import annotations

from collections import Counter

import pytest

from ._launch import torchrun


@pytest.fixture(scope="session")
def torchrun_results(tmp_path_factory):
    """Every suite of torchrun_census.py, run once under ``torchrun --nproc_per_node=2``."""
    out = tmp_path_factory.mktemp("torchrun")
    results = torchrun("torchrun_census.py", out, timeout=300)
    assert results["world_size"] == 2
    return results


def suite(results, name):
    """The per-rank data of one suite; fails with the rank's traceback if it raised."""
    per_rank = results[name]
    for rank, part in enumerate(per_rank):
        assert part["ok"], f"rank {rank} failed in {name}: {part['error']}\n{part['traceback']}"
    return [part["data"] for part in per_rank]


def pytest_collection_modifyitems(items):
    # DataLoader warns about 3 workers on a 2-core machine; the tests use 3 on purpose
    here = str(__import__("pathlib").Path(__file__).parent)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.filterwarnings("ignore:This DataLoader will create"))


#: figures for the closing summary: samples checked, faults injected, bad inputs tried, ...
FIGURES: Counter[str] = Counter()


def pytest_terminal_summary(terminalreporter):
    if FIGURES:
        parts = ", ".join(f"{k} {v}" for k, v in sorted(FIGURES.items()))
        terminalreporter.write_line(f"pipeflow reliability figures: {parts}")
