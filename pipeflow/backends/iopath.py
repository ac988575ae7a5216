"""``iopath``: an iopath ``PathManager`` with its ``S3PathHandler``.

iopath's S3 handler builds its boto3 client without endpoint or addressing options (and looks
for a profile named ``saml`` by default), so pipeflow hands it a client made from the shared S3
options: ``AWS_ENDPOINT_URL`` and path-style addressing then work as for every other backend.

iopath's own ``open`` downloads the whole object into memory before the first byte is returned;
pipeflow uses iopath's chunked reader instead (ranged GETs of ``chunk_size`` bytes, 8 MiB by
default), so one open stream holds at most one chunk. ``chunk_size=None`` restores the
whole-object download. iopath's chunked reader learns the object's size with a GET of its own
whose body it never reads; pipeflow hands the reader a client for that one open whose size
request is the first chunk's ranged GET (the size comes from its ``Content-Range``), kept for
the reader's first read: an object of one chunk costs one GET. Every later chunk is asked for
``If-Match`` the first one's ETag, so an object replaced mid-read fails with
:class:`~pipeflow.errors.ObjectChangedError` instead of mixing versions. Listing uses
iopath's ``ls`` (one level per call) recursively; iopath reports no sizes, so listed
``ObjectInfo`` items have ``size=None``.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, MutableSequence
from dataclasses import dataclass
from typing import IO, Any

from pipeflow.backends._resumable import ResumableStream
from pipeflow.backends._retry import retry_call
from pipeflow.backends._s3config import S3Options, is_invalid_range, translate_s3_error
from pipeflow.backends.base import Backend, parse_s3_object_url, parse_s3_url
from pipeflow.errors import BackendError, ConfigError
from pipeflow.items import ObjectInfo

__all__ = ["IopathBackend", "IopathOptions"]


@dataclass(frozen=True)
class IopathOptions(S3Options):
    """Options of the iopath backend (plus the shared :class:`S3Options`).

    Attributes:
        chunk_size: bytes per ranged GET of iopath's chunked reader (the most one open stream
            holds); None downloads whole objects on open (iopath's own default).
        cache_dir: iopath's local cache directory (used by ``get_local_path`` only).
    """

    chunk_size: int | None = 8 << 20
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.chunk_size is not None and (not isinstance(self.chunk_size, int) or self.chunk_size < 1):
            raise ConfigError(f"chunk_size must be a positive int or None, got {self.chunk_size!r}")


class IopathBackend(Backend):
    """S3 through iopath's PathManager and S3PathHandler."""

    name = "iopath"
    Options = IopathOptions
    options: IopathOptions

    def _make_client(self) -> Any:
        from iopath.common.file_io import PathManager
        from iopath.common.s3 import S3PathHandler

        handler = S3PathHandler(cache_dir=self.options.cache_dir, profile=self.options.profile)
        handler.client = self.options.boto3_client()  # the handler's own has no endpoint options
        manager = PathManager()
        manager.register_handler(handler)
        return manager, handler.client

    def _run(self, fn: Any, url: str, op: str) -> Any:
        try:
            return retry_call(fn, policy=self.options.retry, url=url, backend=self.name, op=op,
                              endpoint=self.options.endpoint_for(url))
        except Exception as exc:
            err = translate_s3_error(exc, url=url, backend=self.name, op=op)
            if err is exc and isinstance(exc, OSError) and not isinstance(exc, BackendError):
                err = BackendError(f"{type(exc).__name__}", url=url, backend=self.name, op=op)
            if err is exc:
                raise
            raise err from exc

    def list(self, url: str) -> Iterator[ObjectInfo]:
        loc = parse_s3_url(url, backend=self.name, op="list")
        manager, _ = self._client()
        found: list[str] = []
        pending = [loc.key]
        while pending:
            prefix = pending.pop()
            entries = self._run(lambda p=prefix: manager.ls(f"s3://{loc.bucket}/{p}"), url, "list")
            for entry in entries:
                if entry.endswith("/") and entry != prefix:
                    pending.append(entry)  # a common prefix: descend
                elif not entry.endswith("/"):
                    found.append(entry)
        for key in sorted(set(found)):
            yield ObjectInfo(url=f"s3://{loc.bucket}/{key}")

    def info(self, url: str) -> ObjectInfo:
        loc = parse_s3_object_url(url, backend=self.name, op="info")
        _, client = self._client()
        head = self._run(lambda: client.head_object(Bucket=loc.bucket, Key=loc.key), url, "info")
        etag = head.get("ETag")
        mtime = head.get("LastModified")
        return ObjectInfo(url=url, size=int(head["ContentLength"]),
                          etag=etag.strip('"') if isinstance(etag, str) else None,
                          mtime=mtime.timestamp() if mtime is not None else None)

    def _open_at(self, url: str, offset: int, etag: MutableSequence[str] | None = None) -> IO[bytes]:
        loc = parse_s3_object_url(url, backend=self.name, op="open")
        manager, client = self._client()
        chunk = self.options.chunk_size

        def go() -> IO[bytes]:
            if chunk is None:
                fh = manager.open(url, "rb")
            else:
                from iopath.common.s3 import S3ChunkReadIO

                fh = S3ChunkReadIO(_OneOpen(client, offset, chunk, etag), loc.bucket, loc.key, chunk)
            length = getattr(fh, "length", None)  # the chunked reader knows the size
            if offset and isinstance(length, int) and offset >= length:
                fh.close()  # its reader would ask for a range past the end (416)
                return io.BytesIO(b"")
            if offset:
                fh.seek(offset)
            return fh

        try:
            return self._run(go, url, "open")
        except BackendError as exc:
            if is_invalid_range(exc):  # a range at or past the end; at 0: an empty object
                return io.BytesIO(b"")
            raise

    def open(self, url: str, *, start: int = 0) -> IO[bytes]:
        etag: MutableSequence[str] = []  # the first chunk's ETag: every later one must match
        first = self._open_at(url, start, etag)
        return ResumableStream(lambda off: self._open_at(url, off, etag), start=start,
                               policy=self.options.retry,
                               url=url, backend=self.name, first=first,
                               endpoint=self.options.endpoint_for(url),
                               translate=lambda exc: translate_s3_error(exc, url=url, backend=self.name,
                                                                        op="read"))


class _OneOpen:
    """The boto3 client as iopath's chunked reader sees it, for one open at ``offset``.

    The reader's first request, a GET of the whole object whose body it never reads (it wants
    the size), becomes the ranged GET of the chunk the reader asks for next; that response is
    kept and handed over when the reader asks for it. Every GET carries ``If-Match`` the ETag
    first seen (shared with the stream's later resumptions through ``etag``).
    """

    def __init__(self, client: Any, offset: int, chunk: int, etag: MutableSequence[str] | None) -> None:
        self._client = client
        self._offset = offset
        self._chunk = chunk
        self._etag = etag if etag is not None else []
        self._first: dict[str, Any] | None = None

    def get_object(self, **kwargs: Any) -> dict[str, Any]:
        if self._etag:
            kwargs["IfMatch"] = f'"{self._etag[0]}"'
        if "Range" not in kwargs:  # the size request: fetch the first chunk instead
            # the reader asks for bytes offset..offset+chunk (its range end is inclusive)
            kwargs["Range"] = f"bytes={self._offset}-{self._offset + self._chunk}"
            resp = self._client.get_object(**kwargs)
            self._remember_etag(resp)
            self._first = resp
            return {"ContentLength": _total_size(resp)}
        first, self._first = self._first, None
        if first is not None and kwargs["Range"].startswith(f"bytes={self._offset}-"):
            return first
        if first is not None:
            first["Body"].close()
        resp = self._client.get_object(**kwargs)
        self._remember_etag(resp)
        return resp

    def _remember_etag(self, resp: dict[str, Any]) -> None:
        etag = resp.get("ETag")
        if not self._etag and isinstance(etag, str):
            self._etag.append(etag.strip('"'))


def _total_size(resp: dict[str, Any]) -> int:
    """The object's size from a ranged GET's ``Content-Range: bytes a-b/total`` (a server that
    ignored the range sent the whole object: its length)."""
    content_range = resp.get("ContentRange")
    if isinstance(content_range, str) and "/" in content_range:
        total = content_range.rsplit("/", 1)[1]
        if total.isdigit():
            return int(total)
    return int(resp["ContentLength"])
