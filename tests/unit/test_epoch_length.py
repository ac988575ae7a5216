"""Epoch length: ``len()``, ``with_epoch(n)``, ``with_length(n)`` and ``take(n, across="all")``,
exact per rank and across DataLoader workers. Ranks are real processes told their rank through
``RANK``/``WORLD_SIZE``, as torchrun does; workers are real DataLoader worker processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch.utils.data

import pipeflow as pf
from pipeflow.stages.take import share

ROOT = Path(__file__).resolve().parents[2]


def test_len_is_known_after_with_epoch_or_with_length():
    pipe = pf.from_items(range(10))
    with pytest.raises(TypeError, match="with_epoch"):
        len(pipe)
    assert bool(pipe) and bool(pipe.with_length(0))
    assert len(pipe.with_epoch(25)) == 25
    declared = pipe.with_length(7)
    assert len(declared) == 7
    assert list(declared) == list(range(10))  # with_length changes nothing but len()
    with pytest.raises(TypeError):
        len(pipe.with_epoch(5).map(abs))  # a later stage may change the count: unknown again
    with pytest.raises(pf.ConfigError):
        pipe.with_length(-1)
    with pytest.raises(pf.ConfigError, match=r"with_epoch\(n\)"):
        pipe.with_epoch(True)


def test_with_epoch_of_zero_is_refused_where_the_pipeline_is_written():
    # an epoch of nothing is never what a training job wants: say so instead of empty epochs
    with pytest.raises(pf.ConfigError, match=r"with_epoch\(n\) must be a positive int, got 0"):
        pf.from_items(range(10)).with_epoch(0)


@pytest.mark.parametrize("n", [1, 4, 10, 23])
def test_with_epoch_cuts_or_wraps_to_exactly_n(n):
    out = list(pf.from_items(range(10)).with_epoch(n))
    assert len(out) == n
    assert out[:min(n, 10)] == list(range(min(n, 10)))
    assert Counter(out) == Counter(x % 10 for x in range(n))


def test_with_epoch_counts_repeats_as_padded():
    pipe = pf.from_items(range(4)).with_epoch(6)
    assert len(list(pipe)) == 6
    assert sum(v.get("padded", 0) for v in pipe.stats().values()) == 2


@pytest.mark.parametrize("workers", [0, 1, 3, 4])
@pytest.mark.parametrize("n", [10, 37])
def test_with_epoch_is_exact_over_dataloader_workers(workers, n):
    pipe = pf.from_items(range(30)).shuffle(8, seed=1).with_epoch(n)
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=workers)
    items = list(loader)
    assert len(items) == n == len(pipe)
    if n <= 30:
        assert len(set(items)) == n  # cut short, never repeated while data remains


def test_dataloader_len_is_steps_when_n_divides_evenly():
    pipe = pf.from_items(range(50)).with_epoch(24)
    loader = torch.utils.data.DataLoader(pipe, batch_size=4, num_workers=3)
    assert len(loader) == 6
    batches = list(loader)
    assert len(batches) == 6 and all(len(b) == 4 for b in batches)


def test_share_adds_up():
    for n in range(0, 40):
        for count in range(1, 9):
            parts = [share(n, i, count) for i in range(count)]
            assert sum(parts) == n and max(parts) - min(parts) <= 1


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_take_each_is_per_worker_and_all_is_global(workers):
    src = pf.from_items(range(100))
    per_worker = list(torch.utils.data.DataLoader(src.take(10), batch_size=None, num_workers=workers))
    assert len(per_worker) == 10 * max(workers, 1)
    total = list(torch.utils.data.DataLoader(src.take(10, across="all"), batch_size=None,
                                             num_workers=workers))
    assert len(total) == 10 and len(set(total)) == 10


def test_take_all_before_explicit_sharding_is_global_too():
    pipe = pf.from_items(range(100)).take(11, across="all").shard_by_rank()
    items = list(torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=3))
    assert sorted(items) == list(range(11))


def test_take_rejects_unknown_across():
    with pytest.raises(pf.ConfigError, match="across"):
        pf.from_items(range(3)).take(1, across="rank")


#: the cases each rank process runs: (kind, n, DataLoader workers)
RANK_CASES = [("epoch", 20, 2), ("epoch", 40, 3), ("take", 13, 2)]

RANK_SCRIPT = """
import json, sys
import torch.utils.data
import pipeflow as pf

def run(kind, n, workers):
    src = pf.from_items(range(53)).shuffle(16, seed=2)
    pipe = src.with_epoch(n) if kind == "epoch" else src.take(n, across="all")
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=workers)
    steps = len(torch.utils.data.DataLoader(pipe, batch_size=1)) if kind == "epoch" else -1
    return {"items": [int(x) for x in loader], "len": steps}

if __name__ == "__main__":
    cases = json.loads(sys.argv[1])
    print(json.dumps({f"{kind}-{n}-{workers}": run(kind, n, workers) for kind, n, workers in cases}))
"""


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Every case of RANK_CASES on 2 ranks: one process per rank runs them all (a fresh
    interpreter costs more than the cases)."""
    script = tmp_path_factory.mktemp("ranks") / "rank.py"
    script.write_text(RANK_SCRIPT)
    world = 2
    procs = [subprocess.Popen([sys.executable, str(script), json.dumps(RANK_CASES)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT), "RANK": str(r),
                                   "WORLD_SIZE": str(world)})
             for r in range(world)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    return results


@pytest.mark.slow
@pytest.mark.parametrize("n, workers", [(20, 2), (40, 3)])
def test_with_epoch_same_count_on_every_rank(ranks, n, workers):
    results = [r[f"epoch-{n}-{workers}"] for r in ranks]
    for r in results:
        assert len(r["items"]) == n and r["len"] == n
    # each rank reads (and, past its data, repeats) only its own part of the data
    assert not set(results[0]["items"]) & set(results[1]["items"])
    if 2 * n <= 53:
        assert all(len(set(r["items"])) == n for r in results)  # no repeats while data remains


@pytest.mark.slow
def test_take_all_is_global_across_ranks_and_workers(ranks):
    results = [r["take-13-2"] for r in ranks]
    everything = results[0]["items"] + results[1]["items"]
    assert len(everything) == 13 and len(set(everything)) == 13
    assert sorted(len(r["items"]) for r in results) == [6, 7]
