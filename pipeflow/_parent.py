"""A forked process that ends with the process that forked it: Linux's parent-death signal.

``prctl(PR_SET_PDEATHSIG, sig)`` makes the kernel send ``sig`` to the calling process when the
*thread* that forked it exits (the whole parent, when that thread is its main thread). It is
set in the child, so a parent that died between the fork and the call sends nothing: the child
must then compare its parent with the pid of the process that forked it, recorded before the
fork (:func:`os.register_at_fork`), to close that race.

:func:`end_with_parent` is what a DataLoader worker calls when it starts iterating a pipeline.
torch's own guard, the worker loop's ``ManagerWatchdog``, records ``os.getppid()`` only when the
loop starts; a worker whose parent had already died by then (a command killed while its
DataLoader forked workers at an epoch's start) records init's pid as its manager, never notices,
and waits on its index queue forever, holding the command's stderr.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from collections.abc import Callable

__all__ = ["PR_SET_PDEATHSIG", "end_with_parent", "in_forked_child", "prctl"]

#: PR_SET_PDEATHSIG: the signal the calling process gets when the thread that forked it exits
PR_SET_PDEATHSIG = 1

#: (pid, forked from the main thread) of the process that last forked, as seen by its children:
#: set before every fork, so in a forked child it names the parent
_forked_by: tuple[int, bool] = (os.getpid(), True)
_armed_in = 0  # the pid end_with_parent() last ran in


def _before_fork() -> None:
    global _forked_by
    _forked_by = (os.getpid(), threading.current_thread() is threading.main_thread())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork)


@functools.cache
def prctl() -> Callable[[int, int], int] | None:
    """libc's ``prctl``, looked up once in this process (None where it cannot be)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        found: Callable[[int, int], int] = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None
    return found


def end_with_parent(signum: int = signal.SIGKILL) -> None:
    """In a forked child: get ``signum`` when the parent dies, and end at once if it already has.

    Does nothing in a process that was not forked (spawned), and arms only once per process.
    The death signal is set only when the parent forked from its main thread (a thread's exit
    would fire it while the parent lives on); the check of the parent's pid is made either way.
    SIGKILL by default: the parent is gone, nothing is left to hand results to, and a handler
    the child inherited cannot keep it alive.
    """
    global _armed_in
    pid = os.getpid()
    parent, from_main = _forked_by
    if parent == pid or _armed_in == pid:
        return
    _armed_in = pid
    call = prctl()
    if from_main and call is not None:
        call(PR_SET_PDEATHSIG, int(signum))
    if os.getppid() != parent:  # the parent died before the signal was set: nobody sends it
        os.kill(pid, signum)


def in_forked_child(pid: int) -> bool:
    """Whether a signal handler installed by process ``pid`` runs in a child forked from it
    (which inherited the handler: a DataLoader worker), not in that process."""
    return os.getpid() != pid
