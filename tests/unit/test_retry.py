"""Retry classification, backoff and mid-body resumption, against a real flaky HTTP server."""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import io
import random
import threading
from collections.abc import Iterator

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from pipeflow.backends._resumable import ResumableStream
from pipeflow.backends._retry import RetryPolicy, is_transient, retry_call
from pipeflow.errors import ConfigError, ObjectNotFoundError, RetryExhaustedError

FAST = RetryPolicy(max_attempts=4, base_delay=0.001, max_delay=0.002, max_resumes=50)


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "whatever text"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")


# ---- classification -----------------------------------------------------------------------------
@pytest.mark.parametrize("exc", [
    ConnectionResetError(), TimeoutError(), http.client.IncompleteRead(b"x", 10),
    _client_error("SlowDown", 503), _client_error("InternalError", 500), _client_error("Throttling", 400),
    _client_error("TooManyRequestsException", 429), _client_error("Whatever", 502),
    EndpointConnectionError(endpoint_url="http://x"), ReadTimeoutError(endpoint_url="http://x"),
])
def test_transient(exc: BaseException) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize("exc", [
    _client_error("NoSuchKey", 404), _client_error("AccessDenied", 403), ValueError("x"),
    ObjectNotFoundError("gone", url="s3://b/k"), KeyError("k"),
])
def test_permanent(exc: BaseException) -> None:
    assert not is_transient(exc)


def test_classification_follows_the_cause_chain() -> None:
    try:
        try:
            raise ConnectionResetError("peer reset")
        except ConnectionResetError as inner:
            raise OSError("wrapped by an SDK") from inner
    except OSError as outer:
        assert is_transient(outer)


def test_message_text_is_never_used() -> None:
    assert not is_transient(ValueError("SlowDown: 503 connection reset by peer, read timeout"))


# ---- policy and retry_call ----------------------------------------------------------------------
def test_policy_validation() -> None:
    with pytest.raises(ConfigError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ConfigError):
        RetryPolicy(base_delay=-1)


def test_backoff_is_full_jitter_and_capped() -> None:
    policy = RetryPolicy(base_delay=0.1, max_delay=1.0)
    for attempt in range(12):
        cap = min(1.0, 0.1 * 2 ** attempt)
        delays = [policy.backoff(attempt) for _ in range(50)]
        assert all(0.0 <= d <= cap for d in delays)
        assert len(set(delays)) > 1  # jittered, not a fixed schedule


def test_retry_call_recovers_from_transient_failures() -> None:
    calls, sleeps = [], []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise _client_error("SlowDown", 503)
        return "ok"

    assert retry_call(flaky, policy=FAST, sleep=sleeps.append) == "ok"
    assert len(calls) == 3 and len(sleeps) == 2


def test_retry_call_gives_up_with_a_typed_error() -> None:
    calls = []

    def always() -> None:
        calls.append(1)
        raise ConnectionResetError("reset")

    with pytest.raises(RetryExhaustedError) as info:
        retry_call(always, policy=FAST, url="s3://b/k", backend="boto3", op="open", sleep=lambda s: None)
    assert len(calls) == FAST.max_attempts
    assert isinstance(info.value.__cause__, ConnectionResetError)
    assert info.value.url == "s3://b/k" and info.value.backend == "boto3"


def test_retry_call_does_not_retry_permanent_errors() -> None:
    calls = []

    def missing() -> None:
        calls.append(1)
        raise _client_error("NoSuchKey", 404)

    with pytest.raises(ClientError):
        retry_call(missing, policy=FAST, sleep=lambda s: None)
    assert len(calls) == 1


# ---- resumable streams: a fake flaky body --------------------------------------------------------
class _Breaking(io.RawIOBase):
    """Delivers data from ``offset`` and breaks after ``budget`` bytes."""

    def __init__(self, data: bytes, offset: int, budget: int) -> None:
        self._data, self._pos, self._budget = data, offset, budget

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:  # type: ignore[override]
        if self._budget <= 0 and self._pos < len(self._data):
            raise ConnectionResetError("connection reset mid-body")
        n = min(len(buf), len(self._data) - self._pos, max(self._budget, 0))
        buf[:n] = self._data[self._pos : self._pos + n]
        self._pos += n
        self._budget -= n
        return n


def test_resumable_stream_resumes_from_the_delivered_offset() -> None:
    data = random.Random(0).randbytes(100_000)
    offsets: list[int] = []

    def opener(offset: int) -> io.RawIOBase:
        offsets.append(offset)
        return _Breaking(data, offset, 7_000)

    stream = ResumableStream(opener, size=len(data), policy=FAST, sleep=lambda s: None)
    got = b"".join(iter(lambda: stream.read(3_000), b""))
    assert got == data
    assert offsets[0] == 0 and offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert all(b - a == 7_000 for a, b in zip(offsets, offsets[1:], strict=False))
    assert stream.resumes == len(offsets) - 1


def test_resumable_stream_read_all_and_start_offset() -> None:
    data = random.Random(1).randbytes(50_000)
    stream = ResumableStream(lambda off: _Breaking(data, off, 9_999), start=123, size=len(data),
                             policy=FAST, sleep=lambda s: None)
    assert stream.read() == data[123:]
    assert stream.tell() == len(data)


def test_resumable_stream_budget_is_bounded() -> None:
    data = b"x" * 1000
    stream = ResumableStream(lambda off: _Breaking(data, off, 0), size=len(data), url="s3://b/k",
                             backend="fake", policy=FAST, sleep=lambda s: None)
    with pytest.raises(RetryExhaustedError) as info:
        stream.read()
    assert info.value.url == "s3://b/k" and info.value.op == "read"


def test_resumable_stream_passes_permanent_errors_through_translated() -> None:
    def opener(offset: int) -> io.RawIOBase:
        raise KeyError("gone")

    stream = ResumableStream(opener, policy=FAST, sleep=lambda s: None,
                             translate=lambda exc: ObjectNotFoundError("gone", url="u", backend="fake"))
    with pytest.raises(ObjectNotFoundError):
        stream.read(10)


# ---- resumable streams: a real HTTP server that drops connections ---------------------------------
class _FlakyHandler(http.server.BaseHTTPRequestHandler):
    data = b""
    cut_after = 0  # bytes sent before the connection is dropped
    drops_left = 0
    requests: list[int] = []

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        cls = type(self)
        rng = self.headers.get("Range", "bytes=0-")
        start = int(rng.split("=")[1].split("-")[0])
        cls.requests.append(start)
        body = cls.data[start:]
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if cls.drops_left > 0:
            cls.drops_left -= 1
            self.wfile.write(body[: cls.cut_after])
            self.wfile.flush()
            self.close_connection = True
            return  # the client sees the body end early: IncompleteRead
        self.wfile.write(body)


@pytest.fixture
def flaky_server() -> Iterator[tuple[type[_FlakyHandler], int]]:
    handler = type("Handler", (_FlakyHandler,), {"requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield handler, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _http_opener(port: int):
    def opener(offset: int):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/obj", headers={"Range": f"bytes={offset}-"})
        return conn.getresponse()
    return opener


def test_http_body_cut_off_is_resumed_with_ranged_gets(flaky_server) -> None:
    handler, port = flaky_server
    handler.data = random.Random(2).randbytes(300_000)
    handler.cut_after = 64_000
    handler.drops_left = 3
    stream = ResumableStream(_http_opener(port), size=len(handler.data), policy=FAST,
                             url="http://x/obj", backend="http")
    assert stream.read() == handler.data
    assert stream.resumes == 3
    # each retry asked only for the bytes not yet delivered
    assert handler.requests == [0, 64_000, 128_000, 192_000]
    stream.close()


def test_http_persistent_failure_exhausts_the_budget(flaky_server) -> None:
    handler, port = flaky_server
    handler.data = b"y" * 10_000
    handler.cut_after = 0
    handler.drops_left = 10**6
    stream = ResumableStream(_http_opener(port), size=len(handler.data), policy=FAST)
    with pytest.raises(RetryExhaustedError):
        stream.read()
    assert len(handler.requests) == FAST.max_attempts


# ---- the time budget ------------------------------------------------------------------------------
class _Clock:
    """A fake monotonic clock that advances only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_default_policy_is_a_time_budget() -> None:
    policy = RetryPolicy()
    assert policy.budget == 60.0 and policy.max_attempts is None
    assert policy.max_delay <= 5.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.budget = 1.0  # type: ignore[misc]


def test_retry_call_keeps_trying_for_the_whole_budget_then_names_url_and_endpoint() -> None:
    clock = _Clock()
    calls = []

    def down() -> None:
        calls.append(clock.now)
        raise _client_error("SlowDown", 503)

    policy = RetryPolicy(budget=10.0, base_delay=0.1, max_delay=2.0)
    with pytest.raises(RetryExhaustedError) as info:
        retry_call(down, policy=policy, url="s3://b/k", backend="boto3", op="open",
                   endpoint="http://127.0.0.1:9", sleep=clock.sleep, clock=clock)
    # never a sleep past the budget, never a delay over max_delay, and the budget was used up
    assert all(0 <= s <= 2.0 for s in clock.sleeps)
    assert clock.now == pytest.approx(10.0) and calls[-1] == pytest.approx(10.0)
    assert len(calls) > 8  # many more tries than the old fixed count of five fit in 10 s
    assert "s3://b/k" in str(info.value) and "http://127.0.0.1:9" in str(info.value)
    assert isinstance(info.value.__cause__, ClientError)


def test_a_recovery_within_the_budget_succeeds() -> None:
    clock = _Clock()

    def outage_of_seven_seconds() -> str:
        if clock.now < 7.0:
            raise ConnectionResetError("down")
        return "ok"

    assert retry_call(outage_of_seven_seconds, policy=RetryPolicy(budget=60.0), sleep=clock.sleep,
                      clock=clock) == "ok"
    assert 7.0 <= clock.now < 7.0 + RetryPolicy().max_delay


def test_max_attempts_and_budget_both_bound() -> None:
    clock = _Clock()
    calls = []

    def down() -> None:
        calls.append(1)
        raise ConnectionResetError

    with pytest.raises(RetryExhaustedError):
        retry_call(down, policy=RetryPolicy(budget=100.0, max_attempts=3), sleep=clock.sleep, clock=clock)
    assert len(calls) == 3


def test_stream_progress_starts_a_fresh_budget() -> None:
    # a body that breaks every 1000 bytes, and each resumption takes 4 s of a 5 s budget: a
    # per-stream budget would give up, a per-stretch-without-progress budget must not
    clock = _Clock()
    data = random.Random(3).randbytes(20_000)

    def opener(offset: int) -> io.RawIOBase:
        clock.now += 4.0
        return _Breaking(data, offset, 1000)

    stream = ResumableStream(opener, size=len(data), policy=RetryPolicy(budget=5.0, base_delay=0.01),
                             sleep=clock.sleep, clock=clock)
    assert stream.read() == data
    assert stream.resumes == 19


@pytest.mark.parametrize("value,expected", [
    (2, RetryPolicy(max_attempts=3)),
    (0, RetryPolicy(max_attempts=1)),
    ({"budget": 5, "max_delay": 1}, RetryPolicy(budget=5, max_delay=1)),
    (RetryPolicy(budget=1), RetryPolicy(budget=1)),
])
def test_retry_option_forms(value, expected) -> None:
    assert RetryPolicy.coerce(value) == expected


@pytest.mark.parametrize("value", [True, -1, 2.5, "3", {"attempts": 3}, {"budget": -1}, None])
def test_retry_option_refused(value) -> None:
    with pytest.raises(ConfigError):
        RetryPolicy.coerce(value)


def test_policy_needs_some_bound() -> None:
    with pytest.raises(ConfigError, match="budget"):
        RetryPolicy(budget=None)
    assert RetryPolicy(budget=None, max_attempts=4).max_attempts == 4
    with pytest.raises(TypeError):
        RetryPolicy(5)  # type: ignore[misc]  # keyword-only: a bare number is ambiguous


def test_backends_take_the_retry_option_in_every_form() -> None:
    from pipeflow.backends import get_backend

    assert get_backend("boto3", retry=2).options.retry == RetryPolicy(max_attempts=3)
    assert get_backend("s5cmd", retry={"budget": 3}).options.retry.budget == 3
    with pytest.raises(ConfigError, match="valid"):
        get_backend("boto3", retry={"tries": 3})


# ---- the first-contact rule ------------------------------------------------------------------
def _closed_endpoint() -> str:
    from pipeflow.testing import free_port

    return f"http://127.0.0.1:{free_port()}"  # nothing listens there: connections are refused


def _refused() -> None:
    raise ConnectionRefusedError("refused")


def _reset() -> None:
    raise ConnectionResetError("reset")


def test_an_endpoint_that_never_answered_fails_fast_naming_it() -> None:
    import pickle

    from pipeflow.errors import EndpointUnreachableError

    clock, endpoint = _Clock(), _closed_endpoint()
    policy = RetryPolicy()  # 60 s budget, first_contact 3 s
    with pytest.raises(EndpointUnreachableError) as info:
        retry_call(_refused, policy=policy, url="s3://b/k", backend="boto3", op="open",
                   endpoint=endpoint, sleep=clock.sleep, clock=clock)
    assert policy.first_contact <= clock.now < policy.first_contact + 0.1  # not the 60 s budget
    assert endpoint in str(info.value) and "connection refused" in str(info.value)
    assert isinstance(info.value, ConnectionError) and not isinstance(info.value, RetryExhaustedError)
    assert type(pickle.loads(pickle.dumps(info.value))) is EndpointUnreachableError


def test_once_answered_an_outage_gets_the_whole_budget() -> None:
    clock, endpoint = _Clock(), _closed_endpoint()
    assert retry_call(lambda: "ok", policy=RetryPolicy(), endpoint=endpoint) == "ok"  # answered
    with pytest.raises(RetryExhaustedError):
        retry_call(_refused, policy=RetryPolicy(budget=20.0), endpoint=endpoint, sleep=clock.sleep,
                   clock=clock)
    assert clock.now == pytest.approx(20.0)


def test_an_error_response_is_an_answer_and_a_listening_endpoint_is_no_mistake() -> None:
    clock, endpoint = _Clock(), _closed_endpoint()
    calls = []

    def slow_down_then_refuse() -> None:
        calls.append(clock.now)
        if len(calls) == 1:
            raise _client_error("SlowDown", 503)
        raise ConnectionRefusedError("refused")

    with pytest.raises(RetryExhaustedError):  # the 503 was an answer: the whole budget
        retry_call(slow_down_then_refuse, policy=RetryPolicy(budget=10.0), endpoint=endpoint,
                   sleep=clock.sleep, clock=clock)
    assert clock.now == pytest.approx(10.0)

    # a server that accepts connections but keeps failing is an outage, not a wrong endpoint
    import socket

    with socket.create_server(("127.0.0.1", 0)) as listener:
        listening = f"http://127.0.0.1:{listener.getsockname()[1]}"
        clock = _Clock()
        with pytest.raises(RetryExhaustedError):
            retry_call(_reset, policy=RetryPolicy(budget=8.0), endpoint=listening, sleep=clock.sleep,
                       clock=clock)
        assert clock.now == pytest.approx(8.0)


def test_await_first_contact_probes_with_connections_until_the_deadline() -> None:
    from pipeflow.backends._retry import await_first_contact, mark_answered
    from pipeflow.errors import EndpointUnreachableError

    clock, endpoint = _Clock(), _closed_endpoint()
    with pytest.raises(EndpointUnreachableError, match="connection refused") as info:
        await_first_contact(RetryPolicy(), endpoint=endpoint, url="s3://b/k", backend="x", op="open",
                            sleep=clock.sleep, clock=clock)
    assert 3.0 <= clock.now < 3.1 and len(clock.sleeps) > 2  # the window is given, then no more
    assert endpoint in str(info.value)
    with pytest.raises(RetryExhaustedError, match="after 2 attempts"):  # a cap on attempts holds too
        await_first_contact(RetryPolicy(max_attempts=2), endpoint=endpoint, sleep=clock.sleep,
                            clock=clock)

    # nothing to wait for: the rule is off, the endpoint listens, or it has answered before
    import socket

    with socket.create_server(("127.0.0.1", 0)) as listener:
        listening = f"http://127.0.0.1:{listener.getsockname()[1]}"
        for policy, where in ((RetryPolicy(first_contact=None), endpoint), (RetryPolicy(), listening)):
            clock = _Clock()
            await_first_contact(policy, endpoint=where, sleep=clock.sleep, clock=clock)
            assert clock.sleeps == []
    mark_answered(endpoint)
    await_first_contact(RetryPolicy(), endpoint=endpoint, sleep=clock.sleep, clock=clock)
    assert clock.sleeps == []


def test_an_endpoint_behind_a_proxy_is_never_called_unreachable_from_a_direct_probe(monkeypatch) -> None:
    """Behind HTTP(S)_PROXY a direct connection proves nothing (the proxy may be the only way
    there): no probe, the SDK's own errors decide; NO_PROXY brings the probe back."""
    from pipeflow.backends._retry import await_first_contact, refused

    endpoint = _closed_endpoint()
    for var in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    assert isinstance(refused(endpoint), ConnectionRefusedError)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    assert refused(endpoint) is None
    assert isinstance(refused(endpoint.replace("http://", "https://")), ConnectionRefusedError)
    clock = _Clock()
    await_first_contact(RetryPolicy(), endpoint=endpoint, sleep=clock.sleep, clock=clock)
    assert clock.sleeps == []
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert isinstance(refused(endpoint), ConnectionRefusedError)


def test_first_contact_none_gives_a_refusing_endpoint_the_whole_budget() -> None:
    clock = _Clock()
    with pytest.raises(RetryExhaustedError):
        retry_call(_refused, policy=RetryPolicy(budget=7.0, first_contact=None),
                   endpoint=_closed_endpoint(), sleep=clock.sleep, clock=clock)
    assert clock.now == pytest.approx(7.0)
    with pytest.raises(ConfigError):
        RetryPolicy(first_contact=-1)


def test_the_policy_describes_itself_and_retries_are_counted_with_their_wait() -> None:
    from pipeflow.stats import Stats

    assert RetryPolicy().describe() == "60 s budget, backoff 0.1-5 s, fail fast 3 s"
    assert RetryPolicy(budget=None, max_attempts=4, first_contact=None).describe() == \
        "no time budget, at most 4 attempts, backoff 0.1-5 s"
    stats, clock, failures = Stats(), _Clock(), [ConnectionResetError("x")] * 3

    def flaky() -> str:
        if failures:
            raise failures.pop()
        return "ok"

    with stats.counting("open"):
        assert retry_call(flaky, policy=RetryPolicy(), sleep=clock.sleep, clock=clock) == "ok"
    counters = stats.snapshot()["open"]
    assert counters["retries"] == 3
    assert counters["retry_wait_s"] == pytest.approx(sum(clock.sleeps)) and sum(clock.sleeps) > 0
