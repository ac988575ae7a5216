"""How long worker processes live: never longer than the process that owns them.

Two mechanisms, both armed in every process worker as it starts (the pool's initializer):

* ``PR_SET_PDEATHSIG``: the kernel sends SIGKILL when the worker's parent dies. With the
  forkserver start method the parent is the fork server, whose only thread forks the workers,
  so the signal is reliable there (it is tied to the forking *thread*, which is why it is not
  used on the fork server itself: any short-lived thread of the owner may have started it).
* a watchdog thread on the owner's pid (a ``pidfd`` that becomes readable when the owner
  exits; polling where pidfds are missing). When the owner is gone the worker removes the
  shared-memory segments the owner can no longer remove and exits at once.

The fork server and multiprocessing's resource tracker need nothing of their own: they exit
when the last holder of their pipes closes it, and those holders are the owner and the workers.

Idle pools between epochs are the pool module's concern (:class:`~pipeflow.executor.pool.PoolCache`).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading

from .._fs import pid_alive
from .._parent import PR_SET_PDEATHSIG, prctl
from .intraop import one_intraop_thread
from .shm import set_worker_prefix, sweep_owner

__all__ = ["arm_worker"]

_POLL_SECONDS = 0.5


def _set_pdeathsig() -> None:
    call = prctl()
    if call is not None:  # not Linux: the watchdog alone covers it
        call(PR_SET_PDEATHSIG, signal.SIGKILL)


def _owner_gone(owner_pid: int) -> None:
    sweep_owner(owner_pid)
    os._exit(1)  # no atexit handlers: they may wait on the dead owner's pipes


def _watch(owner_pid: int, pidfd: int | None) -> None:
    if pidfd is not None:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.poll()  # readable exactly when the owner has exited
        _owner_gone(owner_pid)
    while True:
        try:
            os.kill(owner_pid, 0)
        except ProcessLookupError:
            _owner_gone(owner_pid)
        except PermissionError:  # the pid was reused by someone else's process
            _owner_gone(owner_pid)
        threading.Event().wait(_POLL_SECONDS)


def _ignore_interrupt(signum: int, frame: object) -> None:
    """SIGINT in a process worker: left to the owner (see :func:`arm_worker`)."""


def arm_worker(owner_pid: int, shm_prefix: str) -> None:
    """Initializer of every process worker: die with the owner, know where results go."""
    # Ctrl-C reaches the whole process group: the owner stops the pool (and a dead owner takes
    # its workers with it), so a worker prints no KeyboardInterrupt traceback of its own. A
    # handler rather than SIG_IGN, so programs the user's function starts keep the default.
    signal.signal(signal.SIGINT, _ignore_interrupt)
    _set_pdeathsig()
    # one torch intra-op thread, as in a DataLoader worker: N workers use N cores, and a worker
    # forked from a warm server never touches the OpenMP team its ancestor may have started
    one_intraop_thread()
    set_worker_prefix(shm_prefix)
    pidfd = None
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(owner_pid)
    if os.getppid() == 1 or not pid_alive(owner_pid):  # the owner died while this one started
        _owner_gone(owner_pid)
    threading.Thread(target=_watch, args=(owner_pid, pidfd), name="pipeflow-owner-watchdog",
                     daemon=True).start()
