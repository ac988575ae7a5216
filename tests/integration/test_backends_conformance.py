"""One conformance suite that every storage backend runs.

The same objects (small, empty, ~20 MB, keys with spaces and unicode) are written once to a
local directory and once to a bucket on the local S3 server; every backend must list them in the
same order and read them byte-identically, whole, streamed, ranged, from threads and from
DataLoader workers started with fork and spawn.

Adding a backend is one line in ``BACKENDS``: ``pytest.param((name, options, where), id=name)``
with ``where`` either ``"s3"`` (objects under ``s3://bucket/``) or ``"local"`` (a directory).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch.utils.data

from pipeflow.backends import Backend, get_backend
from pipeflow.errors import ConfigError, ObjectNotFoundError

pytestmark = pytest.mark.s3

BACKENDS = [
    pytest.param(("local", {}, "local"), id="local"),
    pytest.param(("boto3", {}, "s3"), id="boto3"),
    pytest.param(("boto3", {"method": "download_fileobj"}, "s3"), id="boto3-download_fileobj"),
    pytest.param(("fsspec", {}, "s3"), id="fsspec"),
    pytest.param(("s3fs", {}, "s3"), id="s3fs"),
    pytest.param(("iopath", {}, "s3"), id="iopath"),
    pytest.param(("s3torchconnector", {}, "s3"), id="s3torchconnector"),
    pytest.param(("s3torchconnector", {"reader": "range_based"}, "s3"), id="s3torchconnector-range"),
    pytest.param(("s5cmd", {}, "s3"), id="s5cmd"),
    pytest.param(("obstore", {}, "s3"), id="obstore"),
]

BIG_KEY = "big/twenty-mb.bin"


def _objects() -> dict[str, bytes]:
    rng = random.Random(1234)
    small = {f"data/sample-{i:03d}.bin": rng.randbytes(rng.randrange(1, 40_000)) for i in range(12)}
    small.update({
        "data/empty.bin": b"",
        "data/with space/caf\u00e9 \u00fc\u00f1\u00ef.txt": "h\u00e9llo w\u00f6rld\n".encode(),
        "data/nested/deeper/\u65e5\u672c\u8a9e.bin": rng.randbytes(777),
        "data/a b.bin": b"space in the name",
    })
    return small


OBJECTS = _objects()
BIG = random.Random(99).randbytes(20 * 1024 * 1024 + 123)


@dataclass
class Store:
    """A backend and where the test objects live for it."""

    backend: Backend
    root: str  # "s3://bucket/" or "/tmp/.../"

    def url(self, key: str) -> str:
        return self.root + key

    @property
    def name(self) -> str:
        return self.backend.name


@pytest.fixture(scope="module")
def s3_data(s3) -> str:
    bucket = s3.make_bucket(f"conformance-{os.getpid()}")
    s3.put_many(bucket, OBJECTS)
    s3.put(bucket, BIG_KEY, BIG)
    return f"s3://{bucket}/"


@pytest.fixture(scope="module")
def local_data(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("conformance")
    for key, data in {**OBJECTS, BIG_KEY: BIG}.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return str(root) + os.sep


@pytest.fixture(params=BACKENDS)
def store(request, s3_data, local_data) -> Store:
    name, options, where = request.param
    backend = get_backend(name, **options)
    yield Store(backend, s3_data if where == "s3" else local_data)
    backend.close()


def _expected_urls(store: Store, prefix: str = "data/") -> list[str]:
    return sorted(store.url(k) for k in OBJECTS if k.startswith(prefix))


# ---- listing ------------------------------------------------------------------------------------
def test_list_is_sorted_complete_and_sized(store: Store) -> None:
    infos = list(store.backend.list(store.url("data/")))
    assert [i.url for i in infos] == _expected_urls(store)
    for info in infos:
        if info.size is not None:  # iopath's listing reports no sizes
            assert info.size == len(OBJECTS[info.url[len(store.root):]])


def test_list_by_partial_prefix(store: Store) -> None:
    infos = list(store.backend.list(store.url("data/sample-00")))
    expected = sorted(store.url(k) for k in OBJECTS if k.startswith("data/sample-00"))
    assert [i.url for i in infos] == expected and len(expected) == 10


def test_info(store: Store) -> None:
    key = "data/sample-003.bin"
    info = store.backend.info(store.url(key))
    assert info.url == store.url(key)
    assert info.size == len(OBJECTS[key])


# ---- reading ------------------------------------------------------------------------------------
def test_read_whole_objects_byte_identical(store: Store) -> None:
    for key, data in OBJECTS.items():
        assert store.backend.read(store.url(key)) == data, key


def test_stream_in_chunks(store: Store) -> None:
    for key, data in OBJECTS.items():
        chunks = []
        with store.backend.open(store.url(key)) as stream:
            while chunk := stream.read(4093):
                assert len(chunk) <= 4093
                chunks.append(chunk)
        assert b"".join(chunks) == data, key


def test_ranged_reads(store: Store) -> None:
    key = "data/sample-005.bin"
    data = OBJECTS[key]
    url = store.url(key)
    n = len(data)
    read = store.backend.read
    assert read(url, 0, 1) == data[:1]
    assert read(url, 10, n // 2) == data[10 : n // 2]
    assert read(url, n - 5) == data[n - 5 :]
    assert read(url, n // 3, n + 1000) == data[n // 3 :]  # an end past the object is clamped
    assert read(url, n) == b""
    assert read(url, n + 10) == b""
    assert read(url, 7, 7) == b""
    with store.backend.open(url, start=100) as stream:
        assert stream.read() == data[100:]


def test_empty_object(store: Store) -> None:
    url = store.url("data/empty.bin")
    assert store.backend.read(url) == b""
    with store.backend.open(url) as stream:
        assert stream.read() == b""
        assert stream.read(10) == b""
    assert store.backend.info(url).size == 0


def test_missing_object_is_typed_and_named(store: Store) -> None:
    url = store.url("data/does-not-exist.bin")
    for op in (lambda: store.backend.read(url), lambda: store.backend.open(url).read(),
               lambda: store.backend.info(url)):
        with pytest.raises(ObjectNotFoundError) as info:
            op()
        assert isinstance(info.value, FileNotFoundError)
        assert info.value.url == url and url in str(info.value)
        assert info.value.backend == store.name and store.name in str(info.value)


def test_large_object(store: Store) -> None:
    url = store.url(BIG_KEY)
    digest = hashlib.sha256()
    total = 0
    with store.backend.open(url) as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
            total += len(chunk)
    assert total == len(BIG)
    assert digest.digest() == hashlib.sha256(BIG).digest()
    mid = len(BIG) // 2
    assert store.backend.read(url, mid, mid + 4096) == BIG[mid : mid + 4096]


def test_concurrent_reads_from_threads(store: Store) -> None:
    keys = [k for k in OBJECTS if k.startswith("data/sample")] * 2
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda k: store.backend.read(store.url(k)), keys))
    assert results == [OBJECTS[k] for k in keys]


def test_backend_pickles_without_a_live_client(store: Store) -> None:
    store.backend.read(store.url("data/a b.bin"))  # make a client in this process
    clone = pickle.loads(pickle.dumps(store.backend))
    assert clone.options == store.backend.options
    assert clone.read(store.url("data/a b.bin")) == OBJECTS["data/a b.bin"]


# ---- DataLoader workers -------------------------------------------------------------------------
class _ReadDataset(torch.utils.data.Dataset):
    def __init__(self, backend: Backend, urls: list[str]) -> None:
        self.backend = backend
        self.urls = urls

    def __len__(self) -> int:
        return len(self.urls)

    def __getitem__(self, i: int) -> Any:
        data = self.backend.read(self.urls[i])
        return self.urls[i], hashlib.sha256(data).hexdigest(), os.getpid()


@pytest.mark.parametrize("start_method", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_dataloader_workers(store: Store, start_method: str) -> None:
    keys = [k for k in OBJECTS if k.startswith("data/sample")][:6] + ["data/empty.bin"]
    urls = [store.url(k) for k in keys]
    store.backend.read(urls[0])  # a live client in the parent: the workers must not reuse it
    loader = torch.utils.data.DataLoader(
        # spawn pays a torch import per worker: one worker shows the same thing
        _ReadDataset(store.backend, urls), batch_size=None, num_workers=2 if start_method == "fork" else 1,
        multiprocessing_context=start_method)
    if store.backend.name == "obstore" and start_method == "fork":
        # its runtime does not survive a fork: a clear error instead of a hang
        with pytest.raises(ConfigError, match="fork"):
            list(loader)
        return
    got = list(loader)
    assert [u for u, _, _ in got] == urls
    assert [h for _, h, _ in got] == [hashlib.sha256(OBJECTS[k]).hexdigest() for k in keys]
    assert os.getpid() not in {pid for _, _, pid in got}


def test_local_and_s3_agree(s3_data: str, local_data: str) -> None:
    """The acceptance criterion in one place: every backend returns the same bytes."""
    seen: dict[str, bytes] = {}
    for param in BACKENDS:
        name, options, where = param.values[0]
        backend = get_backend(name, **options)
        root = s3_data if where == "s3" else local_data
        for key in ("data/a b.bin", "data/nested/deeper/\u65e5\u672c\u8a9e.bin"):
            data = backend.read(root + key)
            assert seen.setdefault(key, data) == data, (param.id, key)
        backend.close()
    assert seen == {k: OBJECTS[k] for k in seen}


def test_local_backend_lists_file_urls(local_data: str) -> None:
    url = "file://" + str(Path(local_data).resolve()) + "/data/"
    infos = list(get_backend(url=url).list(url))
    assert [i.url for i in infos] == sorted(url + k[len("data/"):] for k in OBJECTS if k.startswith("data/"))
