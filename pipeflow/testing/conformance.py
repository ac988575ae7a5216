"""The backend conformance suite, for pipeflow's own backends and for yours.

Every built-in backend passes these tests; a backend you register with
:func:`pipeflow.backends.register_backend` can run the very same ones. Subclass
:class:`BackendConformance` in a pytest module, name the backend, and provide a ``root`` fixture:
a URL prefix under which the suite's objects (:data:`OBJECTS` and :data:`BIG`) exist. The
suite only reads; :func:`write_objects` puts the objects into a local directory and
:func:`put_objects` into a bucket of the local S3 server (:func:`pipeflow.testing.local_s3`);
for any other store, upload :func:`all_objects` yourself::

    import pytest
    from pipeflow.testing.conformance import BackendConformance, write_objects

    class TestMyBackend(BackendConformance):
        backend_name = "mystore"            # as registered with register_backend
        backend_options = {"token": "..."}  # keyword options for get_backend

        @pytest.fixture(scope="class")
        def root(self, tmp_path_factory):
            return "mystore://" + write_objects(tmp_path_factory.mktemp("objects"))

The tests cover listing (sorted, complete, sized, by partial prefix), ``info``, whole, streamed,
ranged and empty reads, a 20 MB object, missing objects (and buckets) as
:class:`~pipeflow.errors.ObjectNotFoundError` naming the URL and the backend, malformed URLs
(``s3:/bucket/key``) refused with a hint, reads from
threads, pickling without a live client, DataLoader workers started with fork and spawn (when
torch is installed), and the batched-download capability (``start_batch``).

Requires pytest (``pip install -e '.[test]'``).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import random
import traceback
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import pytest

from ..backends import Backend, get_backend
from ..backends.base import REMOTE_SCHEMES
from ..backends.batch import BatchDownloader, BatchHandle
from ..errors import ConfigError, InvalidURLError, ObjectNotFoundError

__all__ = ["BIG", "BIG_KEY", "OBJECTS", "BackendConformance", "all_objects", "put_objects",
           "write_objects"]

#: the key of the large object
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


#: the small objects, by key (relative to ``root``): random sizes, empty, spaces and unicode
OBJECTS: Mapping[str, bytes] = _objects()
#: the large object's bytes (20 MiB and a bit)
BIG: bytes = random.Random(99).randbytes(20 * 1024 * 1024 + 123)


def all_objects() -> dict[str, bytes]:
    """Every object the suite expects under ``root``, by key."""
    return {**OBJECTS, BIG_KEY: BIG}


def write_objects(directory: str | os.PathLike[str]) -> str:
    """Write the objects under ``directory``; returns it as a root ending in the separator."""
    root = os.fspath(directory)
    for key, data in all_objects().items():
        path = os.path.join(root, *key.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return root.rstrip(os.sep) + os.sep


def put_objects(server: Any, bucket: str) -> str:
    """Upload the objects to ``bucket`` of a :class:`~pipeflow.testing.LocalS3` server (created
    if missing); returns ``"s3://bucket/"``."""
    server.make_bucket(bucket)
    server.put_many(bucket, all_objects())
    return f"s3://{bucket}/"


class _ReadDataset:
    """A map-style dataset (DataLoader needs only ``__len__``/``__getitem__``); module level so
    that workers started with spawn can unpickle it."""

    def __init__(self, backend: Backend, urls: list[str]) -> None:
        self.backend = backend
        self.urls = urls

    def __len__(self) -> int:
        return len(self.urls)

    def __getitem__(self, i: int) -> Any:
        data = self.backend.read(self.urls[i])
        return self.urls[i], hashlib.sha256(data).hexdigest(), os.getpid()


class BackendConformance:
    """The suite. Subclass it (as ``TestSomething``) and provide ``root``; see the module docs.

    Attributes:
        backend_name: the registered backend name.
        backend_options: keyword options passed to :func:`~pipeflow.backends.get_backend`.
        fork_safe: False for a backend whose client cannot work in a process forked after it
            was used (some native runtimes): the suite then expects a clear
            :class:`~pipeflow.errors.ConfigError` mentioning fork in forked DataLoader workers
            instead of data, never a hang.
    """

    backend_name: ClassVar[str] = ""
    backend_options: ClassVar[dict[str, Any]] = {}
    fork_safe: ClassVar[bool] = True

    @pytest.fixture
    def root(self) -> str:
        """A URL prefix ending in ``/`` (or the path separator) under which the objects exist."""
        raise NotImplementedError("a BackendConformance subclass must provide a `root` fixture")

    @pytest.fixture
    def backend(self) -> Iterator[Backend]:
        if not self.backend_name:
            raise NotImplementedError("a BackendConformance subclass must set backend_name")
        backend = get_backend(self.backend_name, **self.backend_options)
        yield backend
        backend.close()

    # ---- listing ----------------------------------------------------------------------------
    def test_list_is_sorted_complete_and_sized(self, backend: Backend, root: str) -> None:
        infos = list(backend.list(root + "data/"))
        assert [i.url for i in infos] == sorted(root + k for k in OBJECTS if k.startswith("data/"))
        for info in infos:
            if info.size is not None:  # a backend whose listing has no sizes reports None
                assert info.size == len(OBJECTS[info.url[len(root):]])

    def test_list_by_partial_prefix(self, backend: Backend, root: str) -> None:
        infos = list(backend.list(root + "data/sample-00"))
        expected = sorted(root + k for k in OBJECTS if k.startswith("data/sample-00"))
        assert [i.url for i in infos] == expected and len(expected) == 10

    def test_info(self, backend: Backend, root: str) -> None:
        key = "data/sample-003.bin"
        info = backend.info(root + key)
        assert info.url == root + key
        assert info.size == len(OBJECTS[key])

    # ---- reading ----------------------------------------------------------------------------
    def test_read_whole_objects_byte_identical(self, backend: Backend, root: str) -> None:
        for key, data in OBJECTS.items():
            assert backend.read(root + key) == data, key

    def test_stream_in_chunks(self, backend: Backend, root: str) -> None:
        for key, data in OBJECTS.items():
            chunks = []
            with backend.open(root + key) as stream:
                while chunk := stream.read(4093):
                    assert len(chunk) <= 4093
                    chunks.append(chunk)
            assert b"".join(chunks) == data, key

    def test_ranged_reads(self, backend: Backend, root: str) -> None:
        data = OBJECTS["data/sample-005.bin"]
        url = root + "data/sample-005.bin"
        n = len(data)
        read = backend.read
        assert read(url, 0, 1) == data[:1]
        assert read(url, 10, n // 2) == data[10 : n // 2]
        assert read(url, n - 5) == data[n - 5 :]
        assert read(url, n // 3, n + 1000) == data[n // 3 :]  # an end past the object is clamped
        assert read(url, n) == b""
        assert read(url, n + 10) == b""
        assert read(url, 7, 7) == b""
        with backend.open(url, start=100) as stream:
            assert stream.read() == data[100:]

    def test_empty_object(self, backend: Backend, root: str) -> None:
        url = root + "data/empty.bin"
        assert backend.read(url) == b""
        # a range of an empty object is clamped as a slice is (S3 answers such a range with 416)
        assert backend.read(url, 0, 1) == b"" and backend.read(url, 0, 100) == b""
        assert backend.read(url, 3, 9) == b""
        with backend.open(url) as stream:
            assert stream.read() == b""
            assert stream.read(10) == b""
        assert backend.info(url).size == 0

    def test_missing_object_is_typed_and_named(self, backend: Backend, root: str) -> None:
        url = root + "data/does-not-exist.bin"
        for op in (lambda: backend.read(url), lambda: backend.open(url).read(),
                   lambda: backend.info(url)):
            with pytest.raises(ObjectNotFoundError) as info:
                op()
            assert isinstance(info.value, FileNotFoundError)
            assert info.value.url == url and url in str(info.value)
            assert info.value.backend == backend.name and backend.name in str(info.value)

    def test_missing_bucket_is_typed(self, backend: Backend, root: str) -> None:
        """A root on an object store: a bucket that does not exist is ObjectNotFoundError in
        listing and open alike (``except FileNotFoundError`` catches it)."""
        scheme, sep, rest = root.partition("://")
        if scheme not in REMOTE_SCHEMES:
            pytest.skip("the root is not in a bucket of an object store")
        url = f"{scheme}://pipeflow-no-such-bucket-{os.getpid()}/{rest.partition('/')[2]}data/x.bin"
        for op in (lambda: list(backend.list(url)), lambda: backend.open(url).read()):
            with pytest.raises(ObjectNotFoundError) as info:
                op()
            assert info.value.backend == backend.name

    def test_malformed_url_is_refused_with_a_hint(self, backend: Backend, root: str) -> None:
        """``s3:/bucket/key`` (one slash) is a typo, never a relative local path: refused
        before any I/O with the URL it probably meant."""
        scheme, sep, rest = root.partition("://")
        if not sep or scheme == "file":
            scheme, rest = "s3", "bucket/"  # a local backend must not read it as a relative path
        elif scheme not in REMOTE_SCHEMES:
            pytest.skip("a scheme of its own: what a typo in it means is the backend's business")
        url = f"{scheme}:/{rest}data/a b.bin"
        for op in (lambda: backend.read(url), lambda: list(backend.list(url)), lambda: backend.info(url)):
            with pytest.raises(InvalidURLError) as info:
                op()
            assert f"did you mean '{scheme}://{rest}data/a b.bin'" in str(info.value)

    def test_a_bucket_url_is_not_an_object(self, backend: Backend, root: str) -> None:
        """``s3://bucket`` names no object: open, read and info refuse it before any request
        (S3 answers a GET of the bucket with a listing, which must never pass for data)."""
        scheme, sep, rest = root.partition("://")
        if scheme not in REMOTE_SCHEMES or scheme in ("http", "https", "hf"):
            pytest.skip("the root is not in a bucket of an object store")
        bucket = rest.partition("/")[0]
        for url in (f"{scheme}://{bucket}", f"{scheme}://{bucket}/"):
            for op in (backend.read, lambda u: backend.open(u).read(), backend.info):
                with pytest.raises(InvalidURLError, match="names a bucket, not an object"):
                    op(url)

    def test_large_object(self, backend: Backend, root: str) -> None:
        url = root + BIG_KEY
        digest = hashlib.sha256()
        total = 0
        with backend.open(url) as stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)
                total += len(chunk)
        assert total == len(BIG)
        assert digest.digest() == hashlib.sha256(BIG).digest()
        mid = len(BIG) // 2
        assert backend.read(url, mid, mid + 4096) == BIG[mid : mid + 4096]

    def test_concurrent_reads_from_threads(self, backend: Backend, root: str) -> None:
        keys = [k for k in OBJECTS if k.startswith("data/sample")] * 2
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda k: backend.read(root + k), keys))
        assert results == [OBJECTS[k] for k in keys]

    def test_backend_pickles_without_a_live_client(self, backend: Backend, root: str) -> None:
        backend.read(root + "data/a b.bin")  # make a client in this process
        clone = pickle.loads(pickle.dumps(backend))
        assert clone.options == backend.options
        assert clone.read(root + "data/a b.bin") == OBJECTS["data/a b.bin"]

    # ---- capabilities -----------------------------------------------------------------------
    def test_batch_download(self, backend: Backend, root: str, tmp_path: Any) -> None:
        assert isinstance(backend, BatchDownloader)
        keys = [k for k in OBJECTS if k.startswith("data/sample")][:5] + ["data/empty.bin"]
        pairs = [(root + k, str(tmp_path / f"{i:03d}.bin")) for i, k in enumerate(keys)]
        missing = (root + "data/does-not-exist.bin", str(tmp_path / "missing.bin"))
        handle = backend.start_batch([*pairs, missing], workdir=str(tmp_path), workers=3)
        assert isinstance(handle, BatchHandle)
        try:
            results = handle.wait(120)
        finally:
            handle.cancel()
        for (url, dest), key in zip(pairs, keys, strict=True):
            assert results[dest] is None, (url, results[dest])
            with open(dest, "rb") as f:
                assert f.read() == OBJECTS[key], key
        assert isinstance(results[missing[1]], ObjectNotFoundError)
        assert not os.path.exists(missing[1])

    # ---- DataLoader workers -----------------------------------------------------------------
    @pytest.mark.parametrize("start_method", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
    def test_dataloader_workers(self, backend: Backend, root: str, start_method: str) -> None:
        torch_data = pytest.importorskip("torch.utils.data")
        keys = [k for k in OBJECTS if k.startswith("data/sample")][:6] + ["data/empty.bin"]
        urls = [root + k for k in keys]
        backend.read(urls[0])  # a live client in the parent: the workers must not reuse it
        loader = torch_data.DataLoader(
            # spawn pays a torch import per worker: one worker shows the same thing
            _ReadDataset(backend, urls), batch_size=None, num_workers=2 if start_method == "fork" else 1,
            multiprocessing_context=start_method)
        if start_method == "fork" and not self.fork_safe:
            with pytest.raises(ConfigError, match="fork") as refused:
                list(loader)
            # free the failed DataLoader now: left in the error's reference cycle, a later test's
            # garbage collection waits torch's 5 s join timeout for each of its workers
            traceback.clear_frames(refused.tb)
            return
        got = list(loader)
        assert [u for u, _, _ in got] == urls
        assert [h for _, h, _ in got] == [hashlib.sha256(OBJECTS[k]).hexdigest() for k in keys]
        assert os.getpid() not in {pid for _, _, pid in got}
