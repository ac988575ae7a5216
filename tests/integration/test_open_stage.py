"""``list_objects`` and ``open`` end to end, against the local S3 server and a local directory."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.utils.data

import pipeflow as pf
from pipeflow.backends import register_backend, unregister_backend
from pipeflow.backends.local import LocalBackend
from pipeflow.errors import ConfigError, ObjectNotFoundError
from pipeflow.items import ObjectInfo, Opened, Record
from pipeflow.pipeline import list_objects
from pipeflow.stages.listing import ObjectLister
from pipeflow.stages.open import Opener
from pipeflow.stages.source import ItemSource

pytestmark = pytest.mark.s3

RNG = random.Random(7)
OBJECTS = {f"shards/part-{i:03d}.bin": RNG.randbytes(RNG.randrange(0, 5000)) for i in range(40)}
OBJECTS["shards/readme.txt"] = b"not a shard"


@pytest.fixture(scope="module")
def s3_root(s3) -> str:
    bucket = s3.make_bucket(f"open-stage-{os.getpid()}")
    s3.put_many(bucket, OBJECTS)
    return f"s3://{bucket}/"


@pytest.fixture(scope="module")
def local_root(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("open-stage")
    for key, data in OBJECTS.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)
    return str(root) + "/"


def _bins(root: str) -> list[str]:
    return sorted(root + k for k in OBJECTS if k.endswith(".bin"))


def test_list_objects_with_pattern_is_sorted(s3_root: str, local_root: str) -> None:
    for root in (s3_root, local_root):
        infos = list(list_objects(root + "shards/", pattern="*.bin"))
        assert all(isinstance(i, ObjectInfo) for i in infos)
        assert [i.url for i in infos] == _bins(root + "") and len(infos) == 40


def test_list_objects_nothing_found_is_an_error(s3_root: str) -> None:
    with pytest.raises(ObjectNotFoundError) as info:
        list_objects(s3_root + "shards/", pattern="*.tar")
    assert "*.tar" in str(info.value)


@pytest.mark.parametrize("backend", ["boto3", "s3torchconnector", "fsspec"])
def test_open_many_in_flight_matches_local(s3_root: str, local_root: str, backend: str) -> None:
    remote = list(list_objects(s3_root + "shards/", pattern="*.bin").open(backend, workers=8, read=True))
    local = list(list_objects(local_root + "shards/", pattern="*.bin").open(workers=8, read=True))
    assert all(isinstance(r, Record) for r in remote)
    assert [r.url for r in remote] == _bins(s3_root)  # in order despite 8 requests in flight
    assert [r.data for r in remote] == [r.data for r in local]
    assert [r.data for r in remote] == [OBJECTS[u[len(s3_root):]] for u in _bins(s3_root)]


def test_open_yields_streams_the_consumer_closes(s3_root: str) -> None:
    urls = _bins(s3_root)[:5]
    got = []
    for item in pf.from_items(urls).open(workers=2):
        assert isinstance(item, Opened)
        with item.stream as stream:
            got.append(stream.read())
    assert got == [OBJECTS[u[len(s3_root):]] for u in urls]


def test_opener_closes_streams_it_handed_out_and_opened_ahead(local_root: str) -> None:
    urls = _bins(local_root)
    stage = Opener(ItemSource(urls), workers=4)
    first = next(stage)
    assert not first.stream.closed
    pending = stage.window.futures()
    stage.close()
    assert first.stream.closed
    for future in pending:  # opened ahead, never delivered
        if not future.cancelled():
            assert future.result().stream.closed


def test_missing_object_raises_or_is_counted(s3_root: str) -> None:
    urls = [s3_root + "shards/part-000.bin", s3_root + "shards/missing.bin", s3_root + "shards/part-001.bin"]
    with pytest.raises(ObjectNotFoundError) as info:
        list(pf.from_items(urls).open(read=True, workers=2))
    assert info.value.url == urls[1]
    pipe = pf.from_items(urls).open(read=True, workers=2, on_error="skip")
    assert [r.url for r in pipe] == [urls[0], urls[2]]
    assert sum(c.get("skipped", 0) for c in pipe.stats().values()) == 1


def test_backend_options_need_a_backend() -> None:
    with pytest.raises(ConfigError):
        pf.from_items(["s3://b/k"]).open(region="us-east-1")
    with pytest.raises(ConfigError):
        pf.from_items(["s3://b/k"]).open("boto3", no_such_option=1)


def test_open_state_round_trip(s3_root: str) -> None:
    urls = _bins(s3_root)[:12]

    def build() -> Opener:
        return Opener(ItemSource(urls), "boto3", workers=4, read=True)

    full = [r.url for r in build()]
    stage = build()
    head = [next(stage).url for _ in range(5)]
    state = stage.state_dict()
    stage.close()
    fresh = build()
    fresh.load_state_dict(state)
    rest = [r.url for r in fresh]
    fresh.close()
    assert head + rest == full == urls


def test_listing_state_round_trip(local_root: str) -> None:
    objects = tuple(LocalBackend().list(local_root + "shards/"))
    stage = ObjectLister(local_root + "shards/", objects=objects)
    head = [next(stage) for _ in range(7)]
    fresh = ObjectLister(local_root + "shards/", objects=objects)
    fresh.load_state_dict(stage.state_dict())
    assert head + list(fresh) == list(objects)


def test_manifest_is_written_once_and_reused(s3, s3_bucket: str, tmp_path: Path) -> None:
    root = f"s3://{s3_bucket}/"
    s3.put_many(s3_bucket, {"a/1.bin": b"1", "a/2.bin": b"22", "a/3.txt": b"x"})
    manifest = tmp_path / "listing.jsonl"
    first = [i.url for i in list_objects(root + "a/", pattern="*.bin", manifest=str(manifest))]
    assert first == [root + "a/1.bin", root + "a/2.bin"] and manifest.exists()
    s3.put(s3_bucket, "a/4.bin", b"4")  # the store changes; the manifest is the listing now
    again = list_objects(root + "a/", pattern="*.bin", manifest=str(manifest))
    assert [i.url for i in again] == first
    assert [i.size for i in again] == [1, 2]
    with pytest.raises(ConfigError):
        list(list_objects(root + "other/", manifest=str(manifest)))


# ---- listing happens once, not in every DataLoader worker ------------------------------------------
class CountingLocal(LocalBackend):
    """A local backend that records every listing in a file (shared across processes)."""

    name = "counting-local"

    def list(self, url: str) -> Iterator[ObjectInfo]:
        with open(os.environ["PIPEFLOW_TEST_LIST_LOG"], "a") as fh:
            fh.write(f"{os.getpid()}\n")
        return super().list(url)


@pytest.fixture
def counting_backend(tmp_path: Path, monkeypatch) -> Iterator[Path]:
    log = tmp_path / "lists.log"
    log.write_text("")
    monkeypatch.setenv("PIPEFLOW_TEST_LIST_LOG", str(log))
    register_backend("counting-local", f"{__name__}:CountingLocal", replace=True)
    yield log
    unregister_backend("counting-local")


@pytest.mark.parametrize("use_manifest", [False, True])
def test_dataloader_workers_do_not_relist(local_root: str, counting_backend: Path, tmp_path: Path,
                                          use_manifest: bool) -> None:
    manifest = str(tmp_path / "m.jsonl") if use_manifest else None
    pipe = list_objects(local_root + "shards/", pattern="*.bin", backend="counting-local",
                        manifest=manifest).open(read=True)
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    got = sorted(r.url for r in loader)
    assert got == _bins(local_root)  # each object exactly once across the two workers
    listers = counting_backend.read_text().split()
    assert listers == [str(os.getpid())]  # listed once, here, never in a worker


def test_an_http_url_on_the_s3_endpoint_names_the_s3_url_it_meant(s3):
    """Pasting the endpoint into the data URL is refused with the s3:// URL it names (it was
    a listing of "no objects" and an untyped aiohttp 403)."""
    bucket = s3.make_bucket("http-on-endpoint")
    s3.put(bucket, "a/1.bin", b"x")
    on_endpoint = f"{s3.endpoint}/{bucket}/a/"
    with pytest.raises(pf.InvalidURLError, match=f"name it 's3://{bucket}/a/'"):
        pf.list_objects(on_endpoint)
    with pytest.raises(pf.InvalidURLError, match=f"name it 's3://{bucket}/a/1.bin'"):
        list(pf.from_items([on_endpoint + "1.bin"]).open(read=True))


def test_an_http_error_is_typed_by_its_status(s3, monkeypatch):
    """fsspec's http:// raises aiohttp's ClientResponseError; it is translated by its status."""
    bucket = s3.make_bucket("http-status")
    s3.put(bucket, "a.bin", b"x")
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)   # a web server, not the S3 endpoint, here
    with pytest.raises(pf.AccessDeniedError) as info:   # moto refuses an unsigned GET
        list(pf.from_items([f"{s3.endpoint}/{bucket}/a.bin"]).open(read=True))
    assert info.value.backend == "fsspec" and isinstance(info.value, PermissionError)
