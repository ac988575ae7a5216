"""Every backend runs the conformance suite that ships with pipeflow.

The suite is :mod:`pipeflow.testing.conformance`, the same one a third-party backend subclasses;
here each built-in backend is one subclass, reading the suite's objects from a bucket on the local
S3 server or from a local directory. ``TestThirdPartyDirBackend`` plays the user: a small backend
defined in this file, registered with ``register_backend`` under its own scheme, passes it too.

Adding a backend is one subclass (and one line in ``BACKENDS`` for the cross-backend check).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from pipeflow.backends import Backend, get_backend, register_backend, unregister_backend
from pipeflow.backends.base import BackendOptions
from pipeflow.errors import ObjectNotFoundError
from pipeflow.items import ObjectInfo
from pipeflow.testing.conformance import OBJECTS, BackendConformance, put_objects, write_objects

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def s3_data(s3) -> str:
    return put_objects(s3, f"conformance-{os.getpid()}")


@pytest.fixture(scope="module")
def local_data(tmp_path_factory) -> str:
    return write_objects(tmp_path_factory.mktemp("conformance"))


class _OnS3:
    @pytest.fixture
    def root(self, s3_data: str) -> str:
        return s3_data


class _OnDisk:
    @pytest.fixture
    def root(self, local_data: str) -> str:
        return local_data


class TestLocal(_OnDisk, BackendConformance):
    backend_name = "local"


class TestBoto3(_OnS3, BackendConformance):
    backend_name = "boto3"


class TestBoto3DownloadFileobj(_OnS3, BackendConformance):
    backend_name = "boto3"
    backend_options = {"method": "download_fileobj"}


class TestFsspec(_OnS3, BackendConformance):
    backend_name = "fsspec"


class TestS3fs(_OnS3, BackendConformance):
    backend_name = "s3fs"


class TestIopath(_OnS3, BackendConformance):
    backend_name = "iopath"


class TestS3TorchConnector(_OnS3, BackendConformance):
    backend_name = "s3torchconnector"


class TestS3TorchConnectorRangeBased(_OnS3, BackendConformance):
    backend_name = "s3torchconnector"
    backend_options = {"reader": "range_based"}


class TestS5cmd(_OnS3, BackendConformance):
    backend_name = "s5cmd"


class TestObstore(_OnS3, BackendConformance):
    backend_name = "obstore"
    fork_safe = False  # its runtime does not survive a fork: a clear error instead of a hang


# ---- a third-party backend, as a user would write and test one ---------------------------------------
class DirBackend(Backend):
    """``dir:///path``: a deliberately small backend outside pipeflow's own modules."""

    name = "dirtest"
    Options = BackendOptions

    @staticmethod
    def _path(url: str) -> str:
        return url[len("dir://"):]

    def list(self, url: str) -> Iterator[ObjectInfo]:
        path = self._path(url)
        base = path if os.path.isdir(path) else os.path.dirname(path)
        found = []
        for dirpath, _, files in os.walk(base):
            found += [os.path.join(dirpath, f) for f in files if os.path.join(dirpath, f).startswith(path)]
        for full in sorted(found):
            yield ObjectInfo(url="dir://" + full, size=os.path.getsize(full))

    def open(self, url: str, *, start: int = 0) -> IO[bytes]:
        try:
            f = open(self._path(url), "rb")  # noqa: SIM115 - the caller closes it
        except FileNotFoundError as exc:
            raise ObjectNotFoundError("no such file", url=url, backend=self.name, op="open") from exc
        f.seek(start)
        return f

    def info(self, url: str) -> ObjectInfo:
        try:
            return ObjectInfo(url=url, size=os.path.getsize(self._path(url)))
        except FileNotFoundError as exc:
            raise ObjectNotFoundError("no such file", url=url, backend=self.name, op="info") from exc


@pytest.fixture(scope="module")
def dirtest_registered() -> Iterator[None]:
    register_backend("dirtest", f"{__name__}:DirBackend", schemes=("dir",), description="test only")
    yield
    unregister_backend("dirtest")


class TestThirdPartyDirBackend(BackendConformance):
    backend_name = "dirtest"

    @pytest.fixture
    def root(self, local_data: str, dirtest_registered: None) -> str:
        return "dir://" + local_data


# ---- across backends ------------------------------------------------------------------------------
BACKENDS = [
    (cls.backend_name, cls.backend_options, "local" if issubclass(cls, _OnDisk) else "s3")
    for cls in (TestLocal, TestBoto3, TestBoto3DownloadFileobj, TestFsspec, TestS3fs, TestIopath,
                TestS3TorchConnector, TestS3TorchConnectorRangeBased, TestS5cmd, TestObstore)
]


def test_local_and_s3_agree(s3_data: str, local_data: str) -> None:
    """The acceptance criterion in one place: every backend returns the same bytes."""
    seen: dict[str, bytes] = {}
    for name, options, where in BACKENDS:
        backend = get_backend(name, **options)
        root = s3_data if where == "s3" else local_data
        for key in ("data/a b.bin", "data/nested/deeper/\u65e5\u672c\u8a9e.bin"):
            data = backend.read(root + key)
            assert seen.setdefault(key, data) == data, (name, options, key)
        backend.close()
    assert seen == {k: OBJECTS[k] for k in seen}


def test_local_backend_lists_file_urls(local_data: str) -> None:
    url = "file://" + str(Path(local_data).resolve()) + "/data/"
    infos = list(get_backend(url=url).list(url))
    assert [i.url for i in infos] == sorted(url + k[len("data/"):] for k in OBJECTS if k.startswith("data/"))

