"""Child processes whose standard output is an object's bytes (``s5cmd cat``, ``pipe``).

The rules every subprocess pipeflow starts follows:

* argv lists only, never a shell; stdin is ``/dev/null``;
* the child leads its own process group, so closing the stream kills the whole group (a
  command that forks helpers cannot leave them behind), and a terminal's Ctrl-C reaches only
  the Python process, which then closes the stream;
* stderr goes to an anonymous temporary file (unlinked at creation), so a chatty child can
  never block on a full pipe and nothing is left on disk; its tail is quoted in errors;
* every process is reaped: at end of stream, on ``close()``, and when a stream is garbage
  collected without being closed;
* a non-zero exit is never mistaken for the end of the data: reading to the end raises the
  error the caller's ``on_error`` maps the exit status and stderr to.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import IO

__all__ = ["ProcessStream", "describe_argv", "kill_process", "read_tail", "spawn"]

#: how many bytes of a child's stderr are quoted in error messages
STDERR_TAIL = 2000
#: read size of the buffered reader put in front of a child's stdout
BUFFER_SIZE = 1 << 16

#: maps (exit status, stderr tail) to the exception to raise for a failed command
ErrorFactory = Callable[[int, str], BaseException]


def spawn(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
          stdout: int | IO[bytes] | None = subprocess.PIPE) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
    """Start ``argv`` without a shell in its own process group.

    Returns:
        The process and the temporary file collecting its stderr (the caller closes it).
    """
    stderr = tempfile.TemporaryFile(prefix="pipeflow-stderr-")
    try:
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
            env=dict(env) if env is not None else None, close_fds=True, start_new_session=True,
            bufsize=0,
        )
    except BaseException:
        stderr.close()
        raise
    return proc, stderr


def kill_process(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc``'s process group if it still runs, and reap it. Safe to call twice."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # exited meanwhile / group already gone
            pass
        try:
            proc.kill()
        except ProcessLookupError:
            pass
    proc.wait()


def read_tail(stderr: IO[bytes], limit: int = STDERR_TAIL) -> str:
    """The last ``limit`` bytes written to a stderr file, decoded leniently."""
    try:
        stderr.flush()
        size = stderr.seek(0, io.SEEK_END)
        stderr.seek(max(0, size - limit))
        return stderr.read().decode("utf-8", "replace").strip()
    except (OSError, ValueError):  # closed or unreadable: an error message must not fail
        return ""


def describe_argv(argv: Sequence[str], limit: int = 300) -> str:
    """A readable, shell-quoted rendering of argv for error messages (never executed)."""
    import shlex

    text = shlex.join(argv)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ProcessStream(io.RawIOBase):
    """A child process's stdout as a raw, read-only, non-seekable binary stream.

    ``close()`` kills the process group if it still runs and reaps it. If the child had
    already exited on its own with a non-zero status that nobody has seen yet, ``close()``
    raises the mapped error: a failure is reported even when the reader stopped early.
    Garbage collection closes the stream without raising.

    Args:
        argv: the command.
        on_error: builds the exception for a non-zero exit from ``(status, stderr tail)``.
        env: the child's environment (None: inherit).
    """

    def __init__(self, argv: Sequence[str], *, on_error: ErrorFactory,
                 env: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.argv = list(argv)
        self._on_error = on_error
        self._proc, self._stderr = spawn(self.argv, env=env)
        assert self._proc.stdout is not None
        self._stdout: IO[bytes] = self._proc.stdout
        self._reported = False

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if self.closed:
            raise ValueError("I/O operation on closed stream")
        n = self._stdout.readinto(buffer)  # type: ignore[attr-defined]
        if n:
            return n
        # end of output: only a zero exit status makes this the end of the object
        status = self._proc.wait()
        if status != 0 and not self._reported:
            self._reported = True
            raise self._on_error(status, read_tail(self._stderr))
        return 0

    def _shutdown(self, *, check: bool) -> None:
        proc = self._proc
        exited_by_itself = proc.poll() is not None
        kill_process(proc)
        status = proc.returncode
        failed = check and exited_by_itself and status != 0 and not self._reported
        tail = read_tail(self._stderr) if failed else ""
        for f in (self._stdout, self._stderr):
            try:
                f.close()
            except OSError:
                pass
        if failed:
            self._reported = True
            raise self._on_error(status, tail)

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._shutdown(check=True)
        finally:
            super().close()

    def __del__(self) -> None:
        # never raise from the garbage collector; just make sure nothing is left running
        try:
            if not self.closed:
                self._shutdown(check=False)
                io.RawIOBase.close(self)
        except Exception:
            pass



def open_process(argv: Sequence[str], *, on_error: ErrorFactory, env: Mapping[str, str] | None = None,
                 start: int = 0) -> io.BufferedReader[ProcessStream]:
    """Start ``argv`` and return its stdout as a buffered binary stream.

    Waits for the first byte (or the exit status), so a command that fails before writing
    anything (a missing object) raises here rather than at the first ``read``. Bytes before
    ``start`` are read and discarded: commands have no way to seek.
    """
    raw = ProcessStream(argv, on_error=on_error, env=env)
    stream = io.BufferedReader(raw, BUFFER_SIZE)
    try:
        stream.peek(1)
        remaining = start
        while remaining > 0:
            skipped = len(stream.read(min(remaining, BUFFER_SIZE)))
            if not skipped:
                break  # start past the end: an empty stream, as with slicing
            remaining -= skipped
    except BaseException:
        raw._shutdown(check=False)
        stream.close()
        raise
    return stream
