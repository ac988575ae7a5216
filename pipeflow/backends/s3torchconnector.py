"""``s3torchconnector``: the AWS CRT client of the S3 Connector for PyTorch.

Memory: the CRT downloads a response as fast as the network allows, whatever the reader
consumes (and the connector's sequential reader also keeps every byte it has read, so that it
can seek back): one GET of a 1 GB shard held up to 1 GB. With ``reader="sequential"`` (the
default) this backend reads an object as consecutive ranged GETs and asks for the next range only
once the reader has reached the current one (:mod:`pipeflow.backends._ranged`). The first range is
``range_size`` bytes (default: one part, 8 MiB), so an object that fits in it costs one GET and
no HEAD; each next range doubles up to ``max_range_size`` (default: four parts, 32 MiB), which the
CRT fetches as several parts at once: a long sequential read (a tar shard) keeps up to four
parts in flight instead of one, and one open stream never holds more than
``2 * max_range_size`` bytes (64 MiB by default).
``reader="range_based"`` keeps the connector's own ranged reader (cheap seeks).

Errors: the CRT's exception carries no attributes, only its rendered text, in which the binding
places machine-readable codes: the CRT's symbolic error code (``AWS_IO_SOCKET_CONNECTION_REFUSED``),
the HTTP status (``response_status: 503``), the S3 error code of the response body
(``<Code>SlowDown</Code>``) and the kind of error, one of a fixed set the binding renders
(``Forbidden``, no signing credentials, throttled; "the bucket does not exist", "the key does not
exist", "the object was not found"). Pipeflow reads those codes (never the prose around them)
and maps them as the other S3 backends do: 403 and missing credentials to
:class:`~pipeflow.errors.AccessDeniedError`; a missing bucket or key to
:class:`~pipeflow.errors.ObjectNotFoundError` (listing and open alike); an unreachable endpoint,
5xx, 429 and throttling codes are transient. A failure that carries no code at all is settled
structurally: the backend lists the key's prefix; if the bucket lists but the key is absent,
the error is :class:`~pipeflow.errors.ObjectNotFoundError`.

Retries: the CRT makes as few attempts per request as it can (``crt_max_attempts``, default 2:
the binding reads 1 as "the CRT's default", which is 4; the CRT counts attempts, not time);
every request runs under the backend's :class:`~pipeflow.backends._retry.RetryPolicy`, the same
time budget as on every backend, with the first-contact rule for an endpoint that never
answered, checked with a TCP connection before the CRT's first request (its own attempts
against a refused port take seconds to fail). A body that breaks off or stalls mid-way is
resumed with a ranged GET from the byte already delivered; each range after the first must
carry the ETag of the first (else :class:`~pipeflow.errors.ObjectChangedError`: an
object replaced mid-read would otherwise mix two versions).

Timeouts: ``S3ClientConfig`` has no read timeout, so pipeflow bounds a stalled body itself: a
stream that receives no bytes for the read part of ``timeout`` (default 30 s) raises a transient
:class:`TimeoutError` and is resumed under the retry policy; a server that never answers ends in
:class:`~pipeflow.errors.RetryExhaustedError`. The CRT's own connection timeouts apply to
connecting, listing and HEAD.

Credentials come from the CRT's own chain (environment, ``profile=``, shared files, instance
roles): explicit ``access_key``/``secret_key`` are not supported by this SDK.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Literal, TypeVar

from pipeflow._checks import check_int, is_int
from pipeflow.backends._ranged import RangedBody
from pipeflow.backends._resumable import ResumableStream
from pipeflow.backends._retry import (
    TRANSIENT_CODES,
    await_first_contact,
    is_transient,
    mark_answered,
    retried_pages,
    retry_call,
)
from pipeflow.backends._s3config import S3Options, error_for_status, no_credentials_error
from pipeflow.backends.base import Backend, S3Location, parse_s3_object_url, parse_s3_url
from pipeflow.errors import (
    AccessDeniedError,
    BackendError,
    ConfigError,
    ObjectChangedError,
    ObjectNotFoundError,
    PipeflowError,
)
from pipeflow.items import ObjectInfo

__all__ = ["S3TorchConnectorBackend", "S3TorchConnectorOptions", "crt_error_codes"]

T = TypeVar("T")

#: parts in the largest ranged GET of a sequential stream by default: the CRT fetches them at
#: once, so a long read keeps this many parts in flight
_PARTS_PER_RANGE = 4

#: the fewest attempts per request the CRT binding accepts (it reads 1 as its default, 4)
_CRT_FEWEST_ATTEMPTS = 2

# the codes the binding renders into its exception (see the module docstring)
_CRT_NAME = re.compile(r"\b(AWS_(?:IO|ERROR)_[A-Z0-9_]+)\b")
_HTTP_STATUS = re.compile(r"\bresponse_status: (\d{3})\b")
_S3_CODE = re.compile(r"<Code>([A-Za-z0-9.]+)</Code>")
_KIND = re.compile(r"^(?:Client|Service) error: (Forbidden|No signing credentials|Request throttled"
                   r"|The bucket does not exist|The key does not exist|The object was not found)\b")
#: kinds of error (see ``_KIND``) that mean the bucket or the key does not exist: the S3 code each stands for
_MISSING_KINDS = {"The bucket does not exist": "NoSuchBucket", "The key does not exist": "NoSuchKey",
                  "The object was not found": "NotFound"}

#: CRT error codes meaning the endpoint could not be reached or the connection broke
UNREACHABLE_CRT_CODES = frozenset({
    "AWS_IO_SOCKET_CONNECTION_REFUSED", "AWS_IO_SOCKET_TIMEOUT", "AWS_IO_SOCKET_NO_ROUTE_TO_HOST",
    "AWS_IO_SOCKET_NETWORK_DOWN", "AWS_IO_SOCKET_CLOSED", "AWS_IO_DNS_QUERY_FAILED",
    "AWS_IO_DNS_INVALID_NAME", "AWS_IO_DNS_NO_ADDRESS_FOR_HOST", "AWS_IO_DNS_HOST_REMOVED_FROM_CACHE",
    "AWS_ERROR_HTTP_CONNECTION_CLOSED", "AWS_ERROR_HTTP_SERVER_CLOSED",
    "AWS_ERROR_HTTP_RESPONSE_FIRST_BYTE_TIMEOUT", "AWS_IO_BROKEN_PIPE", "AWS_IO_SOCKET_CONNECT_ABORTED",
})


@dataclass(frozen=True)
class _Codes:
    crt: frozenset[str]
    status: int | None
    s3: str
    kind: str


def crt_error_codes(exc: BaseException) -> _Codes:
    """The codes a CRT exception carries: CRT error names, HTTP status, S3 code, error kind."""
    text = str(exc)
    status = _HTTP_STATUS.search(text)
    code = _S3_CODE.search(text)
    kind = _KIND.match(text)
    return _Codes(frozenset(_CRT_NAME.findall(text)), int(status.group(1)) if status else None,
                  code.group(1) if code else "", kind.group(1) if kind else "")


@dataclass(frozen=True)
class S3TorchConnectorOptions(S3Options):
    """Options of the s3torchconnector backend (plus the shared :class:`S3Options`).

    Attributes:
        reader: ``"sequential"`` (bounded consecutive ranged GETs) or ``"range_based"`` (the
            connector's ranged reader).
        part_size: CRT part size in bytes (5 MiB to 5 GiB).
        range_size: bytes of a sequential stream's first ranged GET (None: ``part_size``).
        max_range_size: the largest ranged GET of a sequential stream; each range after the
            first doubles up to it (None: four parts when ``range_size`` is None, else
            ``range_size``: ranges of one fixed size). One open stream holds at most two ranges.
        throughput_target_gbps: the CRT's throughput target.
        crt_max_attempts: attempts the CRT makes per request for retryable errors, inside each
            attempt of the retry policy; None (the default): 2, the fewest the binding accepts
            (it reads 1 as its own default, 4), so the policy's time budget is the one that
            counts.
    """

    reader: Literal["sequential", "range_based"] = "sequential"
    part_size: int = 8 << 20
    range_size: int | None = None
    max_range_size: int | None = None
    throughput_target_gbps: float = 10.0
    crt_max_attempts: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.reader not in ("sequential", "range_based"):
            raise ConfigError(f"reader must be 'sequential' or 'range_based', got {self.reader!r}")
        if not isinstance(self.part_size, int) or not (5 << 20) <= self.part_size <= (5 << 30):
            raise ConfigError(f"part_size must be an int between 5 MiB and 5 GiB, got {self.part_size!r}")
        size = self.range_size
        if size is not None and (not is_int(size) or size < (64 << 10)):
            raise ConfigError(f"range_size must be an int of at least 64 KiB or None, got {size!r}")
        most = self.max_range_size
        if most is not None and (not is_int(most) or most < self.effective_range_size):
            raise ConfigError(f"max_range_size must be an int of at least range_size "
                              f"({self.effective_range_size}) or None, got {most!r}")
        check_int(self.crt_max_attempts, "crt_max_attempts", low=1, optional=True)
        if self.access_key is not None:
            raise ConfigError("the s3torchconnector backend takes credentials from the environment or a "
                              "profile only (the CRT client has no key arguments)")

    @property
    def effective_crt_attempts(self) -> int:
        """The attempts the CRT makes per request: ``crt_max_attempts``, else 2 (the policy retries)."""
        return self.crt_max_attempts if self.crt_max_attempts is not None else _CRT_FEWEST_ATTEMPTS

    @property
    def effective_range_size(self) -> int:
        """Bytes per ranged GET of a sequential stream."""
        return self.range_size if self.range_size is not None else self.part_size

    @property
    def effective_max_range_size(self) -> int:
        """Bytes of a sequential stream's largest ranged GET (it holds at most two)."""
        if self.max_range_size is not None:
            return self.max_range_size
        return _PARTS_PER_RANGE * self.part_size if self.range_size is None else self.range_size


def _is_past_end(exc: BaseException) -> bool:
    codes = crt_error_codes(exc)
    return codes.status == 416 or codes.s3 == "InvalidRange"


class S3TorchConnectorBackend(Backend):
    """S3 through s3torchconnector's CRT client (one per process)."""

    name = "s3torchconnector"
    Options = S3TorchConnectorOptions
    options: S3TorchConnectorOptions

    def _make_client(self) -> Any:
        from s3torchconnector import S3ClientConfig
        from s3torchconnector._s3client import S3Client

        opts = self.options
        opts.check_profile()  # the CRT would only say so as a refused endpoint, after its retries
        config = S3ClientConfig(
            force_path_style=opts.use_path_style(), part_size=opts.part_size,
            throughput_target_gbps=opts.throughput_target_gbps, max_attempts=opts.effective_crt_attempts,
            profile=opts.profile)
        return S3Client(opts.resolved_region(), endpoint=opts.resolved_endpoint(), s3client_config=config)

    @staticmethod
    def _is_sdk_error(exc: BaseException) -> bool:
        from s3torchconnector import S3Exception

        return isinstance(exc, S3Exception)

    def _probe(self, loc: S3Location) -> ObjectInfo | None:
        """The object's listing entry, None if the bucket lists but the key is absent.

        Raises the SDK's exception when the bucket itself cannot be listed.
        """
        for page in self._client().list_objects(loc.bucket, loc.key, "", 1):
            for obj in page.object_info:
                if obj.key == loc.key:
                    return _object_info(loc.bucket, obj)
            return None
        return None

    def _transient(self, exc: BaseException) -> bool:
        """Whether a failure is worth another attempt: a stall, or CRT codes that say the
        endpoint could not be reached or asked to slow down (5xx, 429, throttling)."""
        if isinstance(exc, PipeflowError):
            return False
        if not self._is_sdk_error(exc):
            return is_transient(exc)
        codes = crt_error_codes(exc)
        status = codes.status
        if status is not None or codes.s3:
            mark_answered(self.options.endpoint_label())  # an error response is an answer too
        return bool(codes.crt & UNREACHABLE_CRT_CODES or codes.kind == "Request throttled"
                    or codes.s3 in TRANSIENT_CODES
                    or (status is not None and (status >= 500 or status == 429)))

    def _by_code(self, exc: BaseException, url: str, op: str) -> BackendError | None:
        """The typed, final error the CRT's codes name, None when they name none (or a transient one)."""
        codes = crt_error_codes(exc)
        if codes.kind == "No signing credentials":  # said with what to set, as the other backends say it
            return no_credentials_error(url=url, backend=self.name, op=op)
        if codes.kind == "Forbidden":
            return AccessDeniedError("access denied (403)", url=url, backend=self.name, op=op)
        if codes.kind in _MISSING_KINDS:  # said as the S3 backends say it: the bucket, the key, or either
            return error_for_status(404, _MISSING_KINDS[codes.kind], url=url, backend=self.name, op=op)
        if self._transient(exc):
            return None
        if codes.status is not None or codes.s3:
            return error_for_status(codes.status, codes.s3, url=url, backend=self.name, op=op)
        return None

    def _error(self, exc: BaseException, loc: S3Location, url: str, op: str) -> BaseException:
        """The typed error for a failure; transient failures are returned unchanged."""
        if isinstance(exc, PipeflowError) or not self._is_sdk_error(exc) or self._transient(exc):
            return exc
        typed = self._by_code(exc, url, op)
        if typed is not None:
            return typed
        try:
            found = self._probe(loc)
        except Exception as probe_exc:
            return self._by_code(probe_exc, url, op) or BackendError(
                "S3 request failed (the bucket cannot be listed either)", url=url, backend=self.name, op=op)
        if found is None:
            return ObjectNotFoundError("no such object", url=url, backend=self.name, op=op)
        return BackendError("S3 request failed", url=url, backend=self.name, op=op)

    def _call(self, fn: Callable[[], T], loc: S3Location, url: str, op: str) -> T:
        """Run one request under the retry policy; typed errors on failure.

        Until the endpoint has answered, a TCP connection checks it first: the CRT cannot be
        given a connect timeout or a single attempt, so its own failures would report a wrong
        endpoint seconds late (:func:`~pipeflow.backends._retry.await_first_contact`).
        """

        def attempt() -> T:
            try:
                return fn()
            except Exception as exc:
                err = self._error(exc, loc, url, op)
                if err is exc:
                    raise
                raise err from exc

        policy, endpoint = self.options.retry, self.options.endpoint_label()
        if not getattr(self, "_profile_checked", False):
            # before the endpoint's check (and without making the CRT client, ~1 s): a profile=
            # naming no profile is a ConfigError, not an unreachable endpoint
            self.options.check_profile()
            self._profile_checked = True
        await_first_contact(policy, endpoint=endpoint, url=url, backend=self.name, op=op)
        return retry_call(attempt, policy=policy, url=url, backend=self.name, op=op,
                          endpoint=endpoint, classify=self._transient)

    # ---- listing ---------------------------------------------------------------------------
    def list(self, url: str) -> Iterator[ObjectInfo]:
        loc = parse_s3_url(url, backend=self.name, op="list")
        after = ""  # the last key yielded: a failed page restarts the listing after it

        def open_pages() -> Any:  # from the start: the connector cannot start after a key
            return self._client().list_objects(loc.bucket, loc.key, "", 1000)

        for batch in retried_pages(open_pages, lambda page: self._call(page, loc, url, "list")):
            for obj in batch.object_info:  # keys arrive in S3's (sorted) order
                if obj.key > after:
                    after = obj.key
                    yield _object_info(loc.bucket, obj)

    def info(self, url: str) -> ObjectInfo:
        loc = parse_s3_object_url(url, backend=self.name, op="info")
        head = self._call(lambda: self._client().head_object(loc.bucket, loc.key), loc, url, "info")
        return ObjectInfo(url=url, size=int(head.size), etag=_etag(head.etag),
                          mtime=float(head.last_modified))

    # ---- reading ---------------------------------------------------------------------------
    def _ranged(self, loc: S3Location, url: str, start: int, end: int | None,
                version: _Version | None = None, resumed: bool = False) -> IO[bytes]:
        """A bounded stream of ``[start, end)``: ranged GETs of one range at a time, each after
        the first checked against the object's ETag (``version``)."""
        client = self._client()
        body = RangedBody(
            lambda lo, hi: client._get_object_stream(loc.bucket, loc.key, lo, hi),
            start=start, end=end, range_size=self.options.effective_range_size,
            max_range_size=self.options.effective_max_range_size,
            read_timeout=self.options.read_timeout, is_past_end=_is_past_end,
            on_request_error=lambda exc: self._error(exc, loc, url, "open"),
            check=version.check if version is not None else None, check_first=resumed)
        try:
            body.wait_first()  # a missing object fails at open, as on every backend
        except BaseException:
            body.close()
            raise
        return body  # type: ignore[return-value]

    def _first_range(self, loc: S3Location, url: str, start: int, end: int | None,
                     version: _Version | None = None, resumed: bool = False) -> IO[bytes]:
        """The first range, retried under the policy (failures, and stalls: the CRT has no read
        timeout)."""
        return self._call(lambda: self._ranged(loc, url, start, end, version, resumed), loc, url,
                          "open")

    def _reader(self, loc: S3Location, url: str) -> IO[bytes]:
        from s3torchconnector import S3ReaderConstructor

        def first() -> IO[bytes]:
            reader = self._client().get_object(loc.bucket, loc.key,
                                               reader_constructor=S3ReaderConstructor.range_based())
            reader.seek(0)
            reader.read(0)
            return reader

        return self._call(first, loc, url, "open")

    def _stream(self, url: str, start: int, end: int | None) -> IO[bytes]:
        loc = parse_s3_object_url(url, backend=self.name, op="open")
        if end is not None and end <= start:
            self.info(url)
            return io.BytesIO(b"")
        ranged = self.options.reader == "range_based" and not start and end is None
        version = _Version(lambda: self._client().head_object(loc.bucket, loc.key), url, self.name)
        first = (self._reader(loc, url) if ranged
                 else self._first_range(loc, url, start, end, version))

        def reopen(offset: int) -> IO[bytes]:
            return self._first_range(loc, url, offset, end, version, resumed=True)

        def classify(exc: BaseException) -> bool:
            # a body failing or stalling mid-way is resumed; a reopen that kept failing past
            # the budget is typed, hence final
            return self._transient(exc)

        return ResumableStream(reopen, start=start, size=None, policy=self.options.retry, url=url,
                               backend=self.name, first=first, classify=classify,
                               endpoint=self.options.endpoint_label(),
                               translate=lambda exc: self._error(exc, loc, url, "read"))

    def open(self, url: str, *, start: int = 0) -> IO[bytes]:
        return self._stream(url, start, None)

    def read(self, url: str, start: int | None = None, end: int | None = None) -> bytes:
        lo = start or 0
        if lo < 0 or (end is not None and end < 0):
            raise ConfigError(f"read({url!r}): start/end must be non-negative (backend={self.name})")
        with self._stream(url, lo, end) as stream:
            return stream.read()


class _Version:
    """The ETag of the object a stream reads, fixed by the first check: the CRT's GET stream
    carries none, so a HEAD for each range after the first (and after the last) compares,
    before any byte of that range is handed over. The first HEAD gives the object's size, so
    no later range reaches past the object."""

    def __init__(self, head: Callable[[], Any], url: str, backend: str) -> None:
        self._head = head
        self._url = url
        self._backend = backend
        self.etag: str | None = None

    def check(self) -> int | None:
        """Raises when the object changed since the first check; returns its size."""
        head = self._head()
        etag = _etag(head.etag)
        if self.etag is None:
            self.etag = etag
        elif etag != self.etag:
            raise ObjectChangedError(f"the object changed while it was read (ETag {self.etag} became "
                                     f"{etag}): read it again", url=self._url, backend=self._backend,
                                     op="read")
        return int(head.size) if is_int(head.size) else None


def _etag(value: Any) -> str | None:
    return value.strip('"') if isinstance(value, str) else None


def _object_info(bucket: str, obj: Any) -> ObjectInfo:
    return ObjectInfo(url=f"s3://{bucket}/{obj.key}", size=int(obj.size), etag=_etag(obj.etag),
                      mtime=float(obj.last_modified))
