"""Batched downloads with ``s5cmd run`` command files (the backend's ``start_batch``).

A batch runs in rounds: one ``s5cmd run`` over a command file of ``cp`` lines, with s5cmd's own
retries off; then, for the files that failed transiently (5xx, 429, throttling, no connection),
another round after the policy's backoff, and so on until the retry budget's deadline. A round
that downloads anything ends the outage (the next failure starts a fresh budget), as a stream
that makes progress does. s5cmd counts retries, not time, and its own backoff grows to minutes:
handing it the budget as a ``--retry-count`` made the budget hold on average only, and an outage
longer than the count lost the batch.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import IO

from ...errors import BackendError, ConfigError
from .._retry import check_first_contact, exhausted, mark_answered, note_retry
from .._subprocess import kill_process, read_tail, spawn
from ..base import parse_s3_object_url
from ._command import child_environment, command_line, quote_run_arg, transfer_flags
from ._errors import S5cmdTransientError, answered_in, classify_error, errors_in, transient_in
from ._options import S5cmdOptions

__all__ = ["S5cmdBatch"]

_NAME = "s5cmd"


class _Round:
    """One ``s5cmd run`` over the command lines of the files still to download."""

    def __init__(self, options: S5cmdOptions, lines: dict[str, str], workdir: str) -> None:
        self.dests = list(lines)
        self.proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        fd, self._cmdfile = tempfile.mkstemp(prefix="s5cmd-run-", suffix=".txt", dir=workdir)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.writelines(lines.values())
        self._stdout: IO[bytes] | None = tempfile.TemporaryFile(prefix="pipeflow-s5cmd-out-")
        try:
            argv = command_line(options, "run", self._cmdfile)
            self.proc, self._stderr = spawn(argv, env=child_environment(options), stdout=self._stdout)
        except BaseException:
            self.close()
            raise

    def _succeeded(self) -> set[str]:
        done: set[str] = set()
        stdout = self._stdout
        if stdout is None:
            return done
        try:
            stdout.seek(0)
            out = stdout.read()
        except (OSError, ValueError):  # closed: the batch was cancelled meanwhile
            return done
        for line in out.decode("utf-8", "surrogateescape").splitlines():
            if line.startswith("{"):
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("success") and "destination" in record:
                    done.add(str(record["destination"]))
        return done

    def outcome(self, status: int, urls: dict[str, str]) -> dict[str, str | BackendError | None]:
        """Per destination: None (downloaded), s5cmd's error text, or an error when s5cmd named
        no error for the file (it did not run it: it was killed, or failed as a whole)."""
        done = self._succeeded()
        records = errors_in(read_tail(self._stderr, 1 << 22)) if self._stderr is not None else []
        tail = read_tail(self._stderr) if self._stderr is not None else ""
        result: dict[str, str | BackendError | None] = {}
        for dest in self.dests:
            if dest in done and os.path.exists(dest):
                result[dest] = None
                continue
            record = next((r for r in records if str(r.get("command", "")).endswith(" " + dest)), None)
            result[dest] = str(record["error"]) if record is not None else BackendError(
                f"s5cmd run (exit status {status}) did not download the object"
                + (f": {tail[-500:]}" if tail else ""), url=urls[dest], backend=_NAME, op="fetch")
        return result

    def close(self) -> None:
        """Kill the process (if running), reap it, close its files, remove the command file."""
        if self.proc is not None:
            kill_process(self.proc)
        for f in (self._stdout, self._stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        self._stdout = self._stderr = None
        if self._cmdfile:
            try:
                os.unlink(self._cmdfile)
            except FileNotFoundError:
                pass
            self._cmdfile = ""


class S5cmdBatch:
    """A batch of ``s5cmd run`` rounds over ``cp`` lines, retried under the retry policy.

    Implements :class:`~pipeflow.backends.batch.BatchHandle`. The first round starts at once;
    the later ones (only for files that failed transiently) run inside :meth:`wait`. URLs that
    cannot go into a command file (not ``s3://bucket/key``; a newline, carriage return or NUL in
    the key) are not downloaded: ``wait()`` reports a ``ConfigError`` / ``InvalidURLError`` for
    them, so one odd key does not fail its whole batch.

    Raises:
        ConfigError: a destination is not an absolute path.
    """

    def __init__(self, options: S5cmdOptions, pairs: Sequence[tuple[str, str]], *, workdir: str) -> None:
        self.pairs = list(pairs)
        self._options = options
        self._workdir = workdir
        self._urls = {dest: url for url, dest in self.pairs}
        #: files that cannot be in a command file at all, with the reason (reported by wait())
        self._invalid: dict[str, BaseException] = {}
        self._lines = self._command_lines(options)
        self._results: dict[str, BaseException | None] | None = None
        self._lock = threading.Lock()  # cancel() may come from another thread (a finalizer)
        self._cancelled = threading.Event()
        self._timer = options.retry.timer()
        self._round: _Round | None = _Round(options, self._lines, workdir) if self._lines else None

    def _command_lines(self, options: S5cmdOptions) -> dict[str, str]:
        lines = {}
        flags = "".join(f"{flag} " for flag in transfer_flags(options))
        for url, dest in self.pairs:
            if not os.path.isabs(dest):
                raise ConfigError(f"batch destination must be an absolute path, got {dest!r}")
            try:
                loc = parse_s3_object_url(url, backend=_NAME, op="fetch")
                # the source always starts with "s3://" and the destination with "/": neither
                # can be read as an option, whatever the key looks like
                lines[dest] = f"cp --raw {flags}{quote_run_arg(loc.url)} {quote_run_arg(dest)}\n"
            except ConfigError as exc:  # InvalidURLError included
                # kept without its traceback: its frames would keep the caller alive
                self._invalid[dest] = exc.with_traceback(None)
        return lines

    def done(self) -> bool:
        """True when no s5cmd process runs (the first round has exited, or there was none)."""
        current = self._round
        return current is None or current.proc is None or current.proc.poll() is not None

    def wait(self, timeout: float | None = None) -> dict[str, BaseException | None]:
        """Wait for the batch (its retry rounds included) and return ``{local path: None or the
        error for that file}``.

        Raises:
            BackendError: the batch did not finish within ``timeout`` (it is cancelled).
        """
        if self._results is not None:
            return self._results
        deadline = None if timeout is None else time.monotonic() + timeout
        results: dict[str, BaseException | None] = dict(self._invalid)
        while (current := self._round) is not None:
            status = self._finish(current, deadline, timeout)
            outcome = current.outcome(status, self._urls)
            current.close()
            retry = self._settle(outcome, results)
            with self._lock:
                self._round = None
            if retry and self._pause(retry, any(v is None for v in outcome.values()), results,
                                     deadline, timeout):
                self._start_round({dest: self._lines[dest] for dest in retry})
        for dest in self._lines:
            results.setdefault(dest, BackendError("the batch was cancelled", url=self._urls[dest],
                                                  backend=_NAME, op="fetch"))
        self._results = {dest: results[dest] for _, dest in self.pairs}
        return self._results

    def _finish(self, current: _Round, deadline: float | None, timeout: float | None) -> int:
        """The exit status of ``current``'s process; cancels the batch past ``deadline``."""
        assert current.proc is not None
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            return current.proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            raise self._timed_out(timeout) from None

    def _timed_out(self, timeout: float | None) -> BackendError:
        self.cancel()
        return BackendError(f"s5cmd run did not finish within {timeout} s",
                            url=self.pairs[0][0] if self.pairs else "", backend=_NAME, op="fetch")

    def _settle(self, outcome: dict[str, str | BackendError | None],
                results: dict[str, BaseException | None]) -> dict[str, S5cmdTransientError]:
        """Record the round's final results; return the files to try again, with their failure."""
        retry: dict[str, S5cmdTransientError] = {}
        answered = False
        for dest, error in outcome.items():
            if error is None or isinstance(error, BackendError):
                results[dest] = error
                answered = answered or error is None
                continue
            answered = answered or answered_in(error)
            transient = transient_in(error)
            if transient is not None:
                retry[dest] = transient
            else:
                results[dest] = classify_error(error, url=self._urls[dest], op="fetch")
        if answered:
            mark_answered(self._options.endpoint_label())
        return retry

    def _pause(self, retry: dict[str, S5cmdTransientError], progressed: bool,
               results: dict[str, BaseException | None], deadline: float | None,
               timeout: float | None) -> bool:
        """Wait the backoff before the next round; False (the files' errors recorded) when the
        budget is spent, the endpoint never answered (the first-contact rule), or the batch
        was cancelled."""
        if progressed:  # a success ends the outage: the next one gets the whole budget
            self._timer = self._options.retry.timer()
        exc = next(iter(retry.values()))
        endpoint = self._options.endpoint_label()
        url = self._urls[next(iter(retry))]
        try:
            delay = self._timer.failed()
            if delay is None:
                raise exhausted(self._timer, exc, what="s5cmd run", url=url, backend=_NAME,
                                op="fetch", endpoint=endpoint)
            delay = check_first_contact(self._timer, exc, delay, endpoint=endpoint, url=url,
                                        backend=_NAME, op="fetch")
        except BackendError as err:
            for dest in retry:
                results[dest] = _for_file(err, self._urls[dest])
            return False
        note_retry(delay)
        if deadline is not None and time.monotonic() + delay > deadline:
            raise self._timed_out(timeout)
        return not self._cancelled.wait(delay)

    def _start_round(self, lines: dict[str, str]) -> None:
        with self._lock:
            if not self._cancelled.is_set():
                self._round = _Round(self._options, lines, self._workdir)

    def cancel(self) -> None:
        """Kill the download (if running), reap it and remove the command file. Idempotent."""
        self._cancelled.set()
        with self._lock:
            current, self._round = self._round, None
        if current is not None:
            current.close()


def _for_file(err: BackendError, url: str) -> BackendError:
    """``err`` (raised for the first file of a round) as the error of the file at ``url``."""
    copy = type(err)(err.message, url=url, backend=err.backend, op=err.op)
    copy.__cause__ = err.__cause__
    return copy
