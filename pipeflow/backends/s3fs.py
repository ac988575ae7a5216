"""``s3fs``: ``s3fs.S3FileSystem`` used directly (no fsspec protocol dispatch).

As with the fsspec backend, s3fs's and aiobotocore's own retries are off and the backend's
``RetryPolicy`` is the only retry layer; ``timeout`` becomes botocore's connect/read timeouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeflow.backends._s3config import S3Options
from pipeflow.backends.base import parse_s3_url
from pipeflow.backends.fsspec import FsspecBackend, FsspecOptions, s3fs_kwargs, single_try
from pipeflow.errors import InvalidURLError

__all__ = ["S3fsBackend", "S3fsOptions"]


@dataclass(frozen=True, repr=False)
class S3fsOptions(FsspecOptions):
    """Options of the s3fs backend: the shared :class:`S3Options`, plus ``storage_options``
    (extra ``S3FileSystem`` arguments) and ``block_size``."""


class S3fsBackend(FsspecBackend):
    """S3 through an ``s3fs.S3FileSystem`` made once per process."""

    name = "s3fs"
    Options = S3fsOptions
    options: S3fsOptions

    def _fs(self, url: str) -> tuple[Any, str]:
        loc = parse_s3_url(url, backend=self.name)
        cache = self._client()
        fs = cache.get("s3")
        if fs is None:
            fs = cache["s3"] = self._make_fs("s3", url)
        return fs, f"{loc.bucket}/{loc.key}"

    def _make_fs(self, protocol: str, url: str) -> Any:
        if protocol != "s3":
            raise InvalidURLError("the s3fs backend reads s3:// URLs only", url=url, backend=self.name)
        import s3fs

        options: S3Options = self.options
        return single_try(s3fs.S3FileSystem(**{**s3fs_kwargs(options), **self.options.storage_options}))

    def _unurl(self, fs: Any, path: str, original: str) -> str:
        return f"s3://{path}"
