"""A "not found" says which is missing, the bucket or the key, on the real local server: obstore
for reads, heads, listings and uploads alike (its NotFound says neither: a HEAD of the bucket
tells), boto3 and s3torchconnector where the store's answer tells (a GET's ``NoSuchBucket`` /
``NoSuchKey``, the CRT's "bucket" / "key does not exist"), in the same words."""

from __future__ import annotations

import importlib.util
import os

import pytest

from pipeflow.backends import get_backend
from pipeflow.backends._s3config import error_for_status
from pipeflow.errors import ObjectNotFoundError

pytestmark = pytest.mark.s3

NO_BUCKET = f"pipeflow-no-such-bucket-{os.getpid()}"
BACKENDS = [pytest.param(name, marks=pytest.mark.skipif(importlib.util.find_spec(module) is None,
                                                        reason=f"{module} is not installed"))
            for name, module in (("boto3", "boto3"), ("s3torchconnector", "s3torchconnector"))]
needs_obstore = pytest.mark.skipif(importlib.util.find_spec("obstore") is None,
                                   reason="obstore is not installed")


@pytest.fixture(scope="module")
def bucket(s3):
    name = s3.make_bucket("not-found-names")
    s3.put(name, "here.bin", b"x")
    return name


def _raised(fn) -> ObjectNotFoundError:
    with pytest.raises(ObjectNotFoundError) as info:
        fn()
    return info.value


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_missing_key_in_a_bucket_that_exists_names_the_key(s3, bucket, backend):
    url = f"s3://{bucket}/nope/x.bin"
    err = _raised(lambda: get_backend(backend).read(url))
    assert f"no such key 'nope/x.bin' in bucket '{bucket}'" in str(err), str(err)
    assert err.url == url and isinstance(err, FileNotFoundError)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_missing_bucket_names_the_bucket(s3, backend):
    url = f"s3://{NO_BUCKET}/x.bin"
    err = _raised(lambda: get_backend(backend).read(url))
    assert f"no such bucket '{NO_BUCKET}'" in str(err), str(err)
    assert "key" not in str(err).split("(", 1)[0]


@needs_obstore
@pytest.mark.parametrize("op", ["read", "open", "info"])
def test_obstore_names_a_missing_key_for_every_call(s3, bucket, op):
    backend = get_backend("obstore")
    url = f"s3://{bucket}/nope/x.bin"
    err = _raised(lambda: getattr(backend, op)(url))
    assert f"no such key 'nope/x.bin' in bucket '{bucket}'" in str(err), str(err)
    assert err.url == url and isinstance(err, FileNotFoundError)


@needs_obstore
@pytest.mark.parametrize("op", ["read", "open", "info", "list"])
def test_obstore_names_a_missing_bucket_for_every_call(s3, op):
    backend = get_backend("obstore")
    url = f"s3://{NO_BUCKET}/x.bin"
    call = (lambda: list(backend.list(url))) if op == "list" else (lambda: getattr(backend, op)(url))
    err = _raised(call)
    assert f"no such bucket '{NO_BUCKET}'" in str(err), str(err)
    assert "key" not in str(err).split("(", 1)[0]


@needs_obstore
def test_obstore_names_a_missing_bucket_of_an_upload(s3, tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"abc")
    err = _raised(lambda: get_backend("obstore").upload(str(path), f"s3://{NO_BUCKET}/a.bin"))
    assert f"no such bucket '{NO_BUCKET}'" in str(err), str(err)


@pytest.mark.parametrize(("status", "code", "url", "says"), [
    (404, "", "s3://b/k", "no such object or bucket (404)"),          # a HEAD's bare 404 tells neither
    (404, "NoSuchKey", "s3://b/", "no such object or bucket (NoSuchKey)"),  # no key in the URL to name
    (404, "NoSuchBucket", "http://host/b/k", "no such object or bucket (NoSuchBucket)"),  # not s3://
    (404, "NoSuchBucket", "s3://My_Bucket/k", "no such bucket 'My_Bucket'; 'My_Bucket' is not a valid"),
])
def test_where_the_answer_names_neither_the_message_says_either(status, code, url, says):
    err = error_for_status(status, code, url=url, backend="boto3", op="read")
    assert isinstance(err, ObjectNotFoundError) and str(err).startswith(says), str(err)
