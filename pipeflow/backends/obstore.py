"""``obstore``: the Rust ``object_store`` client through its Python binding.

One ``S3Store`` per bucket and process, configured from the shared S3 options (endpoint, region,
credentials, path-style, timeouts). A stream is one GET whose body is pulled from the socket as
the reader consumes it, in pieces of at least ``chunk_size`` bytes: the Rust side reads ahead no
further than the piece being assembled, so one open stream holds about ``chunk_size`` bytes
(plus the kernel's socket buffer), whatever the object's size. The first piece is pulled when
the stream is opened, so a stream opened ahead of its reader has its first bytes ready.
With ``read_ahead=N`` a thread per stream keeps pulling while the reader parses, until N
pieces wait unread (at most N + 2 pieces held): the socket is then never left unread, so the
sender never stops and the reader's ``read()`` finds its bytes in hand.

Errors: obstore raises ``FileNotFoundError`` for a missing object or bucket and typed
``PermissionDeniedError``/``UnauthenticatedError`` for refused credentials; those map to
:class:`~pipeflow.errors.ObjectNotFoundError` and :class:`~pipeflow.errors.AccessDeniedError`.
Everything else (a 5xx, an unreachable endpoint, a missing bucket when listing, a refused
range) is one ``GenericError`` type, which pipeflow does not split by its message: the backend
asks the store a structural question instead, a HEAD of the object (of the bucket, for a
listing). A range that starts at or past the end is an empty read, as on every backend; a HEAD
refused as missing or denied gives that typed error; otherwise the failure is transient. A final
"not found" says which is missing, the bucket or the key (obstore's own says neither): one HEAD of
the bucket, on that path only, tells them apart by its typed answer.

Retries: object_store's own retries are off (it counts retries, and spent a budget handed to it
as a count in seconds against a refused connection); every request runs under the backend's
:class:`~pipeflow.backends._retry.RetryPolicy` instead, the same time budget as on every backend:
capped, jittered backoff until the budget's deadline, and the first-contact rule for an endpoint
that never answered. A body that breaks off mid-way is resumed from the byte already delivered
with a ranged GET, under the same policy.

Processes: obstore's Rust runtime does not survive ``fork``. A process forked after it made an
obstore request gets a :class:`~pipeflow.errors.ConfigError` saying so instead of a hang; use
``spawn`` or ``forkserver`` DataLoader workers (or make no request before the fork).

Timeouts: ``timeout=(connect, read)`` become object_store's connect timeout and its read timeout
(the longest wait for the next bytes); its total-request timeout is lifted, since a stream may
legitimately be consumed for hours.
"""

from __future__ import annotations

import datetime as _dt
import io
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, TypeVar

from pipeflow._checks import check_int
from pipeflow._pump import Pump
from pipeflow.backends._obstore_auth import credential_provider
from pipeflow.backends._resumable import ResumableStream
from pipeflow.backends._retry import is_transient, mark_answered, retried_pages, retry_call
from pipeflow.backends._s3config import S3Options
from pipeflow.backends.base import (
    Backend,
    S3Location,
    legacy_name_hint,
    parse_s3_object_url,
    parse_s3_url,
)
from pipeflow.errors import (
    AccessDeniedError,
    ConfigError,
    ObjectNotFoundError,
    PipeflowError,
)
from pipeflow.items import ObjectInfo

if TYPE_CHECKING:  # obstore's option types exist in its stubs only
    from obstore import GetOptions
    from obstore.store import ClientConfig, RetryConfig, S3Config

__all__ = ["ObstoreBackend", "ObstoreOptions", "usable_here"]

#: the process whose obstore runtime is live (the Rust runtime's threads do not survive a fork)
_runtime_pid: int | None = None

T = TypeVar("T")

#: object_store's total-request timeout is meant for small requests; a stream must outlive it
_REQUEST_LIFETIME = _dt.timedelta(days=7)


@dataclass(frozen=True)
class ObstoreOptions(S3Options):
    """Options of the obstore backend (plus the shared :class:`S3Options`).

    Attributes:
        chunk_size: the least bytes handed over per piece of a streamed body.
        page_size: keys per listing request (at most 1000).
        read_ahead: pieces pulled from the connection ahead of the reader, on a thread per
            open stream; one stream then holds at most ``read_ahead + 2`` pieces (3 MiB with
            ``read_ahead=1``). 0 (the default) pulls a piece only when the reader asks for one:
            one piece held, no thread. Measured in the S2 benchmark, reading ahead cut the
            reader's waits 3-6x but did not raise samples/s behind ``prefetch()``, and cost
            5-17 % more client CPU per sample at 4 MB shards.
    """

    chunk_size: int = 1 << 20
    page_size: int = 1000
    read_ahead: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int(self.chunk_size, "obstore chunk_size", low=1)
        check_int(self.page_size, "obstore page_size", low=1)
        check_int(self.read_ahead, "obstore read_ahead", low=0)
        if self.page_size > 1000:
            raise ConfigError(f"obstore page_size must be at most 1000, got {self.page_size!r}")


def usable_here() -> bool:
    """Whether obstore is installed and safe in this process (not forked after it was used)."""
    import importlib.util

    if _runtime_pid is not None and _runtime_pid != os.getpid():
        return False
    return importlib.util.find_spec("obstore") is not None


def _seconds(value: float) -> _dt.timedelta:
    return _dt.timedelta(seconds=value)


class ObstoreBackend(Backend):
    """S3 through obstore (object_store): one store per bucket and process."""

    name = "obstore"
    Options = ObstoreOptions
    options: ObstoreOptions

    @classmethod
    def usable_here(cls) -> bool:
        """False in a process forked after obstore was used here (see :func:`usable_here`)."""
        return usable_here()

    def _make_client(self) -> dict[str, Any]:
        return {}

    def _store(self, bucket: str) -> Any:
        global _runtime_pid
        if _runtime_pid is not None and _runtime_pid != os.getpid():
            raise ConfigError(
                "obstore was used before this process was forked and its runtime does not survive "
                "a fork (it would hang): start DataLoader workers with "
                "multiprocessing_context='spawn' or 'forkserver', or make no obstore request in the "
                "parent process")
        _runtime_pid = os.getpid()
        stores = self._client()
        store = stores.get(bucket)
        if store is None:
            with self._lock:
                store = stores.get(bucket)
                if store is None:
                    store = stores[bucket] = self._new_store(bucket)
        return store

    def _new_store(self, bucket: str) -> Any:
        from obstore.store import S3Store

        opts = self.options
        config: S3Config = {"region": opts.resolved_region(),
                            "virtual_hosted_style_request": not opts.use_path_style()}
        endpoint = opts.resolved_endpoint()
        if endpoint:
            config["endpoint"] = endpoint
        provider = None
        if opts.access_key and opts.secret_key is not None:
            config["access_key_id"] = opts.access_key
            config["secret_access_key"] = opts.secret_key
            if opts.session_token:
                config["session_token"] = opts.session_token
        else:
            provider = credential_provider(opts, bucket)
        client: ClientConfig = {"allow_http": bool(endpoint and endpoint.startswith("http://")),
                                "timeout": _REQUEST_LIFETIME}
        if opts.timeout is not None:
            client["connect_timeout"] = _seconds(opts.connect_timeout or 0)
            client["read_timeout"] = _seconds(opts.read_timeout or 0)
        # pipeflow's RetryPolicy is the only retry layer (one try per object_store request)
        retry: RetryConfig = {"max_retries": 0, "retry_timeout": _REQUEST_LIFETIME}
        return S3Store(bucket, config=config, client_options=client, retry_config=retry,
                       credential_provider=provider)

    # ---- errors ----------------------------------------------------------------------------
    def _typed(self, exc: BaseException, url: str, op: str) -> BaseException | None:
        """The typed error obstore's exception type names, None for its generic error."""
        from obstore.exceptions import GenericError, PermissionDeniedError, UnauthenticatedError

        if isinstance(exc, PipeflowError):
            return exc
        if isinstance(exc, FileNotFoundError):
            return ObjectNotFoundError("no such object or bucket", url=url, backend=self.name, op=op)
        if isinstance(exc, (PermissionDeniedError, UnauthenticatedError)):
            return AccessDeniedError(f"access denied ({type(exc).__name__})", url=url, backend=self.name,
                                     op=op)
        if isinstance(exc, GenericError):
            return None
        return exc

    def _final(self, exc: BaseException, loc: S3Location, url: str, op: str) -> BaseException | None:
        """The typed, final error for ``exc``; None when it is transient (to be retried).

        obstore's generic error is split by a HEAD of the object (of the bucket, ``""``, for a
        listing): a HEAD refused as missing or denied is that error; a HEAD that fails too, or
        succeeds (the store answers: one request failed), leaves the failure transient.
        """
        typed = self._typed(exc, url, op)
        if typed is not None:
            return self._named(typed, loc, op) if self._is_final(typed) else None
        import obstore

        try:
            obstore.head(self._store(loc.bucket), "" if op == "list" else loc.key)
        except Exception as probe:
            typed = self._typed(probe, url, op)
            if typed is not None and self._is_final(typed):
                mark_answered(self.options.endpoint_label())
                return self._named(typed, loc, op)
            return None
        mark_answered(self.options.endpoint_label())
        return None

    def _named(self, err: BaseException, loc: S3Location, op: str) -> BaseException:
        """``err``, or for a "not found" the one that says which is missing, the bucket or the
        key: obstore's NotFound says neither. A listing that found no bucket is about the bucket
        (its probe was the bucket's HEAD); otherwise one HEAD of the bucket tells, by its typed
        answer. A HEAD that fails otherwise leaves the "object or bucket" of before."""
        if not isinstance(err, ObjectNotFoundError):
            return err
        url, bucket = err.url, loc.bucket
        if op == "list" or not loc.key:
            missing: bool | None = True
        else:
            missing = self._bucket_missing(bucket)
        if missing is None:
            return err
        what = (f"no such bucket {bucket!r}{legacy_name_hint(url)}" if missing
                else f"no such key {loc.key!r} in bucket {bucket!r}")
        return ObjectNotFoundError(what, url=url, backend=self.name, op=op)

    def _bucket_missing(self, bucket: str) -> bool | None:
        """True: a HEAD of the bucket answered "not found"; False: it answered; None: neither."""
        import obstore

        try:
            obstore.head(self._store(bucket), "")
        except FileNotFoundError:
            return True
        except Exception:
            return None
        return False

    @staticmethod
    def _is_final(err: BaseException) -> bool:
        return isinstance(err, PipeflowError) or not is_transient(err)

    def _call(self, fn: Callable[[], T], loc: S3Location, url: str, op: str) -> T:
        """Run one request under the retry policy; typed errors on failure."""

        def attempt() -> T:
            try:
                return fn()
            except Exception as exc:
                final = self._final(exc, loc, url, op)
                if final is None or final is exc:
                    raise
                raise final from exc

        return retry_call(attempt, policy=self.options.retry, url=url, backend=self.name, op=op,
                          endpoint=self.options.endpoint_label(), classify=self._transient)

    @staticmethod
    def _transient(exc: BaseException) -> bool:
        from obstore.exceptions import BaseError

        if isinstance(exc, PipeflowError):
            return False
        return isinstance(exc, BaseError) or is_transient(exc)

    # ---- writing ---------------------------------------------------------------------------
    def upload(self, path: str, url: str) -> None:
        """Upload the local file ``path`` as ``url``: one PUT, or a multipart upload for files
        larger than object_store's part size (aborted on failure). S3 makes the object visible
        only once it completes, so readers never see a part of it."""
        import pathlib

        import obstore

        loc = parse_s3_object_url(url, backend=self.name, op="upload")

        def put() -> None:
            # no HEAD probe as for reads (the object is not expected to exist yet): a missing
            # bucket or refused credentials are typed by obstore; its generic error is retried
            try:
                obstore.put(self._store(loc.bucket), loc.key, pathlib.Path(path))
            except Exception as exc:
                typed = self._typed(exc, url, "upload")
                if typed is None or typed is exc:
                    raise
                raise self._named(typed, S3Location(loc.bucket, ""), "upload") from exc

        retry_call(put, policy=self.options.retry, url=url, backend=self.name, op="upload",
                   endpoint=self.options.endpoint_label(), classify=self._transient)

    # ---- listing ---------------------------------------------------------------------------
    def list(self, url: str) -> Iterator[ObjectInfo]:
        import obstore

        loc = parse_s3_url(url, backend=self.name, op="list")
        # object_store lists whole path segments ("data/sam" means "data/sam/"): list the
        # enclosing segment from just before the prefix and stop at the first key past it, so
        # a prefix costs its own keys' pages, not its whole directory's
        parent = loc.key.rpartition("/")[0]
        store = self._store(loc.bucket)
        last: list[str] = [_just_before(loc.key)] if loc.key and not loc.key.endswith("/") else []

        def open_pages() -> Any:
            return obstore.list(store, parent or None, offset=last[-1] if last else None,
                                chunk_size=self.options.page_size)

        for batch in retried_pages(open_pages, lambda page: self._call(page, loc, url, "list")):
            # S3 returns keys in UTF-8 byte order, which is code point order: already sorted
            for meta in batch:
                last[:] = [meta["path"]]  # a failed listing restarts after it
                if meta["path"].startswith(loc.key):
                    yield _object_info(loc.bucket, meta)
                elif meta["path"] > loc.key:
                    return

    def list_before_fork(self, url: str) -> Iterator[ObjectInfo]:
        if _runtime_pid == os.getpid():
            return self.list(url)  # the runtime is live here already: nothing left to keep
        from pipeflow.backends._obstore_list import list_in_child

        return list_in_child(self.options, url)

    def info(self, url: str) -> ObjectInfo:
        import obstore

        loc = parse_s3_object_url(url, backend=self.name, op="info")
        meta = self._call(lambda: obstore.head(self._store(loc.bucket), loc.key), loc, url, "info")
        return _object_info(loc.bucket, meta, url)

    # ---- reading ---------------------------------------------------------------------------
    def _get(self, loc: S3Location, url: str, start: int, end: int | None) -> IO[bytes]:
        import obstore

        options: GetOptions = {}
        if end is not None:
            options["range"] = (start, end)
        elif start:
            options["range"] = {"offset": start}

        def get() -> Any:
            try:
                return obstore.get(self._store(loc.bucket), loc.key, options=options or None)
            except Exception as exc:
                # a range starting at or past the end (S3 answers 416), an empty object's too
                if options and self._typed(exc, url, "open") is None and self._past_end(loc, start):
                    return None
                raise

        result = self._call(get, loc, url, "open")
        if result is None:
            return io.BytesIO(b"")
        body = _Body(iter(result.stream(min_chunk_size=self.options.chunk_size)),
                     ahead=self.options.read_ahead)
        # the first piece is pulled here, on the thread that opens the object: a stream opened
        # ahead (open() keeps the next shard opened while one is read) then has its first bytes
        # in hand when the reader reaches it, instead of asking the connection for them only then
        body.prefetch()
        return body  # type: ignore[return-value]

    def _past_end(self, loc: S3Location, start: int) -> bool:
        import obstore

        try:
            size = obstore.head(self._store(loc.bucket), loc.key)["size"]
        except Exception:  # the caller reports the original failure
            return False
        return start >= int(size)

    def _stream(self, url: str, start: int, end: int | None) -> IO[bytes]:
        loc = parse_s3_object_url(url, backend=self.name, op="open")
        if end is not None and end <= start:
            self.info(url)
            return io.BytesIO(b"")
        first = self._get(loc, url, start, end)
        if isinstance(first, io.BytesIO):
            return first

        def classify(exc: BaseException) -> bool:
            from obstore.exceptions import BaseError

            # a body that fails mid-way is resumed; the reopen's own failures are typed (final)
            return is_transient(exc) or (isinstance(exc, BaseError) and self._typed(exc, url, "read") is None)

        return ResumableStream(lambda offset: self._get(loc, url, offset, end), start=start, size=None,
                               policy=self.options.retry, url=url, backend=self.name, first=first,
                               classify=classify)

    def open(self, url: str, *, start: int = 0) -> IO[bytes]:
        return self._stream(url, start, None)

    def read(self, url: str, start: int | None = None, end: int | None = None) -> bytes:
        lo = start or 0
        if lo < 0 or (end is not None and end < 0):
            raise ConfigError(f"read({url!r}): start/end must be non-negative (backend={self.name})")
        with self._stream(url, lo, end) as stream:
            return stream.read()


class _Body(io.RawIOBase):
    """A raw stream over obstore's iterator of body pieces.

    With ``ahead=0`` a piece is pulled from the connection only when the reader asks for one,
    and one piece is held at a time. With ``ahead=N`` a thread keeps pulling while the reader
    works, until N pieces wait unread: the stream then holds at most N + 2 pieces (the N
    waiting, the one being read, the one the thread has in hand).
    """

    def __init__(self, pieces: Iterator[Any], ahead: int = 0) -> None:
        super().__init__()
        self._pieces = pieces
        self._buf = memoryview(b"")
        #: the most bytes held at once: the piece being read, plus those pulled ahead
        self.peak_buffered = 0
        self._failed: BaseException | None = None  # a failure of prefetch(), for the first read
        self._ahead = _ReadAhead(pieces, ahead) if ahead > 0 else None
        self._pulled = 0
        self._last = 0  # the size of the piece being read (read-ahead counts it as held)

    def readable(self) -> bool:
        return True

    def prefetch(self) -> None:
        """Pull the first piece now (with read-ahead: start the thread that pulls them). A
        failure is raised by the first read instead, where a broken body is resumed like any
        other."""
        if self._ahead is not None:
            self._ahead.start()
            return
        try:
            self._fill()
        except Exception as exc:
            self._failed = exc

    def _next(self) -> Any:
        if self._ahead is not None:
            piece = self._ahead.next(self._last)
            self._last = len(piece)
            return piece
        return next(self._pieces)

    @property
    def pulled(self) -> int:
        """Pieces taken from the connection so far."""
        return self._ahead.pulled if self._ahead is not None else self._pulled

    def _fill(self) -> bool:
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed
        while not self._buf:
            try:
                piece = self._next()
            except StopIteration:
                return False
            self._buf = memoryview(piece).cast("B")
            if self._ahead is None:
                self._pulled += 1
                self.peak_buffered = max(self.peak_buffered, len(self._buf))
            else:
                self.peak_buffered = max(self.peak_buffered, self._ahead.peak_held)
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._fill():
            return 0
        n = min(len(buffer), len(self._buf))
        buffer[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self.readall()
        if not self._fill():
            return b""
        out = bytes(self._buf[:size])
        self._buf = self._buf[len(out):]
        return out

    def readall(self) -> bytes:
        parts = []
        while self._fill():
            parts.append(bytes(self._buf))
            self._buf = memoryview(b"")
        return b"".join(parts)

    def close(self) -> None:
        self._buf = memoryview(b"")
        if self._ahead is not None:
            self._ahead.stop()
        self._pieces = iter(())  # drops the response: object_store closes the connection
        super().close()


class _ReadAhead:
    """A thread that pulls pieces into a queue of at most ``limit`` while the reader works.

    The connection is then read while the reader parses, instead of only inside ``read()``:
    a socket left unread fills, the server (or a proxy) stops sending, and the reader's next
    ``read()`` waits a whole round trip for bytes that could have been on their way.
    """

    def __init__(self, pieces: Iterator[Any], limit: int) -> None:
        self._pieces: Iterator[Any] | None = pieces
        # the thread owns the response from its start on; a broken body reaches the reader,
        # which resumes it
        self._pump = Pump(self._pull, maxsize=limit, name="pipeflow-obstore-read-ahead")
        self.pulled = 0  # pieces taken from the connection
        self._pulled_bytes = 0
        self._done_bytes = 0  # of pieces the reader has finished
        #: the most bytes pulled and not yet finished by the reader, at once
        self.peak_held = 0

    def start(self) -> None:
        self._pump.start()

    def _pull(self, pump: Pump) -> None:
        pieces, self._pieces = self._pieces, None
        assert pieces is not None
        for piece in pieces:
            self.pulled += 1
            self._pulled_bytes += len(piece)
            self.peak_held = max(self.peak_held, self._pulled_bytes - self._done_bytes)
            if not pump.put(piece):
                return

    def next(self, finished: int) -> Any:
        """The next piece, once the reader has finished the previous one (``finished`` bytes);
        at the end StopIteration, after a failure its exception (on every later call too)."""
        self._done_bytes += finished
        return self._pump.get()

    def stop(self) -> None:
        """Stop pulling and drop what was pulled; the thread ends when its current pull returns
        (object_store's read timeout bounds that), dropping the response."""
        self._pump.stop(join=1.0)


def _just_before(prefix: str) -> str:
    """A key that sorts before every key starting with ``prefix`` and after as many others as
    can be told: "data/sam" -> "data/sal" + U+10FFFF, the greatest code point (and the greatest
    UTF-8 sequence, S3's order). A listing that starts after it (exclusive) starts at the prefix."""
    before = ord(prefix[-1]) - 1
    if before < 0:
        return prefix[:-1]
    if 0xD800 <= before <= 0xDFFF:  # surrogates are no characters of a key
        before = 0xD7FF
    return prefix[:-1] + chr(before) + "\U0010ffff"


def _object_info(bucket: str, meta: Any, url: str | None = None) -> ObjectInfo:
    etag = meta.get("e_tag")
    mtime = meta.get("last_modified")
    return ObjectInfo(url=url or f"s3://{bucket}/{meta['path']}", size=int(meta["size"]),
                      etag=etag.strip('"') if isinstance(etag, str) else None,
                      mtime=mtime.timestamp() if mtime is not None else None)
