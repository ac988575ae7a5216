"""pipe.stats(): per-stage numbers summed over DataLoader workers, the side channel that carries
them, and the verdict naming the planted bottleneck."""

from __future__ import annotations

import gc
import io
import os
import pickle
import random
import time

import pytest
from PIL import Image
from torch.utils.data import DataLoader

import pipeflow as pf
from pipeflow.stats import PipelineStats, StatsChannel, sweep_stale

from ._stats_helpers import slow_identity, very_slow_identity

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def _labels(pipe: pf.Pipeline) -> list[str]:
    # the first word of each explain() line, drawing characters stripped
    return [line.strip("│├└─ ").split("(", 1)[0] for line in pipe.explain().splitlines()]


def _drain(loader) -> int:
    return sum(1 for _ in loader)


def test_every_stage_reports_items_busy_wait_under_its_explain_label():
    pipe = pf.from_items(range(500)).map(abs).map(slow_identity).batch(10).unbatch()
    assert _drain(pipe) == 500
    stats = pipe.stats()
    assert isinstance(stats, PipelineStats)
    assert sorted(stats) == sorted(_labels(pipe))
    for label in stats:
        assert {"items", "busy_s", "wait_s", "blocked_s"} <= set(stats[label])
    assert stats["batch"]["items"] == 50 and stats["map#2"]["items"] == 500
    # 500 x 2 ms of sleeping is map#2's own work, not its neighbours'
    assert stats["map#2"]["busy_s"] > 0.5
    assert stats["map"]["busy_s"] < stats["map#2"]["busy_s"] / 4
    assert stats["batch"]["wait_s"] > 0.5  # batch waited on map#2


def _not_7(x):
    if x == 7:
        raise ValueError(x)
    return x


def test_items_are_exact_where_stages_count_in_bulk():
    # source, filter, map, batch and unbatch count their items from their own bookkeeping
    # (positions, pulls, one counter per batch), not per call: every count must still be exact
    pipe = (pf.from_items(range(3000)).filter(lambda x: x % 3).map(_not_7, on_error="skip")
            .batch(7).unbatch())
    for epoch in (1, 2):
        assert _drain(pipe) == 1999
        items = {label: numbers["items"] for label, numbers in pipe.stats().items()}
        assert items == {"from_items": 3000 * epoch, "filter": 2000 * epoch, "map": 1999 * epoch,
                         "batch": 286 * epoch, "unbatch": 1999 * epoch}
    # an error ends the epoch: the item it was raised on is not counted, nor the rest of its batch
    failing = pf.from_items(range(100)).map(_not_7).batch(4).unbatch()
    with pytest.raises(ValueError):
        _drain(failing)
    items = {label: numbers["items"] for label, numbers in failing.stats().items()}
    assert items == {"from_items": 8, "map": 7, "batch": 1, "unbatch": 4}


@pytest.mark.parametrize("stop_at", [1, 5, 6, 199])
def test_items_after_a_resume_count_what_this_run_delivered(stop_at):
    def build():
        return pf.from_items(range(300)).filter(lambda x: x % 3).batch(5).unbatch()

    it = iter(build())
    for _ in range(stop_at):
        next(it)
    state = it.state_dict()
    it.close()
    resumed = build()
    again = iter(resumed)
    again.load_state_dict(state)
    assert sum(1 for _ in again) == 200 - stop_at
    items = resumed.stats()
    # the resumed unbatch re-reads the batch it stopped in and delivers only the rest of it
    assert items["unbatch"]["items"] == 200 - stop_at
    assert items["batch"]["items"] == 40 - stop_at // 5
    assert items["filter"]["items"] == 5 * items["batch"]["items"]


@pytest.mark.parametrize("num_workers", [0, 2, 3])
def test_stats_are_summed_over_dataloader_workers(num_workers):
    pipe = pf.from_items(range(300)).map(slow_identity, workers=2).batch(5)
    loader = DataLoader(pipe, batch_size=None, num_workers=num_workers)
    assert _drain(loader) == 60
    stats = pipe.stats()
    assert stats.processes == max(1, num_workers)
    assert stats["map"]["items"] == 300 and stats["batch"]["items"] == 60
    assert stats["map"]["busy_s"] > 0.3  # 300 x 2 ms, whichever process did it
    # a second epoch adds to the first
    assert _drain(loader) == 60
    assert pipe.stats()["map"]["items"] == 600


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_listing_counts_the_objects_it_gave_also_when_read_by_assignment(tmp_path, num_workers):
    # in DataLoader workers the listing is read by place (at()), never by next(): it showed 0
    for i in range(12):
        (tmp_path / f"{i:02d}.bin").write_bytes(b"x")
    pipe = pf.list_objects(str(tmp_path) + "/", pattern="*.bin").map(slow_identity)
    assert _drain(DataLoader(pipe, batch_size=None, num_workers=num_workers)) == 12
    stats = pipe.stats()
    assert stats["list_objects"]["items"] == 12 == stats["map"]["items"]
    assert _drain(DataLoader(pipe, batch_size=None, num_workers=num_workers)) == 12
    assert pipe.stats()["list_objects"]["items"] == 24


@pytest.mark.slow
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_stats_cross_spawn_and_forkserver_workers(context):
    pipe = pf.from_items(range(100)).map(slow_identity)
    loader = DataLoader(pipe, batch_size=None, num_workers=2, multiprocessing_context=context)
    assert _drain(loader) == 100
    assert pipe.stats()["map"]["items"] == 100


def test_stats_during_an_epoch_with_persistent_workers():
    pipe = pf.from_items(range(200)).map(slow_identity)
    loader = DataLoader(pipe, batch_size=None, num_workers=2, persistent_workers=True)
    for epoch in range(2):
        for i, _ in enumerate(loader):
            if i == 20:
                time.sleep(1.5)  # the workers run ahead, then publish while blocked
                during = pipe.stats()["map"]["items"]
                assert 200 * epoch + 20 <= during < 200 * (epoch + 1)
        assert pipe.stats()["map"]["items"] == 200 * (epoch + 1)
    del loader


def test_channel_directory_is_removed_with_the_pipeline():
    pipe = pf.from_items(range(40)).map(slow_identity)
    assert _drain(DataLoader(pipe, batch_size=None, num_workers=2)) == 40
    path = pipe._channel.path
    assert os.path.isdir(path) and len(os.listdir(path)) == 2
    del pipe
    gc.collect()
    assert not os.path.exists(path)


def test_stale_channels_of_dead_owners_are_swept(tmp_path):
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    stale = tmp_path / f"pipeflow-stats-{dead}-abc"
    live = tmp_path / f"pipeflow-stats-{os.getpid()}-abc"
    stale.mkdir()
    live.mkdir()
    (stale / "1-x.json").write_text("{}")
    assert sweep_stale(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and live.exists()


def test_a_worker_does_not_write_for_a_dead_owner(tmp_path):
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    channel = StatsChannel(owner=dead, path=str(tmp_path / f"pipeflow-stats-{dead}-x"))
    channel.write("1.json", {"stages": {}})
    assert os.listdir(tmp_path) == []


def test_a_worker_publishing_after_the_owner_removed_the_channel_leaves_nothing():
    # a DataLoader worker's last snapshot can race the owner's garbage collection of the
    # pipeline: the directory must not come back once the owner removed it
    pipe = pf.from_items(range(10)).map(abs)
    channel = pickle.loads(pickle.dumps(pipe))._channel  # pickling makes the directory
    assert os.path.isdir(channel.path)
    go_r, go_w = os.pipe()
    child = os.fork()
    if child == 0:  # the worker: waits until the owner removed the channel, then publishes
        os.read(go_r, 1)
        channel.write("1-x.json", {"stages": {}})
        os._exit(0)
    del pipe
    gc.collect()
    assert not os.path.exists(channel.path)
    os.write(go_w, b"x")
    os.waitpid(child, 0)
    os.close(go_r)
    os.close(go_w)
    assert not os.path.exists(channel.path)


# ---- the verdict -------------------------------------------------------------------------------------
def test_verdict_slow_map():
    pipe = pf.from_items(range(60)).map(abs).map(very_slow_identity).batch(4)
    _drain(pipe)
    stats = pipe.stats()
    assert stats.bottleneck == "map#2", str(stats)
    assert "more workers for map#2" in stats.advice
    assert "bottleneck: map#2" in str(stats)


def test_verdict_slow_consumer():
    pipe = pf.from_items(range(60)).map(abs).prefetch(4)
    for _ in pipe:
        time.sleep(0.02)
    stats = pipe.stats()
    assert stats.bottleneck == "consumer", str(stats)
    assert stats.advice.startswith("nothing to do")


def _png(seed: int) -> bytes:
    rng = random.Random(seed)
    image = Image.frombytes("RGB", (384, 384), rng.randbytes(384 * 384 * 3))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def test_verdict_cpu_bound_decode():
    blobs = [_png(i) for i in range(4)]
    samples = [{"__key__": f"s{i}", "png": blobs[i % 4], "cls": b"1"} for i in range(40)]
    pipe = pf.from_items(samples).decode("numpy").batch(4)
    _drain(pipe)
    stats = pipe.stats()
    assert stats.bottleneck == "decode", str(stats)
    assert "more workers for decode" in stats.advice


def test_verdict_in_dataloader_workers_names_the_slow_map():
    pipe = pf.from_items(range(80)).map(very_slow_identity).batch(4)
    _drain(DataLoader(pipe, batch_size=None, num_workers=2))
    stats = pipe.stats()
    assert stats.processes == 2 and stats.bottleneck == "map", str(stats)


def test_all_ranks_without_distributed_is_this_process():
    pipe = pf.from_items(range(10)).map(abs)
    _drain(pipe)
    assert pipe.stats(all_ranks=True) == pipe.stats()
