"""``s3torchconnector``: the AWS CRT client of the S3 Connector for PyTorch.

Streams come from the connector's readers: ``reader="sequential"`` (one GET streamed from the
start; the connector's default) or ``reader="range_based"`` (ranged GETs on demand, cheap
seeks). Ranged reads and resumptions use one native ranged GET each.

The CRT reports every failure as ``S3Exception`` with only a message, and pipeflow never
classifies by message text. So after a failure the backend asks the store a structural question
instead: it lists the key's prefix; if the bucket lists but the key is absent, the error is
:class:`~pipeflow.errors.ObjectNotFoundError`, otherwise a :class:`~pipeflow.errors.BackendError`
carrying the original exception as its cause.

Retries: the CRT classifies and retries failed *requests* itself, and pipeflow cannot classify
its errors without reading messages, so the CRT stays the request-level retry layer, with the
budget of the backend's :class:`~pipeflow.backends._retry.RetryPolicy`: ``crt_max_attempts``
defaults to ``retry.max_attempts``. Pipeflow adds no loop around requests; it only resumes a
body that breaks off mid-way, with one ranged GET per resumption (whose own failures are final).
So a request that keeps failing gives up after ``retry.max_attempts`` tries, never
``crt_max_attempts * max_attempts``.

Timeouts: ``S3ClientConfig`` of s3torchconnector 1.5 has no connect or read timeout, so the
``timeout`` option cannot be applied; the CRT's built-in connection timeouts apply, and a
server that stalls in the middle of a body is not bounded by pipeflow on this backend.

Credentials come from the CRT's own chain (environment, ``profile=``, shared files, instance
roles): explicit ``access_key``/``secret_key`` are not supported by this SDK.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Literal

from pipeflow.backends._resumable import ResumableStream
from pipeflow.backends._retry import is_transient
from pipeflow.backends._s3config import S3Options
from pipeflow.backends.base import Backend, S3Location, parse_s3_url
from pipeflow.errors import BackendError, ConfigError, ObjectNotFoundError, PipeflowError
from pipeflow.items import ObjectInfo

__all__ = ["S3TorchConnectorBackend", "S3TorchConnectorOptions"]


@dataclass(frozen=True)
class S3TorchConnectorOptions(S3Options):
    """Options of the s3torchconnector backend (plus the shared :class:`S3Options`).

    Attributes:
        reader: ``"sequential"`` or ``"range_based"``.
        part_size: CRT part size in bytes (5 MiB to 5 GiB).
        throughput_target_gbps: the CRT's throughput target.
        crt_max_attempts: attempts the CRT makes per request for retryable errors; None (the
            default) takes ``retry.max_attempts``, so there is one retry budget.
    """

    reader: Literal["sequential", "range_based"] = "sequential"
    part_size: int = 8 << 20
    throughput_target_gbps: float = 10.0
    crt_max_attempts: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.reader not in ("sequential", "range_based"):
            raise ConfigError(f"reader must be 'sequential' or 'range_based', got {self.reader!r}")
        if not isinstance(self.part_size, int) or not (5 << 20) <= self.part_size <= (5 << 30):
            raise ConfigError(f"part_size must be an int between 5 MiB and 5 GiB, got {self.part_size!r}")
        if self.crt_max_attempts is not None and (
                not isinstance(self.crt_max_attempts, int) or isinstance(self.crt_max_attempts, bool)
                or self.crt_max_attempts < 1):
            raise ConfigError(
                f"crt_max_attempts must be a positive int or None, got {self.crt_max_attempts!r}")
        if self.access_key is not None:
            raise ConfigError("the s3torchconnector backend takes credentials from the environment or a "
                              "profile only (the CRT client has no key arguments)")

    @property
    def effective_crt_attempts(self) -> int:
        """The attempts the CRT makes per request: ``crt_max_attempts`` or ``retry.max_attempts``."""
        if self.crt_max_attempts is not None:
            return self.crt_max_attempts
        # the CRT's own backoff (full jitter, 0.5 s scale, 20 s cap, as measured) turns the
        # policy's time budget into an attempt count
        return self.retry.sdk_attempts(sdk_base_delay=0.5, sdk_max_delay=20.0)


class _ChunkStream(io.RawIOBase):
    """A raw stream over the CRT's iterator of body chunks.

    The CRT sends the request lazily and reports its failure on the first chunk. A failure
    before any byte is a failed *request*, already retried by the CRT: ``on_request_error``
    maps it to a typed (final) error. A failure after some bytes is a broken body, raised as
    is for the caller to resume.
    """

    def __init__(self, chunks: Iterator[bytes],
                 on_request_error: Callable[[BaseException], BaseException] | None = None) -> None:
        super().__init__()
        self._chunks = chunks
        self._buf = memoryview(b"")
        self._on_request_error = on_request_error
        self._started = False

    def _next(self) -> bytes:
        try:
            chunk = next(self._chunks)
        except StopIteration:
            raise
        except Exception as exc:
            if self._started or self._on_request_error is None:
                raise
            err = self._on_request_error(exc)
            if err is exc:
                raise
            raise err from exc
        self._started = True
        return chunk

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._buf:
            try:
                self._buf = memoryview(self._next())
            except StopIteration:
                return 0
        n = min(len(buffer), len(self._buf))
        buffer[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def readall(self) -> bytes:
        parts = [bytes(self._buf)]
        self._buf = memoryview(b"")
        while True:
            try:
                parts.append(self._next())
            except StopIteration:
                return b"".join(parts)

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return self.readall()
        return super().read(size) or b""


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

    def _error(self, exc: BaseException, loc: S3Location, url: str, op: str) -> BaseException:
        if isinstance(exc, PipeflowError) or not self._is_sdk_error(exc):
            return exc
        try:
            found = self._probe(loc)
        except Exception:
            return BackendError("S3 request failed (the bucket cannot be listed either)", url=url,
                                backend=self.name, op=op)
        if found is None:
            return ObjectNotFoundError("no such object", url=url, backend=self.name, op=op)
        return BackendError("S3 request failed", url=url, backend=self.name, op=op)

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
            raise BackendError("listing failed (missing bucket or no access)", url=url,
                               backend=self.name, op="list") from exc

    def info(self, url: str) -> ObjectInfo:
        loc = parse_s3_url(url, backend=self.name, op="info")
        try:
            head = self._client().head_object(loc.bucket, loc.key)
        except Exception as exc:
            err = self._error(exc, loc, url, "info")
            if err is exc:
                raise
            raise err from exc
        return ObjectInfo(url=url, size=int(head.size), etag=_etag(head.etag),
                          mtime=float(head.last_modified))

    # ---- reading ---------------------------------------------------------------------------
    def _ranged(self, loc: S3Location, url: str, start: int, end: int | None) -> IO[bytes]:
        try:
            chunks = self._client()._get_object_stream(
                loc.bucket, loc.key, start if (start or end is not None) else None, end)
        except Exception as exc:
            if not self._is_sdk_error(exc):
                raise
            try:
                found = self._probe(loc)
            except Exception:
                found = None
                raise BackendError("S3 request failed (the bucket cannot be listed either)", url=url,
                                   backend=self.name, op="open") from exc
            if found is None:
                raise ObjectNotFoundError("no such object", url=url, backend=self.name, op="open") from exc
            if start and found.size is not None and start >= found.size:
                return io.BytesIO(b"")  # a range starting past the end (S3 answers 416)
            raise BackendError("S3 request failed", url=url, backend=self.name, op="open") from exc
        return _ChunkStream(iter(chunks),  # type: ignore[return-value]
                            on_request_error=lambda exc: self._error(exc, loc, url, "open"))

    def _reader(self, loc: S3Location, url: str) -> IO[bytes]:
        from s3torchconnector import S3ReaderConstructor

        constructor = (S3ReaderConstructor.range_based() if self.options.reader == "range_based"
                       else S3ReaderConstructor.sequential())
        try:
            reader = self._client().get_object(loc.bucket, loc.key, reader_constructor=constructor)
            if self.options.reader == "sequential":
                reader.prefetch()  # starts the GET now, so a missing object fails at open
            else:
                reader.seek(0)
                reader.read(0)
        except Exception as exc:
            err = self._error(exc, loc, url, "open")
            if err is exc:
                raise
            raise err from exc
        return reader

    def _stream(self, url: str, start: int, end: int | None, *, use_reader: bool) -> IO[bytes]:
        loc = parse_s3_url(url, backend=self.name, op="open")
        if end is not None and end <= start:
            self.info(url)
            return io.BytesIO(b"")
        # the connector's readers for whole objects; one native ranged GET for anything else
        first = self._reader(loc, url) if use_reader and not start and end is None \
            else self._ranged(loc, url, start, end)
        if isinstance(first, io.BytesIO):
            return first

        def reopen(offset: int) -> IO[bytes]:
            return self._ranged(loc, url, offset, end)

        def classify(exc: BaseException) -> bool:
            # the CRT has already retried its requests; a body failing mid-way is resumed (the
            # reopen's own failures are typed, hence final: no second loop around requests)
            return is_transient(exc) or self._is_sdk_error(exc)

        return ResumableStream(reopen, start=start, size=None, policy=self.options.retry, url=url,
                               backend=self.name, first=first, classify=classify)

    def open(self, url: str, *, start: int = 0) -> IO[bytes]:
        return self._stream(url, start, None, use_reader=True)

    def read(self, url: str, start: int | None = None, end: int | None = None) -> bytes:
        lo = start or 0
        if lo < 0 or (end is not None and end < 0):
            raise ConfigError(f"read({url!r}): start/end must be non-negative (backend={self.name})")
        with self._stream(url, lo, end, use_reader=False) as stream:
            return stream.read()


def _etag(value: Any) -> str | None:
    return value.strip('"') if isinstance(value, str) else None


def _object_info(bucket: str, obj: Any) -> ObjectInfo:
    return ObjectInfo(url=f"s3://{bucket}/{obj.key}", size=int(obj.size), etag=_etag(obj.etag),
                      mtime=float(obj.last_modified))
