"""The disk cache stage: hits and misses, LRU eviction, sharing between processes, state."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

import pytest
import torch.utils.data

import pipeflow as pf
from pipeflow.backends.local import LocalBackend
from pipeflow.disk_cache import DiskCache
from pipeflow.errors import ConfigError, ObjectNotFoundError
from pipeflow.stages.cache import Cacher
from pipeflow.stages.source import ItemSource


class CountingBackend(LocalBackend):
    """A local backend that appends one line per read to a log file (works across processes)."""

    name = "counting-local"

    def __init__(self, log: str) -> None:
        super().__init__()
        self.log = log

    def __getstate__(self):
        return {**super().__getstate__(), "log": self.log}

    def __setstate__(self, state):
        super().__setstate__(state)
        self.log = state["log"]

    def read(self, url, start=None, end=None):
        with open(self.log, "a") as f:
            f.write(url + "\n")
        return super().read(url, start, end)

    def reads(self) -> list[str]:
        return Path(self.log).read_text().splitlines() if os.path.exists(self.log) else []


def _content(i: int) -> bytes:
    return (f"object-{i}-".encode() * (10 + i % 7))[:100 + i]


@pytest.fixture
def objects(tmp_path: Path) -> dict[str, bytes]:
    root = tmp_path / "store"
    root.mkdir()
    out = {}
    for i in range(12):
        path = root / f"{i:03d}.bin"
        path.write_bytes(_content(i))
        out[str(path)] = _content(i)
    return out


def _no_tmp_files(directory: Path) -> bool:
    return not [p for p in directory.rglob("*") if p.name.startswith(".tmp-")]


def test_second_epoch_reads_nothing_from_the_backend(tmp_path, objects):
    backend = CountingBackend(str(tmp_path / "reads.log"))
    urls = sorted(objects)
    pipe = pf.from_items(urls).cache(str(tmp_path / "cache"), max_bytes=1 << 20, backend=backend)
    first = list(pipe)
    assert [(r.name, r.data, r.url) for r in first] == [(u, objects[u], u) for u in urls]
    assert sorted(backend.reads()) == urls
    assert pipe.stats()["cache"]["cache_misses"] == len(urls)
    second = list(pipe)
    assert [r.data for r in second] == [objects[u] for u in urls]
    assert len(backend.reads()) == len(urls)  # nothing more was read
    stats = pipe.stats()["cache"]
    assert stats["cache_hits"] == len(urls)


def test_dataloader_workers_share_the_cache_across_epochs(tmp_path, objects):
    backend = CountingBackend(str(tmp_path / "reads.log"))
    urls = sorted(objects)
    pipe = pf.from_items(urls).cache(str(tmp_path / "cache"), max_bytes=1 << 20, backend=backend,
                                     workers=2).map(lambda r: (r.url, r.data))
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2)
    for epoch in range(2):
        pipe.set_epoch(epoch)
        got = dict(loader)
        assert got == objects
    assert sorted(backend.reads()) == urls  # each object fetched exactly once, in epoch 1
    assert _no_tmp_files(tmp_path / "cache")


def _until_the_clock_moves_past(path: str, probe: Path, timeout: float = 5.0) -> None:
    """Wait until a file written now gets a later modification time than ``path`` has.

    File times come from the kernel's coarse clock: recency is only comparable once it ticked.
    """
    reference = os.stat(path).st_mtime_ns
    deadline = time.monotonic() + timeout
    probe.touch()
    while os.stat(probe).st_mtime_ns <= reference and time.monotonic() < deadline:
        time.sleep(0.001)
        probe.touch()
    assert os.stat(probe).st_mtime_ns > reference, "the file system clock did not move"


def test_lru_eviction_keeps_the_recently_used(tmp_path):
    cache = DiskCache(tmp_path / "c", max_bytes=250)
    probe = tmp_path / "probe"
    cache.put("a", b"a" * 100)
    _until_the_clock_moves_past(cache.path_for("a"), probe)
    cache.put("b", b"b" * 100)
    _until_the_clock_moves_past(cache.path_for("b"), probe)
    assert cache.get("a") == b"a" * 100  # a is now more recent than b
    _until_the_clock_moves_past(cache.path_for("a"), probe)
    cache.put("c", b"c" * 100)
    assert cache.get("b") is None
    assert cache.get("a") == b"a" * 100
    assert cache.get("c") == b"c" * 100
    assert cache.size() == 200


def test_object_larger_than_budget_is_read_but_not_kept(tmp_path, objects):
    url = sorted(objects)[-1]
    pipe = pf.from_items([url]).cache(str(tmp_path / "c"), max_bytes=10, backend="local")
    assert [r.data for r in pipe] == [objects[url]]
    stats = pipe.stats()["cache"]
    assert stats["cache_too_large"] == 1
    assert DiskCache(tmp_path / "c", max_bytes=10).size() == 0


def test_stale_temporary_files_are_removed_by_eviction(tmp_path):
    cache = DiskCache(tmp_path / "c", max_bytes=150, stale_tmp_seconds=60)
    (tmp_path / "c" / "ab").mkdir(parents=True)
    stale = tmp_path / "c" / "ab" / ".tmp-dead"
    fresh = tmp_path / "c" / "ab" / ".tmp-writing"
    stale.write_bytes(b"x" * 50)
    fresh.write_bytes(b"y" * 50)
    old = time.time() - 3600
    os.utime(stale, (old, old))
    cache.put("u1", b"1" * 100)
    cache.put("u2", b"2" * 100)  # over budget: scans, evicts u1, removes the stale temp file
    assert not stale.exists()
    assert fresh.exists()  # a live writer's file is left alone
    assert cache.get("u1") is None and cache.get("u2") == b"2" * 100


def test_missing_object_raises_typed_error_naming_url(tmp_path):
    missing = str(tmp_path / "nope.bin")
    pipe = pf.from_items([missing]).cache(str(tmp_path / "c"), max_bytes=1000, backend="local")
    with pytest.raises(ObjectNotFoundError) as info:
        list(pipe)
    assert "nope.bin" in str(info.value)


def test_skip_counts_failures(tmp_path, objects):
    urls = sorted(objects)[:3] + [str(tmp_path / "nope.bin")]
    pipe = pf.from_items(urls).cache(str(tmp_path / "c"), max_bytes=1 << 20, backend="local",
                                     on_error="skip")
    assert [r.url for r in pipe] == urls[:3]
    assert pipe.stats()["cache"]["skipped"] == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_invalid_budget(tmp_path, bad):
    with pytest.raises(ConfigError):
        pf.from_items(["x"]).cache(str(tmp_path), max_bytes=bad)


def test_state_round_trip_mid_epoch(tmp_path, objects):
    urls = sorted(objects)

    def make():
        return Cacher(ItemSource(urls), str(tmp_path / "c"), max_bytes=1 << 20, backend="local")

    stage = make()
    head = [next(stage).url for _ in range(5)]
    state = stage.state_dict()
    stage.close()
    fresh = make()
    fresh.load_state_dict(state)
    assert head + [r.url for r in fresh] == urls
    fresh.close()


def _hammer(directory: str, urls: list[str], seed: int, rounds: int, max_bytes: int, out) -> None:
    import random

    backend = LocalBackend()
    cache = DiskCache(directory, max_bytes=max_bytes)
    rng = random.Random(seed)
    bad = 0
    for _ in range(rounds):
        order = urls[:]
        rng.shuffle(order)
        for url in order:
            data = cache.get(url)
            if data is None:
                data = backend.read(url)
                cache.put(url, data)
            if data != Path(url).read_bytes():
                bad += 1
    out.put(bad)


def test_processes_sharing_one_directory_never_see_torn_files(tmp_path, objects):
    urls = sorted(objects)
    directory = str(tmp_path / "shared")
    max_bytes = sum(len(v) for v in objects.values()) // 2  # forces constant eviction
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(directory, urls, seed, 6, max_bytes, out))
             for seed in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert results == [0, 0, 0, 0]
    assert _no_tmp_files(tmp_path / "shared")
    cache = DiskCache(directory, max_bytes=max_bytes)
    cache.evict()
    assert cache.size() <= max_bytes
    # every file left is a complete copy of the object it is named after
    by_path = {cache.path_for(u): objects[u] for u in urls}
    for path in Path(directory).rglob("*"):
        if path.is_file():
            assert path.read_bytes() == by_path[str(path)]
