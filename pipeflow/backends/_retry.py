"""Retries for transient storage failures: the policy, the classification, the loop.

* :class:`RetryPolicy`: a *time budget* per request (60 s by default) with capped exponential
  backoff and full jitter (the delay before retry ``n`` is uniform in
  ``[0, min(max_delay, base_delay * 2**n)]``), optionally also a cap on attempts.
* :func:`is_transient`: the classification, by exception type and error code, never by message:
  HTTP 5xx and 429, S3 ``SlowDown``/throttling codes, connection resets and refusals, read
  timeouts, truncated bodies.
* :func:`retry_call`: run a request under a policy; :class:`~pipeflow.errors.RetryExhaustedError`
  when the budget is spent.
* The first-contact rule: an endpoint that has never answered in this process and refuses
  connections (or whose name does not resolve) is a configuration mistake, not an outage; it
  ends in :class:`~pipeflow.errors.EndpointUnreachableError` after ``first_contact`` seconds
  (3 s by default), not after the whole budget. Once the endpoint has answered once, any
  outage gets the whole budget. :func:`await_first_contact` applies the rule ahead of a request,
  for an SDK whose own attempts are slow to fail (the CRT).

Streams that resume where they broke live in :mod:`pipeflow.backends._resumable`.
"""

from __future__ import annotations

import http.client
import math
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar
from urllib.parse import SplitResult, urlsplit
from urllib.request import getproxies, proxy_bypass

from .._checks import is_int
from .._words import counted
from ..errors import ConfigError, EndpointUnreachableError, PipeflowError, RetryExhaustedError
from ..stats import note, take_turn

__all__ = [
    "TRANSIENT_CODES",
    "RetryPolicy",
    "RetryTimer",
    "await_first_contact",
    "check_first_contact",
    "exhausted",
    "has_answered",
    "is_transient",
    "is_transient_status",
    "mark_answered",
    "retried_pages",
    "retry_call",
    "s3_error_code",
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


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How long and how hard to retry transient failures (5xx, 429, throttling, resets, timeouts).

    The default keeps retrying one request for up to 60 seconds after its first failure, with
    delays that grow from 0.1 s to at most 5 s, randomised ("full jitter") so that many clients
    do not retry in lockstep. Permanent errors (403, 404, a bad request) are never retried.

    Attributes:
        budget: seconds a request may keep being retried, counted from its first failure;
            once spent, the next failure raises :class:`~pipeflow.errors.RetryExhaustedError`.
            An attempt in flight is not cut short (the backend's ``timeout`` bounds it).
            None: no time limit (``max_attempts`` must then be set).
        max_attempts: tries per request, the first included, on top of the budget (None: as
            many as the budget allows; 1 disables retries). For a stream, the number of
            consecutive failed resumptions without progress.
        base_delay: seconds; the cap of the first backoff.
        max_delay: seconds; the cap of any single backoff.
        max_resumes: total mid-body resumptions allowed for one stream (None: no limit; each
            stretch without progress is bounded by ``budget`` / ``max_attempts`` anyway).
        first_contact: seconds a request to an endpoint that has never answered in this
            process is retried while that endpoint refuses connections or its name does not
            resolve; then :class:`~pipeflow.errors.EndpointUnreachableError` names it (a wrong
            endpoint is a mistake to report at once, not an outage to wait out). None: such
            an endpoint gets the whole budget too.

    Also accepted wherever a backend takes ``retry=``: an int ``n`` (``n`` retries after the
    first try, i.e. ``max_attempts=n + 1``, within the default budget; 0 disables retries) and a
    mapping of these fields (``{"budget": 10}``), convenient in JSON or YAML configuration.
    """

    budget: float | None = 60.0
    max_attempts: int | None = None
    base_delay: float = 0.1
    max_delay: float = 5.0
    max_resumes: int | None = None
    first_contact: float | None = 3.0

    def __post_init__(self) -> None:
        if self.max_attempts is not None and (not is_int(self.max_attempts) or self.max_attempts < 1):
            raise ConfigError(f"RetryPolicy(max_attempts=...) must be a positive int or None, "
                              f"got {self.max_attempts!r}")
        if self.max_resumes is not None and (not is_int(self.max_resumes) or self.max_resumes < 0):
            raise ConfigError(f"RetryPolicy(max_resumes=...) must be a non-negative int or None, "
                              f"got {self.max_resumes!r}")
        for name in ("budget", "base_delay", "max_delay", "first_contact"):
            value = getattr(self, name)
            if value is None and name in ("budget", "first_contact"):
                continue
            if (not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0
                    or not math.isfinite(value)):
                raise ConfigError(f"RetryPolicy({name}=...) must be a number of seconds >= 0, got {value!r}")
        if self.budget is None and self.max_attempts is None:
            raise ConfigError("RetryPolicy needs a budget (seconds) or max_attempts: "
                              "with neither, a server that never comes back is retried forever")

    @classmethod
    def coerce(cls, value: Any, what: str = "retry") -> RetryPolicy:
        """``value`` as a policy: a RetryPolicy, an int number of retries, or a mapping of fields.

        Raises:
            ConfigError: anything else, or a mapping with unknown or invalid fields.
        """
        if isinstance(value, RetryPolicy):
            return value
        if is_int(value):
            if value < 0:
                raise ConfigError(f"{what}= as an int is a number of retries (>= 0), got {value!r}")
            return cls(max_attempts=value + 1)
        if isinstance(value, Mapping):
            valid = [f.name for f in fields(cls)]
            unknown = sorted(str(k) for k in value if k not in valid)
            if unknown:
                raise ConfigError(f"{what}=: unknown RetryPolicy field(s) {', '.join(unknown)}; "
                                  f"valid: {', '.join(valid)}")
            return cls(**value)
        raise ConfigError(f"{what}= must be a RetryPolicy, an int number of retries or a mapping of "
                          f"RetryPolicy fields, got {type(value).__name__}")

    def describe(self) -> str:
        """One line for ``explain()``: ``"60 s budget, backoff 0.1-5 s, fail fast 3 s"``."""
        parts = [f"{self.budget:g} s budget" if self.budget is not None else "no time budget"]
        if self.max_attempts is not None:
            parts.append(f"at most {counted(self.max_attempts, 'attempt')}")
        parts.append(f"backoff {self.base_delay:g}-{self.max_delay:g} s")
        if self.first_contact is not None:
            parts.append(f"fail fast {self.first_contact:g} s")
        return ", ".join(parts)

    def backoff(self, attempt: int) -> float:
        """The (random) delay before retry number ``attempt`` (0-based): full jitter."""
        cap = min(self.max_delay, self.base_delay * (2 ** min(attempt, 32)))
        return _jitter.uniform(0.0, cap)

    def timer(self, clock: Callable[[], float] = time.monotonic) -> RetryTimer:
        """A fresh count of failures and elapsed time for one request."""
        return RetryTimer(self, clock)


class RetryTimer:
    """The retry state of one request (or one stretch of a stream without progress)."""

    def __init__(self, policy: RetryPolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self.failures = 0
        self._first_failure: float | None = None

    @property
    def elapsed(self) -> float:
        """Seconds since the first failure (0 before any)."""
        return 0.0 if self._first_failure is None else self._clock() - self._first_failure

    def failed(self) -> float | None:
        """Record a failure; the delay to sleep before the next try, or None to give up."""
        self.failures += 1
        if self._first_failure is None:
            self._first_failure = self._clock()
        policy = self.policy
        if policy.max_attempts is not None and self.failures >= policy.max_attempts:
            return None
        delay = policy.backoff(self.failures - 1)
        if policy.budget is not None:
            left = policy.budget - self.elapsed
            if left <= 0:
                return None
            delay = min(delay, left)
        return delay

    def describe(self) -> str:
        """``"after 12 attempts in 60.3 s"``, for error messages."""
        return f"after {counted(self.failures, 'attempt')} in {self.elapsed:.1f} s"


def s3_error_code(exc: BaseException | None) -> tuple[str, int | None] | None:
    """``(error code, HTTP status)`` of the first botocore-style error in ``exc``'s chain.

    Looks for the ``response`` dict botocore's ``ClientError`` carries (aiobotocore's and
    s3transfer's wrappers chain to one). None when there is none.
    """
    seen = 0
    while exc is not None and seen < 8:
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            code = str((response.get("Error") or {}).get("Code", "") or "")
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            return code, status if is_int(status) else None
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def is_transient_status(code: str, status: int | None) -> bool:
    """True for a throttling/availability error code, or an HTTP 5xx / 429 status."""
    if code in TRANSIENT_CODES:
        return True
    if status is None and code.isdigit():
        status = int(code)
    return status is not None and (status >= 500 or status == 429)


def _botocore_transient(exc: BaseException) -> bool | None:
    bexc = sys.modules.get("botocore.exceptions")
    if bexc is None:
        return None
    if isinstance(exc, bexc.ClientError):
        code, status = s3_error_code(exc) or ("", None)
        return is_transient_status(code, status)
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
    return is_int(status) and (status >= 500 or status == 429) and not isinstance(exc, PipeflowError)


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
        if isinstance(current, (ConnectionError, TimeoutError, http.client.IncompleteRead)):
            return True
        if _third_party_transient(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def exhausted(timer: RetryTimer, exc: BaseException, *, what: str, url: str, backend: str, op: str,
              endpoint: str | None = None) -> RetryExhaustedError:
    """The error for a spent budget, naming the URL, the endpoint and the last failure."""
    where = f" at {endpoint}" if endpoint else ""
    budget = timer.policy.budget
    limit = f"retry budget {budget:g} s" if budget is not None else "no time budget"
    if timer.policy.max_attempts is not None:
        limit += f", at most {counted(timer.policy.max_attempts, 'attempt')}"
    return RetryExhaustedError(f"{what}{where}: gave up {timer.describe()} ({limit}): "
                               f"{type(exc).__name__}", url=url, backend=backend, op=op)


def retry_call(fn: Callable[[], T], *, policy: RetryPolicy, url: str = "", backend: str = "",
               op: str = "", endpoint: str | None = None,
               classify: Callable[[BaseException], bool] = is_transient,
               sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.monotonic,
               on_retry: Callable[[BaseException, int], None] | None = None) -> T:
    """Call ``fn()``, retrying transient failures with backoff until the policy's budget is spent.

    Non-transient exceptions propagate unchanged (the backend translates them). A success
    marks ``endpoint`` as one that has answered in this process (the first-contact rule).

    Raises:
        RetryExhaustedError: still failing when the budget (time, and attempts when capped) is
            spent; names ``url`` and ``endpoint``, raised from the last failure.
        EndpointUnreachableError: ``endpoint`` never answered in this process and refuses
            connections (or does not resolve) after ``policy.first_contact`` seconds.
    """
    timer = policy.timer(clock)
    while True:
        try:
            result = fn()
        except Exception as exc:
            if not classify(exc):
                raise
            if s3_error_code(exc) is not None:
                mark_answered(endpoint)  # an error response (a 503) is an answer too
            delay = timer.failed()
            if delay is None:
                raise exhausted(timer, exc, what="request", url=url, backend=backend, op=op,
                                endpoint=endpoint) from exc
            delay = check_first_contact(timer, exc, delay, endpoint=endpoint, url=url,
                                        backend=backend, op=op)
            note_retry(delay)
            if on_retry is not None:
                on_retry(exc, timer.failures)
            sleep(delay)
        else:
            mark_answered(endpoint)
            return result


def retried_pages(open_pages: Callable[[], Iterable[T]],
                  call: Callable[[Callable[[], T | None]], T | None]) -> Iterator[T]:
    """The pages of a listing, each fetched through ``call`` (the backend's request under its
    retry policy).

    A page that fails drops the listing stream: an SDK's page iterator is not usable after an
    error. The next attempt opens a new one with ``open_pages()``, which starts after the last
    key the caller has taken (the caller consumes each page before the next is fetched). One
    stream is open at a time, whatever the number of pages.
    """
    pages: list[Iterator[T]] = []  # the open listing stream, dropped when it fails

    def page() -> T | None:
        if not pages:
            pages.append(iter(open_pages()))
        try:
            return next(pages[0], None)
        except BaseException:
            pages.clear()
            raise

    while (batch := call(page)) is not None:
        yield batch


def note_retry(delay: float) -> None:
    """Count a retry and the seconds waited before it, for the stage whose request this is; when
    that stage has a request-rate budget, wait (beyond the backoff of ``delay`` the caller
    sleeps next) for the retry's turn under it: a retry is a request to the store too."""
    note("retries")
    note("retry_wait_s", delay)
    take_turn(delay)


# ---- the first-contact rule ------------------------------------------------------------------
#: endpoints that have answered a request in this process (never cleared: a small set of URLs)
_answered: set[str] = set()
_answered_lock = threading.Lock()
#: seconds a TCP connection to an endpoint may take when checking whether it refuses them
_PROBE_TIMEOUT = 2.0


def mark_answered(endpoint: str | None) -> None:
    """Record that ``endpoint`` answered a request in this process."""
    if endpoint and endpoint not in _answered:
        with _answered_lock:
            _answered.add(endpoint)


def has_answered(endpoint: str | None) -> bool:
    """Whether ``endpoint`` has answered a request in this process."""
    return bool(endpoint) and endpoint in _answered


def refused(endpoint: str, timeout: float = _PROBE_TIMEOUT) -> OSError | None:
    """The error of a TCP connection to ``endpoint`` when it is refused or the host name does not
    resolve; None when something accepts it, or when the attempt only timed out or the network
    is unreachable (no proof of a wrong endpoint) or ``endpoint`` is no ``http(s)://`` URL."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname or _through_proxy(parts):
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except (socket.gaierror, ConnectionRefusedError) as exc:
        return exc
    except (OSError, ValueError):
        return None
    return None


def _through_proxy(parts: SplitResult) -> bool:
    """Whether the environment sends requests to this endpoint through a proxy (``HTTPS_PROXY``,
    ``HTTP_PROXY``, not bypassed by ``NO_PROXY``), as botocore and aiohttp do: then a direct
    connection that is refused, or a name that does not resolve here, proves nothing about the
    endpoint (only the proxy can reach it), and the probe must not call it unreachable."""
    return parts.scheme in getproxies() and not proxy_bypass(parts.hostname or "")


def check_first_contact(timer: RetryTimer, exc: BaseException, delay: float, *,
                        endpoint: str | None, url: str, backend: str, op: str) -> float:
    """The first-contact rule for one transient failure: the delay to sleep (shortened so the
    check comes on time), or :class:`~pipeflow.errors.EndpointUnreachableError` once the
    endpoint, which has never answered in this process, still refuses after
    ``first_contact`` seconds."""
    limit = timer.policy.first_contact
    if limit is None or not endpoint or has_answered(endpoint):
        return delay
    left = limit - timer.elapsed
    if left > 0:
        return min(delay, max(left, 0.01))
    cause = refused(endpoint)
    if cause is None:
        return delay
    why = "the host name does not resolve" if isinstance(cause, socket.gaierror) else "connection refused"
    raise EndpointUnreachableError(
        f"the endpoint {endpoint} has not answered since this process started ({why}, "
        f"{timer.describe()}): check the endpoint (endpoint=, AWS_ENDPOINT_URL) and that the "
        f"server is running", url=url, backend=backend, op=op) from exc


def await_first_contact(policy: RetryPolicy, *, endpoint: str | None, url: str = "", backend: str = "",
                        op: str = "", sleep: Callable[[float], None] = time.sleep,
                        clock: Callable[[], float] = time.monotonic) -> None:
    """The first-contact rule ahead of a request, with TCP connections instead of SDK attempts.

    For an SDK that cannot be told to fail a refused connection quickly: the CRT makes at least
    two attempts per request, waiting its own backoff (0.2-0.5 s) between them, and its client
    takes about a second to start, so the rule applied to its failures reported a wrong endpoint
    after 4-10 s instead of ``first_contact``. A TCP connection says "refused" (or "does not
    resolve") in a millisecond. Returns at once when ``endpoint`` has answered in this process
    (a set lookup: the cost of every request after the first answer) or accepts a connection.

    Raises:
        EndpointUnreachableError: ``endpoint`` still refuses connections (or does not resolve)
            ``policy.first_contact`` seconds after the first refusal.
        RetryExhaustedError: the policy's attempts ran out first (``max_attempts``).
    """
    if policy.first_contact is None or not endpoint or has_answered(endpoint):
        return
    timer = policy.timer(clock)
    while (cause := refused(endpoint)) is not None:
        delay = timer.failed()
        if delay is None:
            raise exhausted(timer, cause, what="connection", url=url, backend=backend, op=op,
                            endpoint=endpoint) from cause
        delay = check_first_contact(timer, cause, delay, endpoint=endpoint, url=url, backend=backend,
                                    op=op)
        note_retry(delay)
        sleep(delay)
