"""The storage backend contract.

A backend knows how to list, stream and read objects of one kind of store. Every backend:

* takes its options as one frozen dataclass (:attr:`Backend.Options`), validated in
  ``__post_init__``; ``Backend(**kwargs)`` builds that dataclass, so
  ``get_backend("boto3", endpoint="http://...")`` and ``Boto3Backend(Boto3Options(endpoint=...))``
  are the same thing;
* creates its SDK client lazily, once per process (:meth:`Backend._client`), and drops it after
  a fork, so one backend object can be handed to DataLoader workers started with ``fork`` or
  ``spawn``; a pickled backend carries options only, never a live client;
* translates SDK errors at its boundary, by error code or exception type, into
  :mod:`pipeflow.errors` types that name the URL, the backend and the operation;
* lists in a deterministic (sorted by URL) order.

Implementations override :meth:`Backend.list`, :meth:`Backend.open`, :meth:`Backend.info`
and :meth:`Backend._make_client`. Two more have defaults a backend may override when it can do
better: :meth:`Backend.read` (in terms of ``open``) and :meth:`Backend.start_batch` (batched
downloads on a thread pool over ``open``; see :mod:`pipeflow.backends.batch`).
"""

from __future__ import annotations

import abc
import builtins
import os
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import IO, Any, ClassVar, Protocol, runtime_checkable
from urllib.parse import unquote, urlsplit

from .._checks import is_int
from .._io import read_exact
from ..errors import ConfigError, InvalidURLError
from ..items import ObjectInfo
from .batch import BatchHandle, ThreadPoolBatch

__all__ = ["Backend", "BackendOptions", "Publisher", "S3Location", "bucket_name_problem", "legacy_name_hint",
           "malformed_scheme", "parse_s3_object_url", "parse_s3_url", "scheme_of"]

#: schemes that only ever name remote stores; "s3:/x" is a typo for "s3://x", never a local path
REMOTE_SCHEMES = frozenset({"s3", "gs", "gcs", "az", "abfs", "abfss", "http", "https", "hf"})


@dataclass(frozen=True)
class BackendOptions:
    """Options every backend accepts. Subclasses add their own fields (all with defaults)."""

    def __post_init__(self) -> None:  # subclasses call super().__post_init__()
        pass


@runtime_checkable
class Publisher(Protocol):
    """The write capability an index or manifest needs from a backend (local, boto3)."""

    def upload(self, path: str, url: str) -> None:
        """Publish the local file ``path`` as ``url``, atomically, replacing what is there."""

    def upload_new(self, path: str, url: str) -> bool:
        """Publish ``path`` as ``url`` unless something is there already; False if it was."""


def scheme_of(url: str) -> str:
    """The URL scheme in lower case (``"s3"``, ``"file"``), or ``""`` for a bare local path.

    Windows drive letters (``C:\\x``) count as bare paths.
    """
    if not isinstance(url, str):
        raise InvalidURLError(f"a URL must be a str, got {type(url).__name__}", url=repr(url))
    head, sep, _ = url.partition("://")
    if not sep or len(head) <= 1 or not head.replace("+", "").replace("-", "").replace(".", "").isalnum():
        return ""
    return head.lower()


def malformed_scheme(url: str, *, schemes: frozenset[str] | set[str] = REMOTE_SCHEMES,
                     backend: str = "", op: str = "") -> InvalidURLError | None:
    """The error for a URL whose scheme lacks its ``//`` (``s3:/bucket/key``), with the URL it
    probably meant; None for any other. Checked before any I/O, so such a URL is never read as
    a relative local path."""
    head, sep, rest = url.partition(":")
    if sep and not rest.startswith("//") and head.lower() in schemes:
        fixed = f"{head}://{rest.lstrip('/')}"
        return InvalidURLError(f"malformed URL: the scheme {head!r} must be followed by '://' "
                               f"(did you mean {fixed!r}?)", url=url, backend=backend, op=op)
    return None


@dataclass(frozen=True)
class S3Location:
    """A parsed ``s3://bucket/key`` URL."""

    bucket: str
    key: str

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IP_ADDRESS = re.compile(r"\d+\.\d+\.\d+\.\d+")
#: what the us-east-1 rules before March 2018 allowed; such buckets can still be read
_LEGACY_BUCKET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,253}[A-Za-z0-9]")


def bucket_name_problem(name: str, *, legacy: bool = False) -> str | None:
    """Why ``name`` is not a valid S3 bucket name (S3's general-purpose bucket rules), or None.

    Checked before anything is started or sent, so a bad name is one line, not a server error.
    With ``legacy=True`` (reading), a name only the pre-2018 us-east-1 rules allow (capitals,
    ``_``, up to 255 characters) passes: such buckets still exist and path-style addressing
    (and S3-compatible stores with relaxed names) can reach them; a "not found" for one then
    says the name is the likely cause (:func:`legacy_name_hint`).
    """
    if (legacy and isinstance(name, str) and _LEGACY_BUCKET_NAME.fullmatch(name) and ".." not in name
            and not _IP_ADDRESS.fullmatch(name)):
        return None
    if not isinstance(name, str) or not _BUCKET_NAME.fullmatch(name):
        return (f"invalid bucket name {name!r}: 3-63 characters of lowercase letters, digits, '.' "
                "and '-', starting and ending with a letter or digit")
    if ".." in name or _IP_ADDRESS.fullmatch(name):
        return f"invalid bucket name {name!r}: no '..' and not an IP address"
    if name.startswith(("xn--", "sthree-")) or name.endswith(("-s3alias", "--ol-s3")):
        return f"invalid bucket name {name!r}: the prefix or suffix is reserved by S3"
    return None


def legacy_name_hint(url: str) -> str:
    """A clause for a "not found" answer about ``url`` whose bucket name only the legacy rules
    allow (the likely mistake: capitals or ``_`` typed in a name), else ""."""
    bucket = url.split("://", 1)[1].partition("/")[0] if url.startswith(("s3://", "S3://")) else ""
    if not bucket or bucket_name_problem(bucket) is None:
        return ""
    return (f"; {bucket!r} is not a valid bucket name by S3's rules since 2018 (lowercase letters, "
            "digits, '.' and '-'): check its spelling")


def parse_s3_url(url: str, *, backend: str = "", op: str = "") -> S3Location:
    """Split ``s3://bucket/key`` into bucket and key (the key may be empty, a prefix).

    Raises:
        InvalidURLError: not an ``s3://`` URL, no bucket, or a bucket name no S3 rules ever
            allowed (the legacy names of old us-east-1 buckets, capitals and ``_``, pass).
    """
    if scheme_of(url) != "s3":
        malformed = malformed_scheme(url, backend=backend, op=op)
        if malformed is not None:
            raise malformed
        raise InvalidURLError("expected an s3://bucket/key URL", url=url, backend=backend, op=op)
    rest = url.split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    if not bucket or "?" in bucket or "#" in bucket:
        raise InvalidURLError("the URL names no bucket", url=url, backend=backend, op=op)
    problem = bucket_name_problem(bucket, legacy=True)
    if problem:
        # a store asked about a name it could never have created answers "no such bucket",
        # which sends the user looking for a bucket instead of at the name
        raise InvalidURLError(problem, url=url, backend=backend, op=op)
    return S3Location(bucket, key)


def parse_s3_object_url(url: str, *, backend: str = "", op: str = "") -> S3Location:
    """:func:`parse_s3_url` for an operation on one object (open, info, upload): a URL that
    names only a bucket (``s3://bucket``, ``s3://bucket/``) is refused before any request.

    S3 answers a GET of the bucket itself with a listing of it, which some clients would hand
    over as the object's bytes; others fail with an SDK validation error that names nothing.

    Raises:
        InvalidURLError: not an ``s3://`` URL, no bucket, or no key.
    """
    loc = parse_s3_url(url, backend=backend, op=op)
    if not loc.key:
        raise InvalidURLError("the URL names a bucket, not an object (s3://bucket/key)", url=url,
                              backend=backend, op=op)
    return loc


def local_path(url: str, *, backend: str = "", op: str = "") -> str:
    """The filesystem path of a ``file://`` URL or a bare path.

    A leading ``~`` is the user's home directory, as in a shell: Python's ``open`` takes it
    literally, and a path written as in a terminal (``"~/data/train"``) must not read as a
    folder named ``~`` in the working directory, nor have shards written into one."""
    scheme = scheme_of(url)
    if scheme == "":
        malformed = malformed_scheme(url, backend=backend, op=op)
        if malformed is not None:
            raise malformed
        return os.path.expanduser(url)
    if scheme != "file":
        raise InvalidURLError("expected a local path or file:// URL", url=url, backend=backend, op=op)
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise InvalidURLError("file:// URLs with a remote host are not supported", url=url,
                              backend=backend, op=op)
    return unquote(parts.path)


class Backend(abc.ABC):
    """Base class of storage backends. See the module docstring for the contract.

    Args:
        options: a ready :attr:`Options` instance, or None to build one from ``**kwargs``.
        **kwargs: fields of :attr:`Options`.
    """

    #: the registry name ("boto3", "local", ...)
    name: ClassVar[str] = "base"
    #: the frozen dataclass of options this backend takes
    Options: ClassVar[type[BackendOptions]] = BackendOptions
    #: True when :meth:`list_page` starts anywhere in the key space for one request (S3's
    #: ``StartAfter``), so a listing can run as several chains of pages at once
    pages_from_any_key: ClassVar[bool] = False

    def __init__(self, options: BackendOptions | None = None, /, **kwargs: Any) -> None:
        if options is None:
            try:
                options = self.Options(**kwargs)
            except TypeError as exc:
                valid = ", ".join(f.name for f in fields(self.Options)) or "none"
                raise ConfigError(f"backend {self.name!r}: {exc}; valid options: {valid}") from exc
        elif kwargs:
            raise ConfigError(f"backend {self.name!r}: pass either an options object or keyword options")
        elif not isinstance(options, self.Options):
            raise ConfigError(f"backend {self.name!r} takes {self.Options.__name__}, "
                              f"got {type(options).__name__}")
        self.options = options
        self._init_runtime()

    @classmethod
    def usable_here(cls) -> bool:
        """Whether this process can use the backend (True; False for an SDK whose runtime does
        not survive a fork, in a process forked after it was used). The registry's choice of a
        default asks it."""
        return True

    # ---- per-process client ---------------------------------------------------------------
    def _init_runtime(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._client_obj: Any = None

    def _client(self) -> Any:
        """The SDK client of this process, created on first use.

        A client made before a fork is never used in the child (its connection pool and
        background threads do not survive a fork); the child makes its own.
        """
        if self._pid != os.getpid():
            # the lock may have been held by another thread at fork time: replace, never acquire
            self._init_runtime()
        client = self._client_obj
        if client is None:
            with self._lock:
                client = self._client_obj
                if client is None:
                    client = self._client_obj = self._make_client()
        return client

    def _make_client(self) -> Any:
        """Create the SDK client (called at most once per process)."""
        return None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.options = state["options"]
        self._init_runtime()

    # ---- the contract ---------------------------------------------------------------------
    @abc.abstractmethod
    def list(self, url: str) -> Iterator[ObjectInfo]:
        """Yield the objects under a prefix (or the one object ``url`` names), sorted by URL.

        A prefix ending in ``/`` lists everything below it, recursively. Listing is paginated:
        items are yielded as pages arrive, but the order is deterministic.

        Raises:
            ObjectNotFoundError: the bucket or directory does not exist.
        """

    def list_page(self, url: str, *, start_after: str | None, limit: int = 1000,
                  ) -> tuple[builtins.list[ObjectInfo], bool]:
        """One page of the listing of ``url``: up to ``limit`` objects whose URL sorts after
        ``start_after`` (from the first when None), and whether more follow.

        The default walks :meth:`list` (O(N) per page); a backend that can start a page at any
        key for one request overrides it and sets :attr:`pages_from_any_key`.
        """
        page: builtins.list[ObjectInfo] = []
        for info in self.list(url):
            if start_after is None or info.url > start_after:
                if len(page) == limit:
                    return page, True
                page.append(info)
        return page, False

    def list_prefixes(self, url: str) -> builtins.list[str]:
        """The "directories" one level below ``url`` (common prefixes up to the next ``/``),
        sorted, from one request; empty when the backend cannot tell them cheaply. A parallel
        listing starts its chains at these boundaries."""
        return []

    def list_before_fork(self, url: str) -> Iterator[ObjectInfo]:
        """:meth:`list`, from a process that may fork workers afterwards (where a pipeline is
        written). A backend whose client does not survive a fork lists without starting it here."""
        return self.list(url)

    @abc.abstractmethod
    def open(self, url: str, *, start: int = 0) -> IO[bytes]:
        """Open an object for streaming, starting at byte ``start``.

        The result is a readable binary file object; it need not be seekable. The caller closes
        it. Remote backends resume an interrupted body with a ranged request.

        Raises:
            ObjectNotFoundError: no such object.
        """

    @abc.abstractmethod
    def info(self, url: str) -> ObjectInfo:
        """Size (and etag/mtime when known) of one object.

        Raises:
            ObjectNotFoundError: no such object.
        """

    def read(self, url: str, start: int | None = None, end: int | None = None) -> bytes:
        """Read bytes ``[start, end)`` of an object (the whole object by default).

        ``end`` past the end of the object is clamped, as with Python slices; negative
        offsets are not supported.
        """
        lo, hi = _check_range(url, self.name, start, end)
        if hi is not None and hi <= lo:
            # still surface a missing object as ObjectNotFoundError
            self.info(url)
            return b""
        with self.open(url, start=lo) as stream:
            return stream.read() if hi is None else read_exact(stream, hi - lo)

    def start_batch(self, pairs: Sequence[tuple[str, str]], *, workdir: str,
                    workers: int = 16) -> BatchHandle:
        """Start downloading ``(url, local path)`` pairs; the handle's ``wait()`` reports per file.

        The default copies through :meth:`open` on ``workers`` threads
        (:class:`~pipeflow.backends.batch.ThreadPoolBatch`); backends with a native batched
        download override it (see :class:`~pipeflow.backends.batch.BatchDownloader`).
        """
        return ThreadPoolBatch(self, pairs, workers=workers)

    def close(self) -> None:
        """Release this process's client. The backend stays usable (a new client is made)."""
        self._client_obj = None

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.options!r})"


def _check_range(url: str, backend: str, start: int | None, end: int | None) -> tuple[int, int | None]:
    lo = 0 if start is None else start
    for value in (start, end):
        if value is not None and (not is_int(value) or value < 0):
            raise ConfigError(f"read({url!r}): start/end must be non-negative ints, got {value!r} "
                              f"(backend={backend})")
    return lo, end
