"""The backend ``open()`` picks when none is named, and how it falls back."""

from __future__ import annotations

import multiprocessing

import pytest

import pipeflow as pf
from pipeflow.stages.open import OpenFn, default_backend

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
