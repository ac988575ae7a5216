"""The pipe backend: s5cmd/cat commands against the local S3 server, process hygiene."""

from __future__ import annotations

import gc
import os

import psutil
import pytest

from pipeflow.backends import get_backend
from pipeflow.backends.s5cmd import find_s5cmd
from pipeflow.errors import CommandError, ConfigError

KEYS = ["plain.bin", "with space/and 'quote'.bin", "-leading-dash", "glob*[x]?.bin", "ünï.bin"]


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture
def objects(s3, s3_bucket) -> dict[str, bytes]:
    out = {}
    for i, key in enumerate(KEYS):
        body = os.urandom(1000 * (i + 1))
        out[s3.put(s3_bucket, key, body)] = body
    return out


def test_s5cmd_cat_template_reads_byte_identical(s3, objects):
    backend = get_backend("pipe", allow_pipe=True,
                          command=[find_s5cmd(), "--endpoint-url", s3.endpoint, "cat", "--raw", "{url}"])
    before = _children()
    for url, body in objects.items():
        assert backend.read(url) == body
        assert backend.read(url, 10, 20) == body[10:20]
    assert _children() <= before


def test_webdataset_style_pipe_urls(s3, objects, monkeypatch):
    monkeypatch.setenv("PIPEFLOW_ALLOW_PIPE", "1")
    backend = get_backend("pipe")
    url, body = next(iter(objects.items()))
    assert backend.read(f"pipe:{find_s5cmd()} --endpoint-url {s3.endpoint} cat {url}") == body


def test_missing_object_raises_command_error(s3, s3_bucket):
    backend = get_backend("pipe", allow_pipe=True,
                          command=[find_s5cmd(), "--endpoint-url", s3.endpoint, "cat", "{url}"])
    url = f"s3://{s3_bucket}/missing"
    with pytest.raises(CommandError) as info:
        backend.open(url)
    assert info.value.url == url and info.value.returncode == 1 and "not found" in info.value.stderr


def test_failure_after_some_output_is_not_a_clean_end():
    backend = get_backend("pipe", allow_pipe=True)
    with backend.open("pipe:sh -c 'head -c 200000 /dev/zero; exit 4'") as stream:
        with pytest.raises(CommandError) as info:
            while stream.read(65536):
                pass
    assert info.value.returncode == 4


def test_early_close_kills_the_whole_process_group():
    backend = get_backend("pipe", allow_pipe=True)
    before = _children()
    # the command forks a helper that would outlive a plain kill of its parent
    stream = backend.open("pipe:sh -c 'sleep 60 & exec yes'")
    assert stream.read(1000) == b"y\n" * 500
    spawned = [psutil.Process(pid) for pid in _children() - before]
    assert spawned
    stream.close()
    gone, alive = psutil.wait_procs(spawned, timeout=10)
    assert not alive
    assert _children() <= before


def test_garbage_collected_stream_leaves_no_process():
    backend = get_backend("pipe", allow_pipe=True)
    before = _children()
    stream = backend.open("pipe:yes")
    stream.read(10)
    del stream
    gc.collect()
    assert _children() <= before


def test_info_counts_bytes_and_list_is_refused(objects):
    backend = get_backend("pipe", allow_pipe=True, command="cat {url}")
    path = os.path.join(os.path.dirname(__file__), "__init__.py")
    assert backend.info(path).size == os.path.getsize(path)
    with pytest.raises(ConfigError, match="cannot list"):
        list(backend.list("s3://bucket/"))
