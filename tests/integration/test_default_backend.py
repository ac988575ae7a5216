"""The backend ``open()`` picks when none is named, and how it falls back."""

from __future__ import annotations

import hashlib
import multiprocessing
import os

import pytest

import pipeflow as pf
from pipeflow.stages.open import OpenFn, default_backend
from pipeflow.testing.proxy import DelayProxy

pytestmark = pytest.mark.s3


def test_s3_defaults_to_obstore_when_installed_and_other_schemes_keep_theirs():
    pytest.importorskip("obstore")
    assert default_backend("s3://bucket/key") == "obstore"
    assert default_backend("/tmp/x") == "local"
    assert default_backend("file:///tmp/x") == "local"


def test_explicit_backends_still_win(s3):
    bucket = s3.make_bucket("default-explicit")
    url = s3.put(bucket, "a.bin", b"abc")
    opener = pf.from_items([url]).open("boto3", read=True)
    assert [r.data for r in opener] == [b"abc"]
    assert OpenFn("boto3", True, {}).backends.for_url(url).name == "boto3"


def _child_choice(queue) -> None:
    queue.put(default_backend("s3://bucket/key"))


def test_a_process_forked_after_obstore_was_used_falls_back_to_boto3(s3):
    pytest.importorskip("obstore")
    bucket = s3.make_bucket("default-fork")
    url = s3.put(bucket, "a.bin", b"abc")
    assert [r.data for r in pf.from_items([url]).open(read=True)] == [b"abc"]  # obstore, here
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_choice, args=(queue,))
    child.start()
    try:
        assert queue.get(timeout=60) == "boto3"
    finally:
        child.join(30)
    assert child.exitcode == 0


def test_the_default_streams_a_large_object_with_one_get_and_a_bounded_buffer(s3, s3_bucket, monkeypatch):
    """What makes the default fit large shards: one GET per object (no ranged parts, no HEAD),
    and a reader that holds a piece of the body, not the object, whatever its size."""
    pytest.importorskip("obstore")
    objects = {f"big/{i}.bin": os.urandom(1 << 20) * (12 + 4 * i) for i in range(2)}  # 12, 16 MiB
    urls = s3.put_many(s3_bucket, objects)
    with DelayProxy(s3.endpoint, delay_ms=0) as proxy:
        monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        for url, item in zip(urls, pf.from_items(urls).open(), strict=True):
            digest, peak = hashlib.sha256(), 0
            with item.stream as stream:
                while chunk := stream.read(1 << 20):
                    digest.update(chunk)
                    peak = max(peak, stream._raw.peak_buffered)
            data = objects[url.split(f"s3://{s3_bucket}/", 1)[1]]
            assert digest.hexdigest() == hashlib.sha256(data).hexdigest()
            assert 0 < peak <= 4 << 20 < len(data), peak
        counts = proxy.counts()
    assert counts.get("GET") == len(urls), counts
    assert counts.get("HEAD", 0) == 0, counts


def _credentials_from_files(monkeypatch, tmp_path, text: str) -> None:
    """No keys in the environment; ``text`` as the shared credentials file; no config file."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "credentials"
    path.write_text(text)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(path))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.mark.parametrize("how", ["default", "AWS_PROFILE", "profile="])
def test_the_default_reads_credentials_from_the_shared_files_and_profiles(s3, tmp_path, monkeypatch, how):
    """The usual laptop setup: keys in ~/.aws/credentials, maybe under a named profile. The
    default backend finds them as boto3 does (it used to try instance metadata instead and
    give up after the whole retry budget)."""
    pytest.importorskip("obstore")
    bucket = s3.make_bucket("default-creds")
    url = s3.put(bucket, "a.bin", b"abc")
    section = "default" if how == "default" else "train"
    _credentials_from_files(monkeypatch, tmp_path, f"[{section}]\naws_access_key_id = testing\n"
                                                   "aws_secret_access_key = testing\n")
    if how == "AWS_PROFILE":
        monkeypatch.setenv("AWS_PROFILE", "train")
    pipe = (pf.from_items([url]).open("obstore", read=True, profile="train") if how == "profile="
            else pf.from_items([url]).open(read=True))
    assert [r.data for r in pipe] == [b"abc"]


def test_the_default_without_any_credentials_is_access_denied_at_once(s3, tmp_path, monkeypatch):
    pytest.importorskip("obstore")
    bucket = s3.make_bucket("default-nocreds")
    url = s3.put(bucket, "a.bin", b"abc")
    _credentials_from_files(monkeypatch, tmp_path, "")
    with pytest.raises(pf.AccessDeniedError, match="no usable credentials") as info:
        list(pf.from_items([url]).open(read=True))
    assert info.value.backend == "obstore"
