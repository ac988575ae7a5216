"""Batched downloads with one ``s5cmd run`` command file (the backend's ``start_batch``)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from typing import IO, Any

from ...errors import BackendError, ConfigError, InvalidURLError
from .._subprocess import kill_process, read_tail, spawn
from ..base import parse_s3_url
from ._command import child_environment, command_line, quote_run_arg, transfer_flags
from ._errors import classify_error, errors_in
from ._options import S5cmdOptions

__all__ = ["S5cmdBatch"]

_NAME = "s5cmd"


class S5cmdBatch:
    """One running ``s5cmd run`` over a command file of ``cp`` lines.

    Implements :class:`~pipeflow.backends.batch.BatchHandle`. URLs that cannot go into a command
    file (not ``s3://bucket/key``; a newline, carriage return or NUL in the key) are not
    downloaded: ``wait()`` reports a ``ConfigError`` / ``InvalidURLError`` for them, so one odd
    key does not fail its whole batch.

    Raises:
        ConfigError: a destination is not an absolute path.
    """

    def __init__(self, options: S5cmdOptions, pairs: Sequence[tuple[str, str]], *, workdir: str) -> None:
        self.pairs = list(pairs)
        #: files that cannot be in a command file at all, with the reason (reported by wait())
        self._invalid: dict[str, BaseException] = {}
        lines = self._lines(options)
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
            argv = command_line(options, "run", self._cmdfile, retries=options.run_retries)
            self._proc, self._stderr = spawn(argv, env=child_environment(options), stdout=self._stdout)
        except BaseException:
            self._close_files()
            raise

    def _lines(self, options: S5cmdOptions) -> list[str]:
        lines = []
        flags = "".join(f"{flag} " for flag in transfer_flags(options))
        for url, dest in self.pairs:
            if not os.path.isabs(dest):
                raise ConfigError(f"batch destination must be an absolute path, got {dest!r}")
            try:
                loc = parse_s3_url(url, backend=_NAME, op="fetch")
                if not loc.key:
                    raise InvalidURLError("the URL names a bucket, not an object", url=url,
                                          backend=_NAME, op="fetch")
                # the source always starts with "s3://" and the destination with "/": neither
                # can be read as an option, whatever the key looks like
                lines.append(f"cp --raw {flags}{quote_run_arg(loc.url)} {quote_run_arg(dest)}\n")
            except ConfigError as exc:  # InvalidURLError included
                # kept without its traceback: its frames would keep the caller alive
                self._invalid[dest] = exc.with_traceback(None)
        return lines

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
                                   url=self.pairs[0][0] if self.pairs else "", backend=_NAME,
                                   op="fetch") from None
        self._results = self._collect(status)
        self._close_files()
        return self._results

    def _succeeded(self) -> set[str]:
        done: set[str] = set()
        if self._stdout is None:
            return done
        self._stdout.seek(0)
        for line in self._stdout.read().decode("utf-8", "surrogateescape").splitlines():
            if line.startswith("{"):
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("success") and "destination" in record:
                    done.add(str(record["destination"]))
        return done

    def _collect(self, status: int) -> dict[str, BaseException | None]:
        done = self._succeeded()
        failures: list[dict[str, Any]] = []
        if self._stderr is not None:
            failures = errors_in(read_tail(self._stderr, 1 << 22))
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
                        + (f": {tail[-500:]}" if tail else ""), url=url, backend=_NAME, op="fetch")
        return results

    def _close_files(self) -> None:
        for f in (self._stdout, self._stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        if self._cmdfile:
            try:
                os.unlink(self._cmdfile)
            except FileNotFoundError:
                pass

    def cancel(self) -> None:
        """Kill the download (if running), reap it and remove the command file. Idempotent."""
        if self._proc is not None:
            kill_process(self._proc)
        self._close_files()
