"""Helper processes (the local S3 server, the fault proxy) that end when the process that started
them ends, however it ends (SIGKILL included) and from whichever thread it started them.

Linux's parent-death signal is tied to the *thread* that forked, so it cannot be used from a
thread that ends before the server should. Instead the parent keeps the write end of a pipe and
the child runs its module behind a watcher of the read end: the kernel closes the write end when
the parent process dies, the watcher reads end-of-file and sends its own process SIGTERM (what
``terminate()`` sends, so the module's own SIGTERM handling still runs), then exits outright if
that did not end it within a few seconds. Portable to any POSIX system, and nothing polls.

A child forked from the parent without exec (a DataLoader worker) holds a copy of the write end
until it exits, so the helper outlives the parent by as long as such a child does.

Child side: ``python PATH/_lifeline.py FD [--quiet=LOGGER ...] MODULE [ARG ...]`` runs ``MODULE``
as ``__main__`` with ``ARG ...`` as its arguments, each ``LOGGER`` (a :mod:`logging` name) set to
show warnings and errors only. The file is run by its path and imports only the standard
library, so the child needs no importable pipeflow (nor the same one as the parent) to start a
module that is not pipeflow's own, such as ``moto.server``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["Tethered", "start_tethered"]

#: seconds the module gets to end on SIGTERM before the watcher exits the process itself
GRACE_S = 5.0


class Tethered:
    """A child process and the write end of its lifeline; :meth:`release` closes the write end
    (the child then ends by itself: call it after stopping the child, or to let it go)."""

    def __init__(self, process: subprocess.Popen[Any], write_fd: int) -> None:
        self.process = process
        self._write_fd: int | None = write_fd
        self._lock = threading.Lock()

    def release(self) -> None:
        """Close the parent's end of the lifeline. Idempotent."""
        with self._lock:
            fd, self._write_fd = self._write_fd, None
        if fd is not None:
            os.close(fd)


def start_tethered(module: str, args: Sequence[str], *, python: str = sys.executable,
                   quiet: Sequence[str] = (), **popen: Any) -> Tethered:
    """``python -m MODULE ARGS`` in a child that ends when this process does; the loggers named
    in ``quiet`` there log warnings and errors only; ``popen`` goes to :class:`subprocess.Popen`
    (``pass_fds`` is taken)."""
    read_fd, write_fd = os.pipe()  # both close-on-exec: no other child inherits them
    try:
        cmd = [python, os.path.abspath(__file__), str(read_fd), *(f"--quiet={name}" for name in quiet),
               module, *args]
        process = subprocess.Popen(cmd, pass_fds=(read_fd,), **popen)
    except BaseException:
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    return Tethered(process, write_fd)


def _watch(fd: int) -> None:  # pragma: no cover - runs in the child
    with contextlib.suppress(OSError):
        while os.read(fd, 4096):
            pass
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_S)
    os._exit(1)


def main(argv: Sequence[str]) -> None:  # pragma: no cover - runs in the child
    """Start the watcher of lifeline ``argv[0]``, quiet the ``--quiet=`` loggers, then run the
    module that follows as ``__main__``."""
    fd, rest = int(argv[0]), list(argv[1:])
    threading.Thread(target=_watch, args=(fd,), name="pipeflow-lifeline", daemon=True).start()
    while rest[0].startswith("--quiet="):  # a module name never starts with "-"
        logging.getLogger(rest.pop(0).partition("=")[2]).setLevel(logging.WARNING)
    module = rest[0]
    sys.path[0] = os.getcwd()  # what ``python -m MODULE`` would have, not this file's folder
    sys.argv = [module, *rest[1:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":  # pragma: no cover - runs in the child
    main(sys.argv[1:])
