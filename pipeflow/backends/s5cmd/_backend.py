"""The s5cmd backend class: listing, heads and streams, each retried under the policy."""

from __future__ import annotations

import io
import json
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import IO, Any

from ..._checks import is_int
from ...errors import BackendError, ConfigError
from ...items import ObjectInfo
from .._resumable import ResumableStream
from .._retry import retry_call
from .._subprocess import kill_process, read_tail, spawn
from ..base import Backend, S3Location, parse_s3_object_url, parse_s3_url
from ._batch import S5cmdBatch
from ._binary import find_s5cmd
from ._cat import open_cat
from ._command import child_environment, command_line, transfer_flags
from ._errors import error_from_output, errors_in
from ._options import S5cmdOptions

__all__ = ["S5cmdBackend"]

#: characters s5cmd treats as wildcards in a source URL
GLOB_CHARS = "*?["


def _parse_time(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _info(record: Mapping[str, Any], url: str | None = None) -> ObjectInfo:
    etag = record.get("etag")
    return ObjectInfo(
        url=url or str(record["key"]),
        size=int(record.get("size") or 0),  # s5cmd omits "size" for empty objects
        etag=str(etag).strip('"') if etag else None,
        mtime=_parse_time(record.get("last_modified")),
    )


class S5cmdBackend(Backend):
    """Objects in S3 through the s5cmd binary. See :mod:`pipeflow.backends.s5cmd`.

    Args:
        options: an :class:`S5cmdOptions`, or None to build one from ``**kwargs``.
    """

    name = "s5cmd"
    Options = S5cmdOptions
    options: S5cmdOptions

    # ---- command lines ----------------------------------------------------------------------
    def binary(self) -> str:
        """The s5cmd executable this backend runs."""
        return find_s5cmd(self.options.binary)

    def command(self, *args: str, json_output: bool = True) -> list[str]:
        """The argv of one single s5cmd call (s5cmd's own retries off: the policy retries it)."""
        return command_line(self.options, *args, json_output=json_output)

    def environment(self) -> dict[str, str]:
        """The child's environment: ours plus the resolved region and any explicit credentials."""
        return child_environment(self.options)

    def _retried(self, fn: Any, url: str, op: str) -> Any:
        return retry_call(fn, policy=self.options.retry, url=url, backend=self.name, op=op,
                          endpoint=self.options.endpoint_label())

    def _run(self, args: Sequence[str], *, url: str, op: str, empty_ok: bool = False,
             limit: float | None = None) -> str:
        """Run one short s5cmd call and return its stdout.

        Raises a transient error (retried by the caller) or a typed one. With ``empty_ok``,
        s5cmd's "no object found" failure is an empty result instead. ``limit`` is the
        wall-clock limit in seconds (None: ``call_timeout``).
        """
        limit = self.options.call_timeout if limit is None else limit
        proc, stderr = spawn(self.command(*args), env=self.environment(), stdout=subprocess.PIPE)
        try:
            try:
                out, _ = proc.communicate(timeout=limit)
            except subprocess.TimeoutExpired:
                raise TimeoutError(f"s5cmd {op} did not finish within {limit:g} s") from None
            if proc.returncode != 0:
                tail = read_tail(stderr, 20000)
                records = errors_in(tail)
                if empty_ok and records and str(records[-1]["error"]).strip() == "no object found":
                    return ""
                raise error_from_output(proc.returncode, tail, url=url, op=op)
            return out.decode("utf-8", "surrogateescape")
        finally:
            kill_process(proc)
            if proc.stdout is not None:
                proc.stdout.close()
            stderr.close()

    # ---- the contract -----------------------------------------------------------------------
    def list(self, url: str) -> Iterator[ObjectInfo]:
        """Objects whose key starts with ``url``'s key, sorted by URL (like ``ListObjectsV2``).

        The listing is collected, then yielded in order. A prefix containing wildcard
        characters (``*?[``) is listed up to its first wildcard and filtered here, since
        ``s5cmd ls`` has no ``--raw`` switch. An empty prefix yields nothing.

        Raises:
            ObjectNotFoundError: the bucket does not exist.
        """
        loc = parse_s3_url(url, backend=self.name, op="list")
        key = loc.key
        cut = min((key.index(c) for c in GLOB_CHARS if c in key), default=len(key))
        pattern = f"s3://{loc.bucket}/{key[:cut]}*"
        # s5cmd's "no object found" means an existing bucket with nothing under the prefix
        out = self._retried(lambda: self._run(["ls", pattern], url=url, op="list", empty_ok=True),
                            url, "list")
        base = f"s3://{loc.bucket}/"
        infos: list[ObjectInfo] = []
        for line in out.splitlines():
            if line.strip():
                record = json.loads(line)
                full = str(record["key"])
                # wildcard listings are recursive: "directory" entries are real objects whose
                # key ends in "/" (folder markers), listed as ListObjectsV2 lists them
                if full.startswith(base) and full[len(base):].startswith(key):
                    infos.append(_info(record, full))
        infos.sort(key=lambda info: info.url)
        yield from infos

    def open(self, url: str, *, start: int = 0) -> IO[bytes]:
        """Stream an object through ``s5cmd cat``.

        The object's size is read first (``s5cmd head``), so a body that ends early is
        detected and resumed. s5cmd cannot read a byte range: with ``start > 0``, and on each
        resumption, the bytes before the offset are downloaded and discarded.

        Raises:
            ObjectNotFoundError: no such object (detected before this returns).
            RetryExhaustedError: the request, or the body, kept failing or stalling past the
                retry budget (also from ``read``).
            BackendError: any other failure, also from ``read``.
        """
        loc = self._object(url, "open")
        if not is_int(start) or start < 0:
            raise ConfigError(f"open({url!r}): start must be a non-negative int, got {start!r}")
        size = self._head(url, loc.url, "open").size
        if size is not None and start >= size:
            return io.BytesIO(b"")  # as with slicing
        argv = self.command("cat", "--raw", *transfer_flags(self.options), loc.url)
        env = self.environment()

        def on_error(status: int, stderr: str) -> BaseException:
            return error_from_output(status, stderr, url=url, op="open", silent_is_transient=True)

        def opener(offset: int) -> IO[bytes]:
            return open_cat(argv, on_error=on_error, env=env, start=offset,
                            stall_timeout=self.options.stall_timeout)

        first = self._retried(lambda: opener(start), url, "open")
        return ResumableStream(opener, start=start, size=size, policy=self.options.retry, url=url,
                               backend=self.name, endpoint=self.options.endpoint_label(), first=first)

    def info(self, url: str) -> ObjectInfo:
        """Size, etag and mtime of one object (``s5cmd head``)."""
        return self._head(url, self._object(url, "info").url, "info")

    def _object(self, url: str, op: str) -> S3Location:
        return parse_s3_object_url(url, backend=self.name, op=op)

    def _head(self, url: str, s3url: str, op: str) -> ObjectInfo:
        limit = self.options.call_timeout or self.options.stall_timeout
        out = self._retried(lambda: self._run(["head", "--raw", s3url], url=url, op=op, limit=limit),
                            url, op)
        for line in out.splitlines():
            if line.strip():
                return _info(json.loads(line), url)
        raise BackendError("s5cmd head printed nothing", url=url, backend=self.name, op=op)

    # ---- batched downloads ------------------------------------------------------------------
    def start_batch(self, pairs: Sequence[tuple[str, str]], *, workdir: str,
                    workers: int = 16) -> S5cmdBatch:
        """Start downloading ``(url, local path)`` pairs with one ``s5cmd run`` command file.

        Returns at once; the returned handle's :meth:`S5cmdBatch.wait` reports per file.
        The command files are written in ``workdir`` and removed when the batch ends. Files
        that fail transiently are downloaded again, in further ``s5cmd run`` rounds under the
        retry policy's time budget (s5cmd's own retries are off); s5cmd runs ``numworkers``
        requests at once; ``workers`` is not used.

        Raises:
            ConfigError: a destination is not an absolute path.
        """
        return S5cmdBatch(self.options, pairs, workdir=workdir)
