"""Elastic resume under torchrun (gloo) with StatefulDataLoader: save after a few batches on
2 ranks x 2 workers and resume on 3 x 1, 1 x 3 and 2 x 0; save on 3 x 1 and resume on 2 x 2;
with and without shuffles (a map+unbatch census) and on an open/untar/group_pairs/decode chain
over local tars. Three launches (2, 3, 2 processes) run every case; the 1 x 3 resume runs in
this process (one rank). The union of what was delivered before and after each save must be
the epoch, each item once."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from . import _data
from ._launch import torchrun
from .conftest import FIGURES
from .torchrun_elastic import make

#: the tar case: 9 shards of 3..8 samples
TAR_KEYS = [f"s{i:02d}-{j:03d}" for i in range(9) for j in range(3 + i % 6)]

pytestmark = [pytest.mark.torchrun, pytest.mark.slow, pytest.mark.timeout(420)]

ORDERS = ("ordered", "shuffled", "tar")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    shared = tmp_path_factory.mktemp("elastic-states")
    (shared / "tars").mkdir()
    for i in range(9):
        names = [f"s{i:02d}-{j:03d}" for j in range(3 + i % 6)]
        (shared / "tars" / f"shard-{i:02d}.tar").write_bytes(_data.make_tar(names, size=300))
    out: dict[str, list[list[str]]] = {}
    for name, nproc in (("save2x2", 2), ("mid", 3), ("last", 2)):
        results = torchrun("torchrun_elastic.py", tmp_path_factory.mktemp(name), name, str(shared),
                           nproc=nproc, timeout=240)
        assert results["world_size"] == nproc
        for rank_data in results["ranks"]:
            for case, keys in rank_data.items():
                out.setdefault(case, []).append(keys)
    return out, shared


def _check(before, after, case):
    expected = TAR_KEYS if "tar" in case else _data.all_keys(10)
    counts = Counter(k for keys in before + after for k in keys)
    duplicated = sorted(k for k, c in counts.items() if c > 1)
    lost = sorted(set(expected) - set(counts))
    assert not duplicated, f"{case}: delivered twice {duplicated[:10]}"
    assert not lost, f"{case}: lost {lost[:10]}"
    assert sorted(counts) == sorted(expected)
    assert all(before) and any(after), f"{case}: a side delivered nothing"
    FIGURES["samples checked"] += sum(counts.values())


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("saved,resumed", [("save2x2", "3x1"), ("save2x2", "2x0"), ("save3x1", "2x2")])
def test_resume_on_another_topology_exactly_once(runs, order, saved, resumed):
    out, _ = runs
    case = f"{saved}-{order}-on-{resumed}"
    _check(out[f"{saved}-{order}"], out[case], case)


@pytest.mark.parametrize("order", ORDERS)
def test_resume_2x2_save_on_one_rank_with_three_workers(runs, order, monkeypatch):
    out, shared = runs
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    merged = json.loads((shared / f"save2x2-{order}.json").read_text())
    kind = "tar" if order == "tar" else "census"
    pipe = make(kind, order != "ordered", str(shared)).resume_from(merged)
    after = [key for batch in StatefulDataLoader(pipe, batch_size=None, num_workers=3) for key in batch]
    _check(out[f"save2x2-{order}"], [after], f"save2x2-{order}-on-1x3")
