"""``iopath``: an iopath ``PathManager`` with its ``S3PathHandler``.

iopath's S3 handler builds its boto3 client without endpoint or addressing options (and looks
for a profile named ``saml`` by default), so pipeflow hands it a client made from the shared S3
options: ``AWS_ENDPOINT_URL`` and path-style addressing then work as for every other backend.

iopath's own ``open`` downloads the whole object into memory before the first byte is returned;
pipeflow uses iopath's chunked reader instead (ranged GETs of ``chunk_size`` bytes, 8 MiB by
default), so one open stream holds at most one chunk. ``chunk_size=None`` restores the
whole-object download. (iopath's chunked reader learns the object's size by starting a GET whose
body it does not read, twice per open: that is iopath's cost, not pipeflow's.) Listing uses
iopath's ``ls`` (one level per call) recursively; iopath reports no sizes, so listed
``ObjectInfo`` items have ``size=None``.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from pipeflow.backends._resumable import ResumableStream
from pipeflow.backends._retry import retry_call
from pipeflow.backends._s3config import S3Options, is_invalid_range, translate_s3_error
from pipeflow.backends.base import Backend, parse_s3_url
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
        loc = parse_s3_url(url, backend=self.name, op="info")
        _, client = self._client()
        head = self._run(lambda: client.head_object(Bucket=loc.bucket, Key=loc.key), url, "info")
        etag = head.get("ETag")
        mtime = head.get("LastModified")
        return ObjectInfo(url=url, size=int(head["ContentLength"]),
                          etag=etag.strip('"') if isinstance(etag, str) else None,
                          mtime=mtime.timestamp() if mtime is not None else None)

    def _open_at(self, url: str, offset: int) -> IO[bytes]:
        parse_s3_url(url, backend=self.name, op="open")
        manager, _ = self._client()
        kwargs = {"read_chunk_size": self.options.chunk_size} if self.options.chunk_size else {}

        def go() -> IO[bytes]:
            fh = manager.open(url, "rb", **kwargs)
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
            if offset and is_invalid_range(exc):
                return io.BytesIO(b"")
            raise

    def open(self, url: str, *, start: int = 0) -> IO[bytes]:
        first = self._open_at(url, start)
        return ResumableStream(lambda off: self._open_at(url, off), start=start, policy=self.options.retry,
                               url=url, backend=self.name, first=first,
                               endpoint=self.options.endpoint_for(url),
                               translate=lambda exc: translate_s3_error(exc, url=url, backend=self.name,
                                                                        op="read"))
