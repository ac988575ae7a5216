"""``fsspec``: any fsspec URL (``s3://`` through s3fs, ``gs://``, ``http://``, ``memory://``...).

For ``s3://`` the shared S3 options (endpoint, region, credentials, path-style, timeouts) are
translated into s3fs arguments, so ``AWS_ENDPOINT_URL`` alone is enough; ``storage_options`` adds
or overrides filesystem arguments for any protocol.

Retries: s3fs retries on its own (``S3FileSystem.retries``, 5 tries with backoff up to 15 s,
SlowDown included) and so does aiobotocore underneath. Both are turned off for ``s3://``
(one try each), and every call here runs under the backend's
:class:`~pipeflow.backends._retry.RetryPolicy` instead: one retry layer, a bounded time to give
up, and streams still resume mid-body from the byte already delivered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

from pipeflow.backends._resumable import ResumableStream
from pipeflow.backends._retry import retry_call
from pipeflow.backends._s3config import (
    S3Options,
    is_invalid_range,
    on_aws_s3,
    on_s3_endpoint,
    translate_s3_error,
)
from pipeflow.backends.base import Backend, bucket_name_problem, malformed_scheme, scheme_of
from pipeflow.errors import (
    BackendError,
    ConfigError,
    InvalidURLError,
    MissingDependencyError,
    ObjectNotFoundError,
    PipeflowError,
)
from pipeflow.items import ObjectInfo

__all__ = ["FsspecBackend", "FsspecOptions", "s3fs_kwargs", "single_try"]

T = TypeVar("T")

#: schemes whose first path segment is a bucket (or container), never an object
_BUCKET_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})


@dataclass(frozen=True)
class FsspecOptions(S3Options):
    """Options of the fsspec backend (plus the shared :class:`S3Options`, used for ``s3://``).

    Attributes:
        storage_options: extra keyword arguments for the filesystem constructor.
        block_size: read block size of opened files (None: the filesystem's default).
    """

    storage_options: Mapping[str, Any] = field(default_factory=dict)
    block_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.storage_options, Mapping):
            raise ConfigError(f"storage_options must be a mapping, got {type(self.storage_options).__name__}")
        if self.block_size is not None and (not isinstance(self.block_size, int) or self.block_size < 1):
            raise ConfigError(f"block_size must be a positive int, got {self.block_size!r}")

    def __repr__(self) -> str:  # storage_options may hold secrets: show only the names
        names = sorted(self.storage_options)
        return (f"{type(self).__name__}(endpoint={self.endpoint!r}, region={self.region!r}, "
                f"profile={self.profile!r}, storage_options=<{', '.join(names)}>)")


def s3fs_kwargs(options: S3Options) -> dict[str, Any]:
    """s3fs.S3FileSystem arguments equivalent to the shared S3 options."""
    kwargs: dict[str, Any] = {
        "skip_instance_cache": True,  # one filesystem per backend and process, never shared
        "use_listings_cache": False,  # listings must reflect the store, not a stale cache
        "client_kwargs": {"region_name": options.resolved_region()},
    }
    endpoint = options.resolved_endpoint()
    if endpoint:
        kwargs["endpoint_url"] = endpoint
    # botocore Config for aiobotocore: path-style, connect/read timeouts, no SDK retries
    kwargs["config_kwargs"] = options.botocore_config_kwargs()
    if options.profile:
        kwargs["profile"] = options.profile
    if options.access_key:
        kwargs.update(key=options.access_key, secret=options.secret_key)
        if options.session_token:
            kwargs["token"] = options.session_token
    return kwargs


def single_try(fs: Any) -> Any:
    """Turn off s3fs's own retry loop on an ``S3FileSystem`` (one try per call); returns it.

    ``retries`` is a class attribute of ``S3FileSystem`` and no constructor argument (an
    unknown keyword would reach botocore), so it is set on the instance.
    """
    fs.retries = 1
    return fs


def _missing_filesystem(protocol: str, exc: ImportError) -> MissingDependencyError:
    """The typed error for a protocol whose filesystem package is missing, with fsspec's own
    hint (it knows which package each protocol needs, and pipeflow has no extra for most).

    The package to install is the module the import missed (``sftp``'s filesystem class lives
    inside fsspec, which is installed: the missing piece is ``paramiko``), else the top package
    of the filesystem class; with neither known, fsspec's hint alone is the advice.
    """
    from fsspec.registry import known_implementations

    known = known_implementations.get(protocol, {})
    hint = known.get("err") or f"install the fsspec filesystem for {protocol!r}"
    package = _missed_module(exc) or str(known.get("class", "")).partition(".")[0]
    if not package or package == "fsspec":
        return MissingDependencyError(f"a package for {protocol}://", "fsspec", str(hint))
    return MissingDependencyError(package, "fsspec", f"pip install {package} ({hint})")


def _missed_module(exc: BaseException | None) -> str:
    """The top package of the module an import failed on (fsspec raises its own ImportError
    from the original one), or "" when the chain names none other than fsspec."""
    seen = 0
    while exc is not None and seen < 8:  # a short chain; the bound guards a cycle
        name = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
        if name and name.split(".")[0] != "fsspec":
            return str(name.split(".")[0])
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return ""


class FsspecBackend(Backend):
    """Objects through an fsspec filesystem chosen by the URL's protocol."""

    name = "fsspec"
    Options = FsspecOptions
    options: FsspecOptions

    # one filesystem per protocol, per process
    def _make_client(self) -> dict[str, Any]:
        return {}

    def _fs(self, url: str) -> tuple[Any, str]:
        """The filesystem for ``url`` and the path to give it."""
        protocol = scheme_of(url)
        if not protocol:
            malformed = malformed_scheme(url, backend=self.name)
            if malformed is not None:  # "s3:/b/k" is a typo, not a relative local path
                raise malformed
            protocol = "file"
        meant = on_s3_endpoint(url) if protocol in ("http", "https") else None
        if meant is not None:
            raise InvalidURLError(f"this URL is on the S3 endpoint: name it {meant!r} (the "
                                  "endpoint comes from AWS_ENDPOINT_URL)", url=url, backend=self.name)
        bucket = url.split("://", 1)[1].partition("/")[0] if protocol in ("s3", "s3a") else ""
        problem = bucket_name_problem(bucket, legacy=True) if bucket else None
        if problem:  # S3 would answer "no such bucket"
            raise InvalidURLError(problem, url=url, backend=self.name)
        cache = self._client()
        fs = cache.get(protocol)
        if fs is None:
            fs = cache[protocol] = self._make_fs(protocol, url)
        return fs, self._strip(fs, url)

    def _object_fs(self, url: str, op: str) -> tuple[Any, str]:
        """:meth:`_fs` for one object: a URL that names only a bucket of an object store is
        refused before any request (see :func:`~pipeflow.backends.base.parse_s3_object_url`)."""
        scheme = scheme_of(url)
        if scheme in _BUCKET_SCHEMES and not url.split("://", 1)[1].partition("/")[2]:
            raise InvalidURLError(f"the URL names a bucket, not an object ({scheme}://bucket/key)",
                                  url=url, backend=self.name, op=op)
        return self._fs(url)

    def _strip(self, fs: Any, url: str) -> str:
        return fs._strip_protocol(url)

    def _make_fs(self, protocol: str, url: str) -> Any:
        import fsspec

        kwargs: dict[str, Any] = {}
        if protocol in ("s3", "s3a"):
            kwargs.update(s3fs_kwargs(self.options))
        else:
            kwargs["skip_instance_cache"] = True
        kwargs.update(self.options.storage_options)
        try:
            fs = fsspec.filesystem(protocol, **kwargs)
        except ValueError as exc:  # fsspec: "Protocol not known"
            raise InvalidURLError(f"fsspec does not know the protocol {protocol!r}", url=url,
                                  backend=self.name, op="open") from exc
        except ImportError as exc:  # the protocol's filesystem (gcs: gcsfs) is not installed
            raise _missing_filesystem(protocol, exc) from exc
        if protocol in ("s3", "s3a"):
            single_try(fs)
        return fs

    def _unurl(self, fs: Any, path: str, original: str) -> str:
        """Turn a filesystem path back into a URL of the same form as the one asked for."""
        protocol = scheme_of(original)
        if not protocol:
            return path
        return fs.unstrip_protocol(path) if protocol != "s3a" else f"s3a://{path}"

    def _error(self, exc: BaseException, url: str, op: str) -> BaseException:
        err = translate_s3_error(exc, url=url, backend=self.name, op=op)
        if err is exc and isinstance(exc, OSError) and not isinstance(exc, PipeflowError):
            return BackendError(f"{type(exc).__name__} (errno {exc.errno})", url=url, backend=self.name,
                                op=op)
        return err

    def _call(self, fn: Callable[[], T], url: str, op: str) -> T:
        """Run one filesystem call under the retry policy; typed errors on failure."""
        try:
            return retry_call(fn, policy=self.options.retry, url=url, backend=self.name, op=op,
                              endpoint=self.options.endpoint_for(url))
        except Exception as exc:
            err = self._error(exc, url, op)
            if err is exc:
                raise
            raise err from exc

    def list(self, url: str) -> Iterator[ObjectInfo]:
        meant = on_aws_s3(url)
        if meant is not None:
            raise InvalidURLError(f"an S3 prefix cannot be listed over HTTP (S3 answers with XML, not "
                                  f"links): name it {meant!r}", url=url, backend=self.name, op="list")
        fs, path = self._fs(url)

        def find() -> dict[str, Any]:
            if url.endswith("/") or fs.isdir(path):
                return fs.find(path, detail=True)
            parent, _, base = path.rpartition("/")
            if fs.isfile(path):
                return {path: fs.info(path)}
            return fs.find(parent, prefix=base, detail=True) if parent else {}

        found = self._call(find, url, "list")
        for p in sorted(found):
            entry = found[p]
            if entry.get("type", "file") != "file":
                continue
            yield self._object_info(fs, self._unurl(fs, p, url), entry)

    def _object_info(self, fs: Any, url: str, entry: Mapping[str, Any]) -> ObjectInfo:
        etag = entry.get("ETag") or entry.get("etag")
        mtime: Any = entry.get("LastModified") or entry.get("mtime") or entry.get("created")
        if hasattr(mtime, "timestamp"):
            mtime = mtime.timestamp()
        return ObjectInfo(url=url, size=entry.get("size"),
                          etag=etag.strip('"') if isinstance(etag, str) else None,
                          mtime=float(mtime) if isinstance(mtime, (int, float)) else None)

    def info(self, url: str) -> ObjectInfo:
        fs, path = self._object_fs(url, "info")
        entry = self._call(lambda: fs.info(path), url, "info")
        if entry.get("type", "file") != "file":
            raise ObjectNotFoundError("is a directory, not an object", url=url, backend=self.name, op="info")
        return self._object_info(fs, url, entry)

    def _open_at(self, fs: Any, path: str, url: str, offset: int) -> IO[bytes]:
        kwargs = {"block_size": self.options.block_size} if self.options.block_size else {}

        def go() -> IO[bytes]:
            fh = fs.open(path, "rb", **kwargs)
            if offset:
                fh.seek(offset)
            return fh

        return self._call(go, url, "open")

    def open(self, url: str, *, start: int = 0) -> IO[bytes]:
        fs, path = self._object_fs(url, "open")
        first = self._open_at(fs, path, url, start)
        size = getattr(first, "size", None)
        return ResumableStream(lambda off: self._open_at(fs, path, url, off), start=start,
                               size=size if isinstance(size, int) else None,
                               policy=self.options.retry, url=url, backend=self.name, first=first,
                               endpoint=self.options.endpoint_for(url),
                               translate=lambda exc: self._error(exc, url, "read"))

    def read(self, url: str, start: int | None = None, end: int | None = None) -> bytes:
        lo = start or 0
        if lo < 0 or (end is not None and end < 0):
            raise ConfigError(f"read({url!r}): start/end must be non-negative (backend={self.name})")
        fs, path = self._object_fs(url, "read")
        if end is not None and end <= lo:
            self.info(url)
            return b""
        try:
            return self._call(lambda: fs.cat_file(path, start=lo or None, end=end), url, "read")
        except BackendError as exc:
            if (lo or end is not None) and is_invalid_range(exc.__cause__):
                return b""  # a range starting at or past the end (an empty object's), as with slices
            raise

    def close(self) -> None:
        self._client_obj = None
