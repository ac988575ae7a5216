"""fetch_batch against the local S3 server: exactly once, byte-identical, nothing left behind."""

from __future__ import annotations

import gc
import glob
import os
import tempfile

import psutil
import pytest

import pipeflow as pf
from pipeflow.errors import ConfigError, ObjectNotFoundError
from pipeflow.items import Record
from pipeflow.stages.fetch_batch import BatchFetcher
from pipeflow.stages.source import ItemSource

N = 23  # not a multiple of any batch size used below


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _staging_dirs(parent: str | None = None) -> set[str]:
    return set(glob.glob(os.path.join(parent or tempfile.gettempdir(), "pipeflow-fetch-*")))


@pytest.fixture
def pairs(s3, s3_bucket) -> dict[tuple[str, str], tuple[bytes, bytes]]:
    out = {}
    for i in range(N):
        image, label = os.urandom(500 + i), str(i).encode()
        urls = (s3.put(s3_bucket, f"s/{i}.image", image), s3.put(s3_bucket, f"s/{i}.label", label))
        out[urls] = (image, label)
    return out


@pytest.fixture
def clean():
    before_dirs, before_children = _staging_dirs(), _children()
    yield
    gc.collect()
    assert _staging_dirs() <= before_dirs
    assert _children() <= before_children


@pytest.mark.parametrize("backend", ["s5cmd", "boto3"])
def test_pairs_exactly_once_byte_identical(pairs, backend, clean):
    got = list(pf.from_items(list(pairs)).fetch_batch(backend, batch_size=5))
    assert len(got) == N
    for sample, (urls, bodies) in zip(got, pairs.items()):
        assert tuple(r.url for r in sample) == urls
        assert tuple(r.data for r in sample) == bodies
        assert all(isinstance(r, Record) for r in sample)


def test_single_urls_and_object_infos(s3, s3_bucket, pairs, clean):
    from pipeflow.backends import get_backend

    infos = list(get_backend("s5cmd").list(f"s3://{s3_bucket}/s/"))
    got = list(BatchFetcher(ItemSource(infos), batch_size=8))
    assert sorted(r.url for r in got) == sorted(u for p in pairs for u in p)
    assert len(got) == 2 * N
    data = {u: b for p, bs in pairs.items() for u, b in zip(p, bs)}
    assert all(r.data == data[r.url] for r in got)


def test_paths_are_deleted_after_use(pairs, clean):
    stage = BatchFetcher(ItemSource(list(pairs)), batch_size=4, output="path")
    previous = None
    for (image_path, label_path), bodies in zip(stage, pairs.values()):
        assert (open(image_path, "rb").read(), open(label_path, "rb").read()) == bodies
        assert stage.staging_dir and image_path.startswith(stage.staging_dir)
        if previous:
            assert not any(os.path.exists(p) for p in previous)
        previous = (image_path, label_path)
    assert stage.staging_dir is None  # exhausted: staging dir already gone


def test_odd_keys_through_an_s5cmd_command_file(s3, s3_bucket, tmp_path, clean):
    keys = ["a b.bin", "-dash", "q'uo\"te", "star*.bin", "$(touch PWNED)", "x' ; touch PWNED '",
            "back\\slash", "uni é.bin", "tab\there"]
    bodies = {s3.put(s3_bucket, k, k.encode() * 3): k.encode() * 3 for k in keys}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        got = list(BatchFetcher(ItemSource(list(bodies)), batch_size=4))
    finally:
        os.chdir(cwd)
    assert {r.url: r.data for r in got} == bodies
    assert not (tmp_path / "PWNED").exists()


def test_key_with_newline_is_a_clear_error(s3, s3_bucket, clean):
    good = s3.put(s3_bucket, "good", b"g")
    bad = f"s3://{s3_bucket}/new\nline"
    with pytest.raises(ConfigError, match="command file"):
        list(BatchFetcher(ItemSource([good, bad]), batch_size=10))
    stage = BatchFetcher(ItemSource([good, bad, good]), batch_size=10, on_error="skip")
    assert [r.data for r in stage] == [b"g", b"g"]
    assert stage.context.stats.snapshot()[stage.name]["skipped"] == 1


def test_missing_object_raises_when_reached_or_is_skipped(s3, s3_bucket, clean):
    urls = [s3.put(s3_bucket, f"m/{i}", bytes([i])) for i in range(5)]
    urls.insert(3, f"s3://{s3_bucket}/m/missing")
    stage = BatchFetcher(ItemSource(urls), batch_size=2)
    assert [next(stage).data for _ in range(3)] == [b"\x00", b"\x01", b"\x02"]
    with pytest.raises(ObjectNotFoundError) as info:
        next(stage)
    assert info.value.url == urls[3]
    stage.close()
    skipping = BatchFetcher(ItemSource(urls), batch_size=2, on_error="skip")
    assert [r.data for r in skipping] == [bytes([i]) for i in range(5)]
    assert skipping.context.stats.snapshot()[skipping.name] == {"skipped": 1}


def test_break_close_and_gc_leave_nothing(pairs, clean):
    pipe = pf.from_items(list(pairs)).fetch_batch(batch_size=3)
    for i, _ in enumerate(pipe):
        if i == 4:
            break  # the iterator is dropped with downloads in flight
    stage = BatchFetcher(ItemSource(list(pairs)), batch_size=3)
    next(stage)
    assert stage.staging_dir and os.listdir(stage.staging_dir)
    stage.close()
    stage = BatchFetcher(ItemSource(list(pairs)), batch_size=3)
    next(stage)
    del stage


def test_exception_downstream_cleans_up(pairs, clean):
    def boom(sample):
        raise RuntimeError("user code failed")

    with pytest.raises(Exception, match="user code failed"):
        list(pf.from_items(list(pairs)).fetch_batch(batch_size=4).map(boom))


def test_a_to_that_does_not_exist_is_a_config_error_and_nothing_is_made(pairs, tmp_path):
    missing = tmp_path / "shmm" / "stage"
    stage = BatchFetcher(ItemSource(list(pairs)), batch_size=6, to=str(missing), output="path")
    with pytest.raises(ConfigError, match=r"fetch_batch\(to=.*shmm/stage'\): no such directory"):
        next(stage)
    assert not (tmp_path / "shmm").exists()


@pytest.mark.parametrize("parent", ["tmp", "/dev/shm"])
def test_staging_under_to(pairs, tmp_path, parent):
    if parent == "/dev/shm" and not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    parent = str(tmp_path) if parent == "tmp" else parent
    before = _staging_dirs(parent)
    stage = BatchFetcher(ItemSource(list(pairs)), batch_size=6, to=parent, output="path")
    image, _ = next(stage)
    assert os.path.dirname(os.path.dirname(os.path.dirname(image))) == parent
    stage.close()
    assert _staging_dirs(parent) == before


def test_delete_false_keeps_files_until_close(pairs, clean):
    stage = BatchFetcher(ItemSource(list(pairs)), batch_size=5, output="path", delete=False)
    first = next(stage)
    for _ in range(7):
        next(stage)
    assert all(os.path.exists(p) for p in first)
    stage.close()
    assert not os.path.exists(first[0])


@pytest.mark.parametrize("k", [0, 1, 4, 5, 9, N - 1, N])
def test_resume_mid_epoch(pairs, k, clean):
    items = list(pairs)
    full = [tuple(r.data for r in s) for s in BatchFetcher(ItemSource(items), batch_size=5)]
    stage = BatchFetcher(ItemSource(items), batch_size=5)
    head = [tuple(r.data for r in next(stage)) for _ in range(k)]
    state = stage.state_dict()
    stage.close()
    fresh = BatchFetcher(ItemSource(items), batch_size=5)
    fresh.load_state_dict(state)
    rest = [tuple(r.data for r in s) for s in fresh]
    assert head + rest == full
    assert k == 0 or set(state) == {"sources", "offset"}  # small: a cursor, no data


def test_options_are_validated():
    src = ItemSource(["s3://b/k"])
    for kwargs in ({"batch_size": 0}, {"output": "files"}, {"on_error": "ignore"},
                   {"workers": 0}, {"timeout": -1}, {"delete": "yes"}):
        with pytest.raises(ConfigError):
            BatchFetcher(src, **kwargs)
    with pytest.raises(ConfigError, match="known backends"):
        BatchFetcher(src, "nope")
    with pytest.raises(ConfigError):
        list(BatchFetcher(ItemSource([3]), batch_size=1))


@pytest.mark.parametrize(("workers", "options", "expected"),
                         [(1, {}, None), (2, {}, 128), (4, {}, 64), (4, {"numworkers": 300}, 300)])
def test_dataloader_workers_share_s5cmds_requests_in_flight(pairs, clean, workers, options, expected):
    """In W DataLoader workers each s5cmd run keeps 256 / W requests in flight (a job keeps the
    requests of one process), unless the caller set numworkers; the bytes are unchanged."""
    from dataclasses import replace

    stage = BatchFetcher(ItemSource(list(pairs)), batch_size=8, options=options)
    stage.context = replace(stage.context, num_workers=workers)
    got = list(stage)
    assert stage._backend is not None and stage._backend.options.numworkers == expected
    assert [tuple(r.data for r in rs) for rs in got] == list(pairs.values())
