"""``boto3``: ``get_object`` streaming bodies (or ``download_fileobj``) through botocore.

The default backend for ``s3://`` URLs. A ``get_object`` costs exactly one request per object;
``method="download_fileobj"`` uses boto3's managed transfer instead (a HEAD, then parallel
ranged GETs for large objects), which is what many training scripts do.
"""

from __future__ import annotations

import builtins
import io
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, Literal

from pipeflow._checks import check_int, is_int
from pipeflow.backends._resumable import ResumableStream
from pipeflow.backends._retry import retry_call, s3_error_code
from pipeflow.backends._s3config import S3Options, is_invalid_range, translate_s3_error
from pipeflow.backends.base import Backend, S3Location, parse_s3_object_url, parse_s3_url
from pipeflow.errors import BackendError, ConfigError
from pipeflow.items import ObjectInfo

__all__ = ["Boto3Backend", "Boto3Options"]

#: download_fileobj results up to this size stay in memory; larger ones spill to a temp file
_SPOOL_BYTES = 64 << 20
#: files from this size on are uploaded in parts (the transfer manager), smaller ones in one PUT
_MULTIPART_BYTES = 64 << 20


@dataclass(frozen=True)
class Boto3Options(S3Options):
    """Options of the boto3 backend (plus the shared :class:`S3Options`).

    Attributes:
        method: ``"get_object"`` (one request, streamed) or ``"download_fileobj"`` (managed
            transfer into memory or a temporary file).
        max_pool_connections: HTTP connections per process; raise it with ``open(workers=N)``.
        page_size: keys per listing request (at most 1000).
    """

    method: Literal["get_object", "download_fileobj"] = "get_object"
    max_pool_connections: int = 64
    page_size: int = 1000

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.method not in ("get_object", "download_fileobj"):
            raise ConfigError(f"method must be 'get_object' or 'download_fileobj', got {self.method!r}")
        check_int(self.max_pool_connections, "boto3 option max_pool_connections", low=1)
        if not is_int(self.page_size) or not 1 <= self.page_size <= 1000:
            raise ConfigError(f"page_size must be an int in [1, 1000], got {self.page_size!r}")


class Boto3Backend(Backend):
    """S3 through boto3. See :class:`Boto3Options` and :mod:`pipeflow.backends._s3config`."""

    name = "boto3"
    Options = Boto3Options
    options: Boto3Options
    pages_from_any_key = True

    def _make_client(self) -> Any:
        return self.options.boto3_client(max_pool_connections=self.options.max_pool_connections)

    def _call(self, fn: Any, url: str, op: str) -> Any:
        """Run one request with retries, translating SDK errors by code."""
        try:
            return retry_call(fn, policy=self.options.retry, url=url, backend=self.name, op=op,
                              endpoint=self.options.endpoint_label())
        except Exception as exc:
            err = translate_s3_error(exc, url=url, backend=self.name, op=op)
            if err is exc:
                raise
            raise err from exc

    # ---- listing ---------------------------------------------------------------------------
    def list(self, url: str) -> Iterator[ObjectInfo]:
        loc = parse_s3_url(url, backend=self.name, op="list")
        client = self._client()
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": loc.bucket, "Prefix": loc.key,
                                      "MaxKeys": self.options.page_size}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call(lambda kw=kwargs: client.list_objects_v2(**kw), url, "list")
            # S3 returns keys in UTF-8 byte order, which is code point order: already sorted
            for obj in page.get("Contents", ()):
                yield ObjectInfo(url=f"s3://{loc.bucket}/{obj['Key']}", size=int(obj["Size"]),
                                 etag=_etag(obj.get("ETag")), mtime=_mtime(obj.get("LastModified")))
            token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
            if not token:
                return

    def list_page(self, url: str, *, start_after: str | None, limit: int = 1000,
                  ) -> tuple[builtins.list[ObjectInfo], bool]:
        loc = parse_s3_url(url, backend=self.name, op="list")
        client = self._client()
        kwargs: dict[str, Any] = {"Bucket": loc.bucket, "Prefix": loc.key,
                                  "MaxKeys": min(limit, self.options.page_size)}
        if start_after is not None:
            after = parse_s3_url(start_after, backend=self.name, op="list")
            if after.key >= loc.key:
                kwargs["StartAfter"] = after.key
        page = self._call(lambda: client.list_objects_v2(**kwargs), url, "list")
        infos = [ObjectInfo(url=f"s3://{loc.bucket}/{obj['Key']}", size=int(obj["Size"]),
                            etag=_etag(obj.get("ETag")), mtime=_mtime(obj.get("LastModified")))
                 for obj in page.get("Contents", ())]
        return infos, bool(page.get("IsTruncated"))

    def list_prefixes(self, url: str) -> builtins.list[str]:
        loc = parse_s3_url(url, backend=self.name, op="list")
        client = self._client()
        kwargs = {"Bucket": loc.bucket, "Prefix": loc.key, "Delimiter": "/", "MaxKeys": 1000}
        page = self._call(lambda: client.list_objects_v2(**kwargs), url, "list")
        if page.get("IsTruncated"):
            return []  # too many to spread evenly from one page: cut by key instead
        return sorted(f"s3://{loc.bucket}/{p['Prefix']}" for p in page.get("CommonPrefixes", ()))

    def info(self, url: str) -> ObjectInfo:
        loc = parse_s3_object_url(url, backend=self.name, op="info")
        client = self._client()
        head = self._call(lambda: client.head_object(Bucket=loc.bucket, Key=loc.key), url, "info")
        return ObjectInfo(url=url, size=int(head["ContentLength"]), etag=_etag(head.get("ETag")),
                          mtime=_mtime(head.get("LastModified")))

    # ---- reading ---------------------------------------------------------------------------
    def _get(self, loc: S3Location, url: str, start: int, end: int | None,
             etag: str | None) -> tuple[IO[bytes], int | None, str | None]:
        """One ranged GET: (body, total bytes this range will deliver or None, etag)."""
        client = self._client()
        kwargs: dict[str, Any] = {"Bucket": loc.bucket, "Key": loc.key}
        if start or end is not None:
            kwargs["Range"] = f"bytes={start}-" + ("" if end is None else str(end - 1))
        if etag:
            kwargs["IfMatch"] = f'"{etag}"'  # never splice two versions of an object together
        resp = self._call(lambda: client.get_object(**kwargs), url, "open")
        length = resp.get("ContentLength")
        return resp["Body"], (start + int(length)) if length is not None else None, _etag(resp.get("ETag"))

    def _stream(self, url: str, start: int, end: int | None) -> IO[bytes]:
        loc = parse_s3_object_url(url, backend=self.name, op="open")
        if end is not None and end <= start:
            self.info(url)
            return io.BytesIO(b"")
        try:
            body, stop, etag = self._get(loc, url, start, end, None)
        except BackendError as exc:
            if (start or end is not None) and is_invalid_range(exc.__cause__):
                # S3 answers 416 for a range starting at or past the end (of an empty object too)
                return io.BytesIO(b"")
            raise

        def reopen(offset: int) -> IO[bytes]:
            return self._get(loc, url, offset, end, etag)[0]

        return ResumableStream(reopen, start=start, size=stop, policy=self.options.retry, url=url,
                               backend=self.name, endpoint=self.options.endpoint_label(), first=body,
                               translate=lambda exc: translate_s3_error(exc, url=url, backend=self.name,
                                                                        op="read"))

    def open(self, url: str, *, start: int = 0) -> IO[bytes]:
        if self.options.method == "download_fileobj":
            return self._download(url, start)
        return self._stream(url, start, None)

    def read(self, url: str, start: int | None = None, end: int | None = None) -> bytes:
        lo = start or 0
        if lo < 0 or (end is not None and end < 0):
            raise ConfigError(f"read({url!r}): start/end must be non-negative (backend={self.name})")
        if self.options.method == "download_fileobj":
            with self._download(url, lo) as fh:
                return fh.read() if end is None else fh.read(max(0, end - lo))
        with self._stream(url, lo, end) as stream:
            return stream.read()

    def _download(self, url: str, start: int) -> IO[bytes]:
        loc = parse_s3_object_url(url, backend=self.name, op="open")
        client = self._client()
        spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115 - returned

        def fetch() -> None:
            spool.seek(0)
            spool.truncate()
            client.download_fileobj(loc.bucket, loc.key, spool)

        try:
            self._call(fetch, url, "open")
        except BaseException:
            spool.close()
            raise
        spool.seek(start)
        return spool

    # ---- writing ---------------------------------------------------------------------------
    def upload(self, path: str, url: str) -> None:
        """Upload the local file ``path`` as ``url``. S3 makes an object visible only once its
        PUT (or multipart upload, used above 64 MiB and aborted on failure) completes, so
        readers never see a part of it."""
        from boto3.s3.transfer import TransferConfig

        loc = parse_s3_object_url(url, backend=self.name, op="upload")
        client = self._client()
        if os.path.getsize(path) < _MULTIPART_BYTES:
            # one PUT: the transfer manager's threads and futures cost more than a small file
            def put() -> None:
                with open(path, "rb") as body:
                    client.put_object(Bucket=loc.bucket, Key=loc.key, Body=body)

            self._call(put, url, "upload")
            return
        config = TransferConfig(multipart_threshold=_MULTIPART_BYTES,
                                multipart_chunksize=_MULTIPART_BYTES, max_concurrency=4)
        self._call(lambda: client.upload_file(path, loc.bucket, loc.key, Config=config), url,
                   "upload")

    def upload_new(self, path: str, url: str) -> bool:
        """Upload the local file ``path`` as ``url`` unless an object is there already (a
        conditional write, ``If-None-Match: *``): True when this call wrote it, False when
        another writer was first. Two jobs racing to publish one index both end up reading
        the same object."""
        loc = parse_s3_object_url(url, backend=self.name, op="upload")
        client = self._client()
        with open(path, "rb") as fh:
            data = fh.read()
        try:
            self._call(lambda: client.put_object(Bucket=loc.bucket, Key=loc.key, Body=data,
                                                 IfNoneMatch="*"), url, "upload")
        except BackendError as exc:
            code, status = s3_error_code(exc) or ("", None)
            if status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False
            raise
        return True

    def close(self) -> None:
        client, self._client_obj = self._client_obj, None
        if client is not None and hasattr(client, "close"):
            client.close()


def _etag(value: Any) -> str | None:
    return value.strip('"') if isinstance(value, str) else None


def _mtime(value: Any) -> float | None:
    return value.timestamp() if hasattr(value, "timestamp") else None

