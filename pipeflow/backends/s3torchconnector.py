"""``s3torchconnector``: the AWS CRT client of the S3 Connector for PyTorch.

Memory: the CRT downloads a response as fast as the network allows, whatever the reader
consumes (and the connector's sequential reader also keeps every byte it has read, so that it
can seek back): one GET of a 1 GB shard held up to 1 GB. With ``reader="sequential"`` (the
default) this backend reads an object as consecutive ranged GETs of ``range_size`` bytes (default:
one part, 8 MiB) and asks for the next range only once the reader has reached the current one,
so one open stream never holds more than ``2 * range_size`` bytes (:mod:`pipeflow.backends._ranged`).
An object that fits in one range costs one GET, as before; nothing sends a HEAD.
``reader="range_based"`` keeps the connector's own ranged reader (cheap seeks).

Errors: the CRT's exception carries no attributes, only its rendered text, in which the binding
places machine-readable codes: the CRT's symbolic error code (``AWS_IO_SOCKET_CONNECTION_REFUSED``),
the HTTP status (``response_status: 503``), the S3 error code of the response body
(``<Code>SlowDown</Code>``) and the kind of client error (``Forbidden``, no signing credentials, throttled).
Pipeflow reads those codes (never the prose around them) and maps them as the other S3 backends
do: 403 and missing credentials to :class:`~pipeflow.errors.AccessDeniedError`; an unreachable
endpoint, 5xx, 429 and throttling codes, already retried by the CRT, to
:class:`~pipeflow.errors.RetryExhaustedError` naming the endpoint. A missing key or bucket is
reported by the CRT without any code, so for those the backend asks the store a structural
question: it lists the key's prefix; if the bucket lists but the key is absent, the error is
:class:`~pipeflow.errors.ObjectNotFoundError`.

Retries: the CRT classifies and retries failed *requests* itself, with the budget of the
backend's :class:`~pipeflow.backends._retry.RetryPolicy`: ``crt_max_attempts`` defaults to the
attempt count that spends the policy's time budget under the CRT's own backoff (the CRT takes a
count, not a duration). Pipeflow adds no loop around requests; it only resumes a body that breaks
off or stalls mid-way, with a ranged GET from the byte already delivered.

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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, Literal

from pipeflow._checks import check_int, is_int
from pipeflow.backends._ranged import RangedBody
from pipeflow.backends._resumable import ResumableStream
from pipeflow.backends._retry import TRANSIENT_CODES, is_transient, retry_call
from pipeflow.backends._s3config import S3Options, error_for_status
from pipeflow.backends.base import Backend, S3Location, parse_s3_url
from pipeflow.errors import (
    AccessDeniedError,
    BackendError,
    ConfigError,
    ObjectNotFoundError,
    PipeflowError,
    RetryExhaustedError,
)
from pipeflow.items import ObjectInfo

__all__ = ["S3TorchConnectorBackend", "S3TorchConnectorOptions", "crt_error_codes"]

# the codes the binding renders into its exception (see the module docstring)
_CRT_NAME = re.compile(r"\b(AWS_(?:IO|ERROR)_[A-Z0-9_]+)\b")
_HTTP_STATUS = re.compile(r"\bresponse_status: (\d{3})\b")
_S3_CODE = re.compile(r"<Code>([A-Za-z0-9.]+)</Code>")
_KIND = re.compile(r"^(?:Client|Service) error: (Forbidden|No signing credentials|Request throttled)\b")

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
        range_size: bytes per ranged GET of a sequential stream (None: ``part_size``); one open
            stream holds at most two ranges.
        throughput_target_gbps: the CRT's throughput target.
        crt_max_attempts: attempts the CRT makes per request for retryable errors; None (the
            default) derives an attempt count from the retry budget, so there is one budget.
    """

    reader: Literal["sequential", "range_based"] = "sequential"
    part_size: int = 8 << 20
    range_size: int | None = None
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
        check_int(self.crt_max_attempts, "crt_max_attempts", low=1, optional=True)
        if self.access_key is not None:
            raise ConfigError("the s3torchconnector backend takes credentials from the environment or a "
                              "profile only (the CRT client has no key arguments)")

    @property
    def effective_crt_attempts(self) -> int:
        """The attempts the CRT makes per request: ``crt_max_attempts``, else derived from the policy."""
        if self.crt_max_attempts is not None:
            return self.crt_max_attempts
        # the CRT's own backoff (full jitter, 0.5 s scale, 20 s cap, as measured) turns the
        # policy's time budget into an attempt count
        return self.retry.sdk_attempts(sdk_base_delay=0.5, sdk_max_delay=20.0)

    @property
    def effective_range_size(self) -> int:
        """Bytes per ranged GET of a sequential stream."""
        return self.range_size if self.range_size is not None else self.part_size


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

    def _by_code(self, exc: BaseException, url: str, op: str) -> BackendError | None:
        """The typed error the CRT's codes name, None when they name none."""
        codes = crt_error_codes(exc)
        endpoint = self.options.resolved_endpoint() or "the AWS S3 endpoint"
        attempts = self.options.effective_crt_attempts
        if codes.kind in ("Forbidden", "No signing credentials"):
            what = "no usable credentials found" if codes.kind != "Forbidden" else "access denied (403)"
            return AccessDeniedError(what, url=url, backend=self.name, op=op)
        unreachable = sorted(codes.crt & UNREACHABLE_CRT_CODES)
        if unreachable:
            return RetryExhaustedError(f"gave up after {attempts} attempts to reach {endpoint}: "
                                       f"{unreachable[0]}", url=url, backend=self.name, op=op)
        status = codes.status
        if (codes.kind == "Request throttled" or codes.s3 in TRANSIENT_CODES
                or (status is not None and (status >= 500 or status == 429))):
            cause = codes.s3 or status or "throttled"
            return RetryExhaustedError(f"gave up after {attempts} attempts at {endpoint}: {cause}",
                                       url=url, backend=self.name, op=op)
        if status is not None or codes.s3:
            return error_for_status(status, codes.s3, url=url, backend=self.name, op=op)
        return None

    def _error(self, exc: BaseException, loc: S3Location, url: str, op: str) -> BaseException:
        if isinstance(exc, PipeflowError) or not self._is_sdk_error(exc):
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

    def _raise(self, exc: BaseException, loc: S3Location, url: str, op: str) -> None:
        err = self._error(exc, loc, url, op)
        if err is exc:
            raise exc
        raise err from exc

    # ---- listing ---------------------------------------------------------------------------
    def list(self, url: str) -> Iterator[ObjectInfo]:
        loc = parse_s3_url(url, backend=self.name, op="list")
        try:
            pages = iter(self._client().list_objects(loc.bucket, loc.key, "", 1000))
            while True:
                try:
                    page = next(pages)
                except StopIteration:
                    return
                for obj in page.object_info:  # keys arrive in S3's (sorted) order
                    yield _object_info(loc.bucket, obj)
        except Exception as exc:
            if not self._is_sdk_error(exc):
                raise
            typed = self._by_code(exc, url, "list")
            raise typed or BackendError("listing failed (missing bucket or no access)", url=url,
                                        backend=self.name, op="list") from exc

    def info(self, url: str) -> ObjectInfo:
        loc = parse_s3_url(url, backend=self.name, op="info")
        try:
            head = self._client().head_object(loc.bucket, loc.key)
        except Exception as exc:
            self._raise(exc, loc, url, "info")
        return ObjectInfo(url=url, size=int(head.size), etag=_etag(head.etag),
                          mtime=float(head.last_modified))

    # ---- reading ---------------------------------------------------------------------------
    def _ranged(self, loc: S3Location, url: str, start: int, end: int | None) -> IO[bytes]:
        """A bounded stream of ``[start, end)``: ranged GETs of one range at a time."""
        client = self._client()
        body = RangedBody(
            lambda lo, hi: client._get_object_stream(loc.bucket, loc.key, lo, hi),
            start=start, end=end, range_size=self.options.effective_range_size,
            read_timeout=self.options.read_timeout, is_past_end=_is_past_end,
            on_request_error=lambda exc: self._error(exc, loc, url, "open"))
        try:
            body.wait_first()  # a missing object fails at open, as on every backend
        except BaseException:
            body.close()
            raise
        return body  # type: ignore[return-value]

    def _first_range(self, loc: S3Location, url: str, start: int, end: int | None) -> IO[bytes]:
        """The first range, its stalls retried under the policy (the CRT has no read timeout)."""
        try:
            return retry_call(lambda: self._ranged(loc, url, start, end), policy=self.options.retry,
                              url=url, backend=self.name, op="open",
                              classify=lambda exc: isinstance(exc, TimeoutError))
        except RetryExhaustedError as exc:
            if not isinstance(exc.__cause__, TimeoutError):
                raise  # typed by the CRT's codes, already naming the endpoint
            endpoint = self.options.resolved_endpoint() or "the AWS S3 endpoint"
            raise RetryExhaustedError(f"{exc.message} at {endpoint}", url=url, backend=self.name,
                                      op="open") from exc.__cause__

    def _reader(self, loc: S3Location, url: str) -> IO[bytes]:
        from s3torchconnector import S3ReaderConstructor

        try:
            reader = self._client().get_object(loc.bucket, loc.key,
                                               reader_constructor=S3ReaderConstructor.range_based())
            reader.seek(0)
            reader.read(0)
        except Exception as exc:
            self._raise(exc, loc, url, "open")
        return reader

    def _stream(self, url: str, start: int, end: int | None) -> IO[bytes]:
        loc = parse_s3_url(url, backend=self.name, op="open")
        if end is not None and end <= start:
            self.info(url)
            return io.BytesIO(b"")
        ranged = self.options.reader == "range_based" and not start and end is None
        first = self._reader(loc, url) if ranged else self._first_range(loc, url, start, end)

        def reopen(offset: int) -> IO[bytes]:
            return self._ranged(loc, url, offset, end)

        def classify(exc: BaseException) -> bool:
            # the CRT has already retried its requests; a body failing or stalling mid-way is
            # resumed (the reopen's own request failures are typed, hence final)
            return is_transient(exc) or self._is_sdk_error(exc)

        return ResumableStream(reopen, start=start, size=None, policy=self.options.retry, url=url,
                               backend=self.name, first=first, classify=classify)

    def open(self, url: str, *, start: int = 0) -> IO[bytes]:
        return self._stream(url, start, None)

    def read(self, url: str, start: int | None = None, end: int | None = None) -> bytes:
        lo = start or 0
        if lo < 0 or (end is not None and end < 0):
            raise ConfigError(f"read({url!r}): start/end must be non-negative (backend={self.name})")
        with self._stream(url, lo, end) as stream:
            return stream.read()


def _etag(value: Any) -> str | None:
    return value.strip('"') if isinstance(value, str) else None


def _object_info(bucket: str, obj: Any) -> ObjectInfo:
    return ObjectInfo(url=f"s3://{bucket}/{obj.key}", size=int(obj.size), etag=_etag(obj.etag),
                      mtime=float(obj.last_modified))
