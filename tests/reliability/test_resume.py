"""Resume mid-epoch in a FRESH process: stop at random steps, save, exit abruptly, start a new
interpreter, load; the union of before and after is exactly the epoch, in the original order.

Shuffled at shard and sample level, a parallel map (threads or processes) and a prefetch thread
in flight, through pipeflow's own iterator and through StatefulDataLoader with 0, 2, 3 workers.
"""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter

import psutil
import pytest

from . import _data
from ._launch import python
from .conftest import FIGURES
from .resume_worker import CONFIGS, NUM_SHARDS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

#: the random stops are drawn from this seed (printed on failure to reproduce)
SEED = 20240917


def _marked_processes(mark: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("PIPEFLOW_RELIABILITY_MARK") == mark:
                found.append(proc.pid)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    rng = random.Random(SEED)
    stops = {name: sorted({0, *rng.sample(range(1, 14), 3)}) for name in CONFIGS}
    stops["iterator-process"] = rng.sample(range(1, 14), 1)  # each run starts 3 interpreters
    path = tmp_path_factory.mktemp("resume") / "spec.json"
    path.write_text(json.dumps({"stops": stops}))
    mark = uuid.uuid4().hex
    env = {"PIPEFLOW_RELIABILITY_MARK": mark}
    proc = python("resume_worker.py", "save", str(path), env=env)
    assert proc.returncode == 0, proc.stderr[-6000:]
    saved = json.loads(path.with_name(path.name + ".save.json").read_text())
    path.write_text(json.dumps({"saved": saved["saved"]}))
    proc = python("resume_worker.py", "load", str(path), env=env)
    assert proc.returncode == 0, proc.stderr[-6000:]
    tails = json.loads(path.with_name(path.name + ".load.json").read_text())["tails"]
    return {"stops": stops, "saved": saved["saved"], "full": saved["full"], "tails": tails, "mark": mark}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_before_plus_after_is_exactly_the_epoch(resumed, name):
    full = resumed["full"][name]
    assert sorted(full) == sorted(_data.all_keys(NUM_SHARDS)), "the uninterrupted epoch is exact"
    for step, snap in resumed["saved"][name].items():
        head, tail = snap["head"], resumed["tails"][name][step]
        where = f"{name}, stopped after step {step} (seed {SEED})"
        counts = Counter(head + tail)
        assert not [k for k, c in counts.items() if c > 1], f"duplicates: {where}"
        assert set(counts) == set(full), f"lost: {sorted(set(full) - set(counts))[:5]}: {where}"
        assert head + tail == full, f"order differs from the uninterrupted epoch: {where}"
        FIGURES["samples checked"] += len(head) + len(tail)
        FIGURES["resumes in a fresh process"] += 1


def test_states_are_small(resumed):
    for name, snaps in resumed["saved"].items():
        for step, snap in snaps.items():
            # indices, seeds and cursors: bounded by the pipeline's shape, not by the data
            assert snap["state_bytes"] < 6_000, (name, step, snap["state_bytes"])


def test_no_process_outlives_an_abrupt_exit(resumed):
    import time

    deadline = time.monotonic() + 10
    while _marked_processes(resumed["mark"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _marked_processes(resumed["mark"]) == []
