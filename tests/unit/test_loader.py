"""Pipeline.loader(): batches made in the training process by the pipeline's own threads, with
the DataLoader's collate, StatefulDataLoader-style state, epochs, stats and a clean shutdown."""

from __future__ import annotations

import gc
import json
import os
import threading
import time

import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import default_collate

import pipeflow as pf
from pipeflow.errors import ConfigError
from pipeflow.executor.autotune import bounds, cpu_budget

from ._core_helpers import double

N = 103  # not a multiple of the batch size: the last batch is short


def _pipe() -> pf.Pipeline:
    return pf.from_items(range(N)).shuffle(16, seed=3).map(double, workers=2).prefetch(2)


def _flat(batches) -> list[int]:
    return [int(x) for b in batches for x in b]


def _epoch(loader, stop: int | None = None) -> list[list[int]]:
    out = []
    for batch in loader:
        out.append(batch.tolist())
        if stop is not None and len(out) == stop:
            break
    return out


def test_every_item_once_per_epoch_and_epochs_reshuffle():
    loader = _pipe().loader(batch_size=4)
    first, second = _epoch(loader), _epoch(loader)
    assert sorted(_flat(first)) == sorted(_flat(second)) == [2 * i for i in range(N)]
    assert len(first) == 26 and len(first[-1]) == N % 4
    assert first != second  # the second pass ran epoch 1, reshuffled
    assert loader.epoch == 2


@pytest.mark.parametrize("stop", [0, 1, 9, 25])
def test_resume_in_a_new_loader_continues_exactly(stop):
    reference = _epoch(_pipe().loader(batch_size=4))
    loader = _pipe().loader(batch_size=4)
    head = _epoch(loader, stop) if stop else []
    state = json.loads(json.dumps(loader.state_dict()))  # a real checkpoint: JSON round trip
    loader.close()
    resumed = _pipe().loader(batch_size=4)
    resumed.load_state_dict(state)
    tail = _epoch(resumed)
    assert head + tail == reference
    assert len(head) == stop and len(tail) == len(reference) - stop


def test_a_state_saved_after_an_epoch_starts_the_next_one():
    reference = _pipe().loader(batch_size=4)
    epochs = [_epoch(reference), _epoch(reference)]
    loader = _pipe().loader(batch_size=4)
    assert _epoch(loader) == epochs[0]
    state = loader.state_dict()
    assert state["epoch"] == 1 and "stages" not in state
    resumed = _pipe().loader(batch_size=4)
    resumed.load_state_dict(state)
    assert _epoch(resumed) == epochs[1]


def test_several_saves_in_one_run_each_resume_exactly():
    reference = _epoch(_pipe().loader(batch_size=5))
    loader = _pipe().loader(batch_size=5)
    seen, states = [], {}
    for batch in loader:
        seen.append(batch.tolist())
        if len(seen) in (3, 4, 11):
            states[len(seen)] = loader.state_dict()
    assert seen == reference
    for at, state in states.items():
        resumed = _pipe().loader(batch_size=5)
        resumed.load_state_dict(state)
        assert _epoch(resumed) == reference[at:], at


def test_a_state_of_other_batching_or_another_rank_is_refused(monkeypatch):
    loader = _pipe().loader(batch_size=4)
    _epoch(loader, 2)
    state = loader.state_dict()
    with pytest.raises(ConfigError, match="batch_size"):
        _pipe().loader(batch_size=8).load_state_dict(state)
    with pytest.raises(ConfigError, match="needs a state"):
        _pipe().loader(batch_size=4).load_state_dict([1, 2])
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    other = _pipe().loader(batch_size=4)
    other.load_state_dict(state)
    with pytest.raises(ConfigError, match="rank 0 of 1"):
        iter(other)


def test_ranks_from_the_environment_split_the_data_with_no_worker_split(monkeypatch):
    shares = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        share = _flat(_epoch(pf.from_items(range(N)).loader(batch_size=4)))
        # the rank's share, as iterating the same pipeline directly in this process gives it
        assert share == _flat(pf.from_items(range(N)).batch(4))
        shares.append(share)
    assert sorted(shares[0] + shares[1]) == list(range(N))
    assert shares[0] and shares[1] and not set(shares[0]) & set(shares[1])


def _sample(i):
    return {"image": torch.full((3, 2), i, dtype=torch.uint8), "depth": np.full(2, i / 2),
            "label": i, "weight": i / 3, "name": f"s{i}", "pair": (i, torch.tensor([i]))}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def test_collate_is_torchs_default_collate():
    got = list(pf.from_items(range(10)).map(_sample).loader(batch_size=4))
    expected = [default_collate([_sample(i) for i in range(s, min(s + 4, 10))]) for s in (0, 4, 8)]
    assert len(got) == 3 and all(_same(g, e) for g, e in zip(got, expected))
    plain = list(pf.from_items(range(5)).loader(batch_size=2, collate=False, drop_last=True))
    assert plain == [[0, 1], [2, 3]]
    one_by_one = list(pf.from_items(range(3)).map(lambda i: np.arange(i + 1)).loader(batch_size=None))
    assert all(isinstance(t, torch.Tensor) for t in one_by_one)  # as the DataLoader converts


def test_device_and_pin_memory_move_the_batches():
    got = list(pf.from_items(range(6)).map(_sample).loader(batch_size=3, device="cpu", pin_memory=True))
    assert [b["label"].tolist() for b in got] == [[0, 1, 2], [3, 4, 5]]
    assert all(b["image"].device.type == "cpu" for b in got)
    assert "to" in pf.from_items(range(2)).loader(device="cpu").explain()


def test_stats_count_every_stage_the_appended_ones_too():
    loader = _pipe().loader(batch_size=4)
    _epoch(loader)
    stats = loader.stats()
    assert stats["batch"]["items"] == 26
    assert stats["map"]["items"] == N and stats["prefetch#2"]["items"] == 26
    assert stats["from_items"]["items"] == N


def test_len_counts_batches_when_the_pipeline_has_a_length():
    pipe = pf.from_items(range(10)).with_epoch(10)
    assert len(pipe.loader(batch_size=4)) == 3 and len(pipe.loader(batch_size=4, drop_last=True)) == 2
    with pytest.raises(TypeError, match="not known"):
        len(pf.from_items(range(3)).loader())


@pytest.mark.parametrize(("option", "value"), [("batch_size", 0), ("prefetch", 0), ("pin_memory", 1),
                                               ("collate", "yes"), ("device", "nowhere")])
def test_bad_options_are_config_errors(option, value):
    with pytest.raises(ConfigError, match=option):
        pf.from_items(range(3)).loader(**{option: value})


def test_autotune_budgets_every_core_of_the_process_without_dataloader_workers():
    cores = len(os.sched_getaffinity(0))
    assert cpu_budget() == cores and bounds("cpu") == (1, cores)


def _pipeflow_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("pipeflow")}


def _settle(check, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("how", ["close", "new-pass", "gc", "end"])
def test_no_thread_outlives_the_pass(how):
    before = _pipeflow_threads()
    loader = _pipe().loader(batch_size=4, device="cpu")
    if how == "end":
        _epoch(loader)
    else:
        _epoch(loader, 3)
        assert _pipeflow_threads() - before
        if how == "close":
            loader.close()
        elif how == "new-pass":
            _epoch(iter(loader), 1)  # the second pass ended the first one
            loader.close()
        else:
            del loader
            gc.collect()
    assert _settle(lambda: not (_pipeflow_threads() - before)), _pipeflow_threads() - before


def _children() -> set[int]:
    """Process workers: the children of the fork server (which itself stays, by design)."""
    return {p.pid for p in psutil.Process().children(recursive=True) if p.ppid() != os.getpid()}


@pytest.mark.slow
def test_process_map_workers_end_with_the_loader():
    before = _children()
    pipe = pf.from_items(range(40)).map(double, workers=2, method="process")
    loader = pipe.loader(batch_size=8)
    assert sorted(_flat(_epoch(loader))) == [2 * i for i in range(40)]
    assert _children() - before
    loader.close()
    del loader, pipe
    gc.collect()
    assert _settle(lambda: not (_children() - before), 15), _children() - before


def test_states_of_two_ranks_resume_elastically_on_one(monkeypatch):
    def pipe():
        return pf.from_items(range(40)).shuffle(8, seed=1).shard_by_rank()

    seen, states = [], []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = pipe().loader(batch_size=3, collate=False)
        seen += [x for batch in _epoch_lists(loader, 2 + rank) for x in batch]
        states.append(loader.state_dict())
        loader.close()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    resumed = pipe().loader(batch_size=3, collate=False).resume_from(pf.merge_states(states))
    rest = [x for batch in resumed for x in batch]
    assert len(seen) == 15 and sorted(seen + rest) == list(range(40))
    assert resumed.epoch == 1 and sorted(x for b in resumed for x in b) == list(range(40))


def _epoch_lists(loader, stop):
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == stop:
            break
    return out


class _LoaderInside(torch.utils.data.IterableDataset):
    """Iterates a loader inside a DataLoader worker: refused, with the way out in the message."""

    def __iter__(self):
        try:
            iter(pf.from_items(range(3)).loader())
        except ConfigError as exc:
            yield str(exc)


def test_a_loader_inside_a_dataloader_worker_is_refused():
    got = list(torch.utils.data.DataLoader(_LoaderInside(), batch_size=None, num_workers=1))
    assert len(got) == 1 and "hand the pipeline itself to the DataLoader" in got[0]


def _torch_threads(_):
    return torch.get_num_threads()


def test_pipeflow_threads_run_torch_single_threaded_and_leave_the_main_thread_alone():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        pool = list(pf.from_items(range(4)).map(_torch_threads, workers=2))
        prefetched = list(pf.from_items(range(2)).map(_torch_threads).prefetch(2))
        batched = list(pf.from_items(range(2)).map(_torch_threads).loader(batch_size=None))
        assert pool == [1] * 4 and prefetched == [1] * 2 and [int(b) for b in batched] == [1] * 2
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("tail", [
    lambda p: p, lambda p: p.prefetch(2), lambda p: p.shuffle(4, seed=0).filter(bool).with_epoch(3),
    lambda p: p.map(len)], ids=["batch", "prefetch", "shuffle-filter-with_epoch", "map"])
def test_a_batched_pipeline_with_a_loader_batch_size_is_refused(tail):
    """The default batch_size=1 used to wrap every batch of a batched pipeline in a batch of one."""
    pipe = tail(pf.from_items(range(20)).batch(4))
    with pytest.raises(pf.ConfigError, match=r"already makes batches \(batch\(4\)\).*batch_size=None"):
        pipe.loader()
    with pytest.raises(pf.ConfigError, match="2 batches to a batch"):
        pipe.loader(batch_size=2)
    assert len(list(pipe.loader(batch_size=None, collate=False))) in (3, 5)


def test_batches_made_anew_after_a_batch_are_not_batches_of_it():
    pipe = pf.from_items(range(20)).batch(4).unbatch()
    assert _flat(list(pipe.loader(batch_size=5, collate=False))) == list(range(20))
