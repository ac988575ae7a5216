"""DiskCache at its edges: exact budgets, what eviction reports, and scans that must see every
cached file past stray entries and temporary files (the survivors of a mutation run)."""

from __future__ import annotations

from pathlib import Path

import pipeflow as pf
from pipeflow.disk_cache import DiskCache


def test_objects_that_fill_the_budget_exactly_are_all_kept(tmp_path):
    cache = DiskCache(tmp_path / "c", max_bytes=200)
    assert cache.put("a", b"a" * 100) is True
    assert cache.put("b", b"b" * 100) is True
    assert cache.get("a") == b"a" * 100 and cache.get("b") == b"b" * 100
    assert cache.size() == 200
    assert cache.evict() == 0
    whole = DiskCache(tmp_path / "w", max_bytes=150)
    assert whole.put("x", b"x" * 150) is True  # as large as the budget: still kept
    assert whole.get("x") == b"x" * 150
    assert whole.put("y", b"y" * 151) is False


def test_evict_reports_the_bytes_it_removed(tmp_path):
    cache = DiskCache(tmp_path / "c", max_bytes=10_000)
    for i, size in enumerate((100, 200, 300)):
        cache.put(f"u{i}", bytes([i]) * size)
    cache.max_bytes = 300
    before = cache.size()
    removed = cache.evict()
    assert removed > 0 and removed == before - cache.size()
    assert cache.size() <= 300


def test_scans_count_every_file_past_stray_entries_and_temporary_files(tmp_path):
    directory = tmp_path / "c"
    cache = DiskCache(directory, max_bytes=1 << 20, stale_tmp_seconds=3600)
    objects = {f"s3://b/k{i}": bytes([i]) * (50 + i) for i in range(40)}
    for url, data in objects.items():
        cache.put(url, data)
    # a stray file beside the subdirectories, and a live writer's temporary file in each of them
    (directory / "stray.txt").write_bytes(b"not a cached object")
    for sub in directory.iterdir():
        if sub.is_dir():
            (sub / ".tmp-writing").write_bytes(b"partial")
    total = sum(len(d) for d in objects.values())
    assert cache.size() == total
    cache.max_bytes = total - 1
    assert cache.evict() > 0
    assert cache.size() <= total - 1
    assert sum(1 for url in objects if cache.get(url) is not None) == len(objects) - 1


def test_cache_hits_served_by_worker_threads_name_their_url(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    urls = []
    for i in range(6):
        path = root / f"{i}.bin"
        path.write_bytes(bytes([i]) * 10)
        urls.append(str(path))
    pipe = pf.from_items(urls).cache(str(tmp_path / "c"), max_bytes=1 << 20, backend="local", workers=3)
    for _ in range(2):  # a miss epoch, then a hit epoch
        assert [(r.name, r.url, r.data) for r in pipe] == [(u, u, Path(u).read_bytes()) for u in urls]
