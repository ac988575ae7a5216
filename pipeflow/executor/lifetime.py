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

Idle process pools are kept per process by :class:`PoolCache`, so a pipeline iterated epoch
after epoch reuses its warm workers instead of starting new ones.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import select
import signal
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from .shm import pid_alive, set_worker_prefix, sweep_owner

if TYPE_CHECKING:
    from .pool import WorkerPool

__all__ = ["PoolCache", "arm_worker", "pool_cache"]

_PR_SET_PDEATHSIG = 1
_POLL_SECONDS = 0.5


def _set_pdeathsig() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the watchdog alone covers it
        pass


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
    set_worker_prefix(shm_prefix)
    pidfd = None
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(owner_pid)
    if os.getppid() == 1 or not pid_alive(owner_pid):  # the owner died while this one started
        _owner_gone(owner_pid)
    threading.Thread(target=_watch, args=(owner_pid, pidfd), name="pipeflow-owner-watchdog",
                     daemon=True).start()


class PoolCache:
    """Idle process pools of this process, by key, each leased to an owner object.

    A stage takes a pool with :meth:`acquire` and gives it back with :meth:`release` when its
    epoch ended normally; the next epoch's stage (same key) gets the same warm workers. An
    idle pool is shut down when its owner is garbage collected, at interpreter exit, and in a
    forked child (which must never use its parent's pools).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[Hashable, list[WorkerPool]] = {}
        self._finalizers: dict[int, weakref.finalize] = {}

    def acquire(self, key: Hashable, factory: Callable[[], WorkerPool]) -> WorkerPool:
        with self._lock:
            pools = self._idle.get(key, [])
            while pools:
                pool = pools.pop()
                fin = self._finalizers.pop(id(pool), None)
                if fin is not None:
                    fin.detach()
                if pool.usable():
                    return pool
                pool.shutdown(wait=False)
        return factory()

    def release(self, key: Hashable, pool: WorkerPool, owner: Any) -> None:
        """Keep ``pool`` idle for the next ``acquire(key)`` while ``owner`` lives."""
        if not pool.usable():
            pool.shutdown(wait=True)
            return
        try:
            fin = weakref.finalize(owner, self._drop, key, pool)
        except TypeError:  # an owner without weak references: nothing to tie the pool to
            pool.shutdown(wait=True)
            return
        fin.atexit = True
        with self._lock:
            self._idle.setdefault(key, []).append(pool)
            self._finalizers[id(pool)] = fin

    def _drop(self, key: Hashable, pool: WorkerPool) -> None:
        with self._lock:
            pools = self._idle.get(key, [])
            if pool in pools:
                pools.remove(pool)
            self._finalizers.pop(id(pool), None)
        pool.shutdown(wait=False)

    def clear(self, *, wait: bool = True) -> None:
        """Shut down every idle pool."""
        with self._lock:
            pools = [p for ps in self._idle.values() for p in ps]
            self._idle.clear()
            for fin in self._finalizers.values():
                fin.detach()
            self._finalizers.clear()
        for pool in pools:
            pool.shutdown(wait=wait)

    def _forget_after_fork(self) -> None:
        # the child must not shut down (or use) the parent's workers: just drop the references
        self._lock = threading.Lock()
        for fin in self._finalizers.values():
            fin.detach()
        self._idle, self._finalizers = {}, {}


pool_cache = PoolCache()
atexit.register(pool_cache.clear, wait=False)
os.register_at_fork(after_in_child=pool_cache._forget_after_fork)
