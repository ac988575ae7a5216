"""obstore's "not found" says which is missing: the bucket or the key (a HEAD of the bucket
tells, on the real local server), for reads, heads, listings and uploads alike."""

from __future__ import annotations

import os

import pytest

from pipeflow.backends import get_backend
from pipeflow.errors import ObjectNotFoundError

pytest.importorskip("obstore")
pytestmark = pytest.mark.s3

NO_BUCKET = f"pipeflow-no-such-bucket-{os.getpid()}"


@pytest.fixture(scope="module")
def bucket(s3):
    name = s3.make_bucket("obstore-not-found")
    s3.put(name, "here.bin", b"x")
    return name


def _raised(fn) -> ObjectNotFoundError:
    with pytest.raises(ObjectNotFoundError) as info:
        fn()
    return info.value


@pytest.mark.parametrize("op", ["read", "open", "info"])
def test_a_missing_key_in_a_bucket_that_exists_names_the_key(s3, bucket, op):
    backend = get_backend("obstore")
    url = f"s3://{bucket}/nope/x.bin"
    err = _raised(lambda: getattr(backend, op)(url))
    assert f"no such key 'nope/x.bin' in bucket '{bucket}'" in str(err), str(err)
    assert err.url == url and isinstance(err, FileNotFoundError)


@pytest.mark.parametrize("op", ["read", "open", "info", "list"])
def test_a_missing_bucket_names_the_bucket(s3, op):
    backend = get_backend("obstore")
    url = f"s3://{NO_BUCKET}/x.bin"
    call = (lambda: list(backend.list(url))) if op == "list" else (lambda: getattr(backend, op)(url))
    err = _raised(call)
    assert f"no such bucket '{NO_BUCKET}'" in str(err), str(err)
    assert "key" not in str(err).split("(", 1)[0]


def test_an_upload_to_a_missing_bucket_names_the_bucket(s3, tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"abc")
    err = _raised(lambda: get_backend("obstore").upload(str(path), f"s3://{NO_BUCKET}/a.bin"))
    assert f"no such bucket '{NO_BUCKET}'" in str(err), str(err)
