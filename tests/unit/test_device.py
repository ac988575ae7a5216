"""pin_memory() and to(device): tensors moved on a background thread."""

from __future__ import annotations

import logging
import threading
from collections import namedtuple

import pytest
import torch
from torch.utils.data import DataLoader

import pipeflow as pf
from pipeflow.errors import ConfigError
from pipeflow.stages.device import DeviceMover, move_tensors

Pair = namedtuple("Pair", "image label")


def _nested(i):
    return {"image": torch.full((2, 2), i), "meta": [torch.tensor(i), "text", (torch.tensor([i]),)],
            "pair": Pair(torch.tensor(i), i)}


def test_move_tensors_reaches_into_dicts_lists_and_tuples():
    seen = []
    out = move_tensors(_nested(3), lambda t: seen.append(t) or t + 1)
    assert len(seen) == 4
    assert out["image"].tolist() == [[4, 4], [4, 4]] and out["meta"][1] == "text"
    assert out["meta"][2][0].tolist() == [4] and isinstance(out["pair"], Pair)
    assert out["pair"].label == 3 and out["pair"].image.item() == 4


def test_to_cpu_keeps_every_item_in_order():
    got = list(pf.from_items(range(20)).map(_nested).to("cpu", non_blocking=False))
    assert [int(x["image"][0, 0]) for x in got] == list(range(20))
    assert all(x["image"].device.type == "cpu" for x in got)


class _Recording(DeviceMover):
    threads: list[str] = []

    def prepare(self, item):
        _Recording.threads.append(threading.current_thread().name)
        return super().prepare(item)


def test_the_copy_runs_on_a_background_thread():
    _Recording.threads = []
    list(pf.from_items(range(5)).map(_nested).then(_Recording, "cpu"))
    assert len(_Recording.threads) == 5
    assert all(name.startswith("pipeflow-prefetch") for name in _Recording.threads)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only behaviour")
def test_pin_memory_without_cuda_passes_through_with_one_note(caplog):
    from pipeflow import _once

    _once._shared[_once._KEYS.index("pin_memory_no_cuda")] = 0  # as in a fresh run
    caplog.set_level(logging.INFO, logger="pipeflow")
    items = [_nested(i) for i in range(4)]
    pipe = pf.from_items(items).pin_memory()
    for _ in range(2):
        got = list(pipe)
        assert all(a["image"] is b["image"] for a, b in zip(got, items))
    notes = [r for r in caplog.records if "pin_memory() passes tensors through" in r.message]
    assert len(notes) == 1
    # in DataLoader workers too: nothing to pin, nothing refused
    assert len(list(DataLoader(pipe, batch_size=None, num_workers=2))) == 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only behaviour")
def test_a_cuda_device_without_cuda_is_a_config_error():
    pipe = pf.from_items(range(3)).map(_nested).to("cuda:0")
    with pytest.raises(ConfigError, match="not available"):
        list(pipe)


@pytest.mark.parametrize("build", [lambda p: p.to("gpu-ish"), lambda p: p.to(None),
                                   lambda p: p.to("cpu", non_blocking=1), lambda p: p.pin_memory(size=0),
                                   lambda p: p.to("cpu", size="auto")])
def test_bad_options_fail_where_the_pipeline_is_written(build):
    with pytest.raises(ConfigError):
        build(pf.from_items(range(3)))


def test_errors_upstream_arrive_with_their_type():
    def boom(x):
        if x == 3:
            raise KeyError("x3")
        return torch.tensor(x)

    it = iter(pf.from_items(range(6)).map(boom).to("cpu"))
    assert [int(next(it)) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(KeyError, match="x3"):
        next(it)
