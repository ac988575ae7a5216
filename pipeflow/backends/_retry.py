"""Retries for transient storage failures, and streams that resume where they broke.

* :class:`RetryPolicy`: exponential backoff with full jitter (the delay before retry ``n`` is
  uniform in ``[0, min(max_delay, base_delay * 2**n)]``), a bounded number of attempts.
* :func:`is_transient`: the classification, by exception type and error code, never by message:
  HTTP 5xx and 429, S3 ``SlowDown``/throttling codes, connection resets, read timeouts,
  truncated bodies.
* :func:`retry_call`: run a request under a policy; :class:`~pipeflow.errors.RetryExhaustedError`
  when the budget is spent.
* :class:`ResumableStream`: a non-seekable binary stream over an ``opener(offset)`` that, when the
  body breaks off mid-way, reopens with a ranged request from the byte already delivered
  instead of starting over.
"""

from __future__ import annotations

import io
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from ..errors import ConfigError, PipeflowError, RetryExhaustedError

__all__ = [
    "TRANSIENT_CODES",
    "ResumableStream",
    "RetryPolicy",
    "TruncatedBodyError",
    "is_transient",
    "retry_call",
]

T = TypeVar("T")

#: S3 / AWS error codes that mean "try again later"
TRANSIENT_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
    "RequestThrottledException", "TooManyRequestsException", "RequestLimitExceeded",
    "BandwidthLimitExceeded", "ProvisionedThroughputExceededException", "RequestTimeout",
    "RequestTimeoutException", "InternalError", "ServiceUnavailable", "ServiceUnavailableException",
    "EC2ThrottledException", "PriorRequestNotComplete", "TransactionInProgressException",
})

_jitter = random.Random()

#: read size used by ``read()`` without a size
_READ_ALL_CHUNK = 4 << 20


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to retry transient failures.

    Attributes:
        max_attempts: tries per request, the first included (1 disables retries). For a stream,
            the number of consecutive failed resumptions without progress.
        base_delay: seconds; the cap of the first backoff.
        max_delay: seconds; the cap of any single backoff.
        max_resumes: total mid-body resumptions allowed for one stream.
    """

    max_attempts: int = 5
    base_delay: float = 0.05
    max_delay: float = 5.0
    max_resumes: int = 20

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ConfigError(f"RetryPolicy.max_attempts must be an int >= 1, got {self.max_attempts!r}")
        if not isinstance(self.max_resumes, int) or self.max_resumes < 0:
            raise ConfigError(f"RetryPolicy.max_resumes must be an int >= 0, got {self.max_resumes!r}")
        for name in ("base_delay", "max_delay"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"RetryPolicy.{name} must be a number >= 0, got {value!r}")

    def backoff(self, attempt: int) -> float:
        """The (random) delay before retry number ``attempt`` (0-based): full jitter."""
        cap = min(self.max_delay, self.base_delay * (2 ** min(attempt, 32)))
        return _jitter.uniform(0.0, cap)


class TruncatedBodyError(ConnectionError):
    """A response body ended before the announced length (a transient failure)."""


def _botocore_transient(exc: BaseException) -> bool | None:
    bexc = sys.modules.get("botocore.exceptions")
    if bexc is None:
        return None
    if isinstance(exc, bexc.ClientError):
        response: dict[str, Any] = getattr(exc, "response", None) or {}
        code = str(response.get("Error", {}).get("Code", ""))
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in TRANSIENT_CODES:
            return True
        if isinstance(status, int):
            return status >= 500 or status == 429
        return code.isdigit() and (int(code) >= 500 or int(code) == 429)
    transient = (bexc.ConnectionError, bexc.HTTPClientError, bexc.IncompleteReadError)
    if isinstance(exc, transient):
        return True
    if isinstance(exc, bexc.BotoCoreError):
        return False
    return None


def _third_party_transient(exc: BaseException) -> bool:
    for module, names in (
        ("urllib3.exceptions", ("ProtocolError", "ReadTimeoutError", "IncompleteRead")),
        ("aiohttp", ("ClientPayloadError", "ServerDisconnectedError", "ClientOSError",
                     "ServerTimeoutError")),
    ):
        mod = sys.modules.get(module)
        if mod is None:
            continue
        types = tuple(t for t in (getattr(mod, n, None) for n in names) if isinstance(t, type))
        if types and isinstance(exc, types):
            return True
    status = getattr(exc, "status", None)  # aiohttp ClientResponseError
    return isinstance(status, int) and (status >= 500 or status == 429) and not isinstance(exc, PipeflowError)


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` (or an exception it was raised from) is worth retrying.

    Pipeflow's own typed errors are final: they have already been classified.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 8:
        seen.add(id(current))
        if isinstance(current, PipeflowError):
            return False
        verdict = _botocore_transient(current)
        if verdict is not None:
            return verdict
        import http.client  # stdlib, cheap

        if isinstance(current, (ConnectionError, TimeoutError, http.client.IncompleteRead)):
            return True
        if _third_party_transient(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def retry_call(fn: Callable[[], T], *, policy: RetryPolicy, url: str = "", backend: str = "",
               op: str = "", classify: Callable[[BaseException], bool] = is_transient,
               sleep: Callable[[float], None] = time.sleep,
               on_retry: Callable[[BaseException, int], None] | None = None) -> T:
    """Call ``fn()``, retrying transient failures with backoff.

    Non-transient exceptions propagate unchanged (the backend translates them).

    Raises:
        RetryExhaustedError: still failing after ``policy.max_attempts`` attempts; raised from
            the last failure.
    """
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            if not classify(exc):
                raise
            attempt += 1
            if attempt >= policy.max_attempts:
                raise RetryExhaustedError(
                    f"gave up after {attempt} attempts: {type(exc).__name__}",
                    url=url, backend=backend, op=op) from exc
            if on_retry is not None:
                on_retry(exc, attempt)
            sleep(policy.backoff(attempt - 1))


class ResumableStream(io.BufferedIOBase):
    """A readable, non-seekable stream that survives broken connections.

    Args:
        opener: ``opener(offset)`` returns a fresh binary stream positioned at ``offset`` (a
            ranged GET). It is called lazily, on the first read, and again after each failure.
        start: the offset of the first byte this stream delivers.
        size: the object's total size when known; a body that ends before it counts as a
            transient failure and is resumed.
        policy: the retry budget.
        url, backend: for error messages.
        classify: which failures are transient.
        sleep: injectable for tests.
        first: an already opened body for ``start`` (so open errors surface at open time).
        translate: maps a permanent (non-transient) read failure to a typed error.

    The number of resumptions is available as :attr:`resumes`.
    """

    def __init__(self, opener: Callable[[int], IO[bytes]], *, start: int = 0, size: int | None = None,
                 policy: RetryPolicy | None = None, url: str = "", backend: str = "",
                 classify: Callable[[BaseException], bool] = is_transient,
                 sleep: Callable[[float], None] = time.sleep,
                 first: IO[bytes] | None = None,
                 translate: Callable[[BaseException], BaseException] | None = None) -> None:
        super().__init__()
        self._opener = opener
        self._pos = start
        self._size = size
        self._policy = policy or RetryPolicy()
        self._url = url
        self._backend = backend
        self._classify = classify
        self._sleep = sleep
        self._raw: IO[bytes] | None = first
        self._translate = translate
        self._failures = 0  # consecutive, without progress
        self.resumes = 0

    # ---- io protocol ----------------------------------------------------------------------
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._pos

    @property
    def url(self) -> str:
        return self._url

    def close(self) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            try:
                raw.close()
            except Exception:  # a broken connection may fail to close; nothing to recover
                pass
        super().close()

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self._read_all()
        chunks: list[bytes] = []
        remaining = size
        while remaining > 0:
            chunk = self.read1(remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def read1(self, size: int = -1) -> bytes:
        if size == 0:  # the body's answer, b"", would look like a connection cut short
            return b""
        if size is None or size < 0:
            size = 1 << 20
        return self._attempt(lambda raw: raw.read(size))

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def readinto1(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read1(len(view))
        view[: len(data)] = data
        return len(data)

    # ---- machinery ------------------------------------------------------------------------
    def _read_all(self) -> bytes:
        # bounded reads, so a failure loses at most one chunk and the resume starts from
        # the bytes already delivered (a single read() would return nothing on failure)
        chunks: list[bytes] = []
        while True:
            chunk = self._attempt(lambda raw: raw.read(_READ_ALL_CHUNK))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)

    def _attempt(self, op: Callable[[IO[bytes]], bytes]) -> bytes:
        if self.closed:
            raise ValueError("I/O operation on closed stream")
        while True:
            try:
                if self._raw is None:
                    if self._size is not None and self._pos >= self._size:
                        return b""
                    self._raw = self._opener(self._pos)
                data = op(self._raw)
                if not data and self._size is not None and self._pos < self._size:
                    raise TruncatedBodyError(
                        f"body ended at byte {self._pos} of {self._size}")
            except Exception as exc:
                if not self._classify(exc):
                    err = self._translate(exc) if self._translate is not None else exc
                    if err is exc:
                        raise
                    raise err from exc
                self._recover(exc)
                continue
            if data:
                self._pos += len(data)
                self._failures = 0
            return data

    def _recover(self, exc: BaseException) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            try:
                raw.close()
            except Exception:  # the connection is already broken
                pass
        self._failures += 1
        self.resumes += 1
        if self._failures >= self._policy.max_attempts or self.resumes > self._policy.max_resumes:
            raise RetryExhaustedError(
                f"stream broke off at byte {self._pos} and could not be resumed "
                f"({self.resumes} resumptions): {type(exc).__name__}",
                url=self._url, backend=self._backend, op="read") from exc
        self._sleep(self._policy.backoff(self._failures - 1))
