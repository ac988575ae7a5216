"""The verdict names the part that was made slow, wherever users put it.

One planted slow part per case: a slow ``map`` followed by each stage that pulls its source in
its own rhythm (a shuffle filling its buffer, a batch or a group collecting items, unbatch,
filter, prefetch, cache), or a slow training loop behind a fast pipeline; each iterated
directly and through a ``DataLoader`` with 2 workers. The planted part sleeps, so it dominates
(its time is wall time, 20x or more the rest's on a loaded machine) and the runs stay short
(about 0.7 s). The runs are longer than the calls a stage times exhaustively, and the training
loop works once per DataLoader batch, as in the cases that misled before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

import pipeflow as pf

from ._stats_helpers import (
    PLANTED_S,
    planted,
    planted_list,
    planted_pair,
    planted_path,
    shown_kept,
)

#: more than the calls a stage times all of (TIME_ALL_FIRST): the sampled regime is tested
ITEMS = 320
#: the slow training loop's batches, and the seconds it sleeps per batch (the consumer case)
CONSUMER_BATCH = 16
CONSUMER_S = 0.03


def _files(tmp: Path) -> list[str]:
    paths = []
    for i in range(ITEMS):
        path = tmp / f"f{i:03d}.bin"
        path.write_bytes(b"x" * 64)
        paths.append(str(path))
    return paths


#: case -> (the planted map's label in the table, the pipeline, built in a scratch directory)
PLANTED: dict[str, tuple[str, Callable[[Path], pf.Pipeline]]] = {
    "shuffle": ("map(planted)", lambda tmp: pf.from_items(range(ITEMS)).map(planted).shuffle(100)),
    "batch": ("map(planted)", lambda tmp: pf.from_items(range(ITEMS)).map(planted).batch(8)),
    "unbatch": ("map(planted_list)",
                lambda tmp: pf.from_items(range(ITEMS // 4)).map(planted_list).unbatch()),
    "group_pairs": ("map(planted_pair)",
                    lambda tmp: pf.from_items(range(ITEMS)).map(planted_pair).group_pairs()),
    "filter": ("map(planted)", lambda tmp: pf.from_items(range(ITEMS)).map(planted).filter(shown_kept)),
    "prefetch": ("map(planted)", lambda tmp: pf.from_items(range(ITEMS)).map(planted).prefetch(4)),
    "cache": ("map(planted_path)", lambda tmp: pf.from_items(_files(tmp)).map(planted_path).cache(
        str(tmp / "cache"), max_bytes=1 << 20, backend="local")),
}
WORKERS = [0, pytest.param(2, marks=pytest.mark.slow)]


def _run(pipe: pf.Pipeline, workers: int, *, batch_size: int | None = None,
         step_s: float = 0.0) -> tuple[pf.PipelineStats, float]:
    t0 = time.perf_counter()
    n = 0
    for _ in DataLoader(pipe, batch_size=batch_size, num_workers=workers):
        n += 1
        if step_s:
            time.sleep(step_s)
    wall = time.perf_counter() - t0
    assert n > 0
    return pipe.stats(), wall


def _adds_up(stats: pf.PipelineStats, wall: float) -> None:
    """No stage is busier than the wall time times the processes (and its lanes)."""
    for label in stats:
        values = stats[label]
        lanes = max(1.0, values.get("workers", 0.0) or values.get("lanes", 1.0))
        assert values["busy_s"] <= wall * stats.processes * lanes + 0.05, (label, str(stats))


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("case", list(PLANTED))
def test_a_slow_map_is_named_whatever_follows_it(case: str, workers: int, tmp_path: Path) -> None:
    name, build = PLANTED[case]
    stats, wall = _run(build(tmp_path), workers)
    assert stats.bottleneck == "map", str(stats)
    assert stats.name("map") == name
    assert f"bottleneck: {name}" in str(stats)
    # the planted sleeps are the map's own time (all of it is measured: most calls are timed)
    assert stats["map"]["busy_s"] >= 0.5 * PLANTED_S * ITEMS, str(stats)
    # the stage after it is charged for its own work only, not for the items it pulled
    assert stats[case]["busy_s"] < stats["map"]["busy_s"] / 3, str(stats)
    _adds_up(stats, wall)


@pytest.mark.parametrize("workers", WORKERS)
def test_a_slow_training_loop_is_named_consumer(workers: int) -> None:
    pipe = pf.from_items(range(ITEMS)).map(abs).shuffle(16).batch(4).unbatch()
    stats, wall = _run(pipe, workers, batch_size=CONSUMER_BATCH, step_s=CONSUMER_S)
    assert stats.bottleneck == "consumer", str(stats)
    # each process waited on the loop for most of its sleeps
    assert stats.consumer_s >= 0.5 * CONSUMER_S * ITEMS / CONSUMER_BATCH, str(stats)
    _adds_up(stats, wall)


def test_item_counts_stay_exact_when_calls_are_forced() -> None:
    # shuffle and the pooled map count every call in the base class; their consumers' timed
    # calls force them (timed whole), which must neither lose nor double any count
    n = 3000
    pipe = pf.from_items(range(n)).shuffle(50).map(abs, workers=2).batch(7).unbatch()
    assert sorted(pipe) == list(range(n))
    stats = pipe.stats()
    assert {label: int(stats[label]["items"]) for label in stats} == {
        "from_items": n, "shuffle": n, "map": n, "batch": -(-n // 7), "unbatch": n}
