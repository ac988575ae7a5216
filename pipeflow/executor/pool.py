"""Thread and process worker pools.

The pools are thin owners of ``concurrent.futures`` executors; what pipeflow adds is the policy
around them: the choice of start method, the fallback inside daemonic DataLoader workers (which
may not have children), translation of a dead worker into :class:`WorkerCrashedError`, a
shutdown that never leaves a process behind even if a task hangs, workers that die with the
process that started them (:mod:`.lifetime`), large results through shared memory
(:mod:`.shm`), and process pools that outlive one epoch (:func:`lease_pool`).
"""

from __future__ import annotations

import atexit
import itertools
import multiprocessing
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Hashable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Literal

from .._checks import check_choice, check_int
from .._once import first_time
from .chunks import run_chunk, settle, spread
from .intraop import one_intraop_thread
from .lifetime import arm_worker
from .shm import (
    Slots,
    discard,
    input_bytes,
    pack_input,
    pool_prefix,
    restore,
    run_in_slot,
    run_task,
    run_with_input,
    sweep,
    sweep_dead_owners,
)
from .shm import available as shm_available
from .warm import start_warm_server

__all__ = ["PoolCache", "WorkerPool", "lease_pool", "make_pool", "pool_cache", "prestart", "return_pool"]

#: how long close() waits for busy process workers before terminating them
PROCESS_GRACE_SECONDS = 5.0

#: seconds a pool's threads get to finish their current call once the run was interrupted
#: (Ctrl-C, or SIGTERM on the CLI); a thread still inside its call then (a read that never
#: returns) is left behind and does not hold the interpreter at exit.
#: ``PIPEFLOW_STOP_GRACE_SECONDS`` overrides it.
STOP_GRACE_SECONDS = 5.0


def stop_grace_seconds() -> float:
    """``STOP_GRACE_SECONDS``, or ``PIPEFLOW_STOP_GRACE_SECONDS`` when set to a number >= 0."""
    raw = os.environ.get("PIPEFLOW_STOP_GRACE_SECONDS")
    if raw:
        try:
            value = float(raw)
        except ValueError:
            return STOP_GRACE_SECONDS
        if value >= 0:
            return value
    return STOP_GRACE_SECONDS

_pool_ids = itertools.count()
_BASE_PRELOAD = ("__main__", "pipeflow", "pipeflow.stages.map", "pipeflow.executor.lifetime")


def _default_start_method() -> str:
    # fork is unsafe once the parent runs threads (prefetchers, S3 clients); forkserver is the
    # safe, reasonably fast choice on Linux, spawn elsewhere.
    methods = multiprocessing.get_all_start_methods()
    return "forkserver" if "forkserver" in methods else "spawn"


def _preload_forkserver(ctx: Any, modules: tuple[str, ...]) -> None:
    # The fork server imports these once; every worker forked from it then starts in
    # milliseconds instead of importing torch, pipeflow and the mapped function's module again.
    # It only takes effect if the fork server is not running yet (it is one per process).
    ctx.set_forkserver_preload(list(dict.fromkeys(_BASE_PRELOAD + modules)))


def _start_method(start_method: str | None) -> str:
    return start_method or os.environ.get("PIPEFLOW_START_METHOD") or _default_start_method()


def _warm_first(start_method: str | None) -> None:
    # the default start method, unless asked by name: a fork server forked from this process
    # when it may be (no other thread), else the fresh interpreter's
    if start_method is None and not os.environ.get("PIPEFLOW_START_METHOD") \
            and _default_start_method() == "forkserver":
        start_warm_server()


def _fn_preload(fn: Callable[..., Any]) -> tuple[str, ...]:
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return (module,) if module and module != "__main__" else ()


def prestart(fn: Callable[..., Any], start_method: str | None = None) -> bool:
    """Start the fork server for process workers running ``fn`` now, without waiting for it.

    The fork server spends 1-2 s importing the mapped function's module (torch, numpy, ...)
    before it can fork the first worker. Started when a pipeline begins iterating, that import
    runs while the upstream stages produce their first items instead of after them. Takes
    about 10 ms (the server is a new process); True if a fork server runs.
    """
    if multiprocessing.current_process().daemon or _start_method(start_method) != "forkserver":
        return False
    from multiprocessing import forkserver  # POSIX only

    _warm_first(start_method)
    _preload_forkserver(multiprocessing.get_context("forkserver"), _fn_preload(fn))
    forkserver.ensure_running()
    return True


class WorkerPool:
    """N workers running ``fn(item)`` tasks on threads or processes.

    Args:
        workers: number of workers (>= 1).
        method: ``"thread"`` or ``"process"``.
        name: shown in thread names and errors.
        start_method: multiprocessing start method for process workers
            (default: ``PIPEFLOW_START_METHOD`` or forkserver on Linux).
        preload: modules the fork server imports before forking workers (the mapped
            function's module), when it is started by this pool.
    """

    def __init__(self, workers: int, method: Literal["thread", "process"], *, name: str = "pipeflow",
                 start_method: str | None = None, preload: tuple[str, ...] = ()) -> None:
        check_int(workers, "workers", low=1)
        check_choice(method, "method", ("thread", "process"))
        if method == "process" and multiprocessing.current_process().daemon:
            # DataLoader workers are daemonic and may not start children: the DataLoader already
            # gives process parallelism, so threads are the sensible substitute.
            if first_time("process_fallback"):
                warnings.warn(f"pipeflow: {name} runs inside a daemonic process (a DataLoader worker?), "
                              "which may not start processes; using threads instead of worker "
                              "processes", RuntimeWarning, stacklevel=2)
            method = "thread"
        self.method = method
        self.workers = workers
        self.name = name
        #: the multiprocessing start method of process workers (None for threads)
        self.start_method: str | None = None
        self._lock = threading.Lock()
        self._executor: Executor
        self._shm_prefix = ""
        self._slots: Slots | None = None
        if method == "thread":
            self._executor = ThreadPoolExecutor(workers, thread_name_prefix=f"pipeflow-{name}",
                                                initializer=one_intraop_thread)
        else:
            method_name = _start_method(start_method)
            ctx = multiprocessing.get_context(method_name)
            self.start_method = method_name
            if method_name == "forkserver":
                _warm_first(start_method)
                _preload_forkserver(ctx, preload)
            if shm_available():
                sweep_dead_owners()
                self._shm_prefix = pool_prefix(next(_pool_ids))
                self._slots = Slots(self._shm_prefix)
            self._executor = ProcessPoolExecutor(workers, mp_context=ctx, initializer=arm_worker,
                                                 initargs=(os.getpid(), self._shm_prefix))
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        if self.method == "thread":
            return self._executor.submit(fn, *args)
        slots = self._slots
        if slots is None:
            return _restoring(self._executor.submit(run_task, fn, *args), None, None)
        need = input_bytes(args[0]) if len(args) == 1 else 0
        if need:
            slots.observe(need)
        lent = slots.lend()
        try:
            if need and lent is not None and lent[1] >= need:
                # the item's large bytes go through the slot too, not the pipe
                inner = self._executor.submit(run_with_input, lent, fn, pack_input(args[0], slots, lent))
            else:
                inner = self._executor.submit(run_in_slot, lent, fn, *args)
        except BaseException:
            slots.give_back(lent and lent[0])
            raise
        return _restoring(inner, slots, lent and lent[0])

    def submit_chunk(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Future[Any]]:
        """``fn`` on each of ``items`` as one task of a process pool; a future per item."""
        if self.method == "thread" or len(items) == 1:
            return [self.submit(fn, item) for item in items]
        outers: list[Future[Any]] = [Future() for _ in items]
        spread(self._executor.submit(run_chunk, fn, items), outers)
        return outers

    def park(self) -> None:
        """Going idle between epochs: the shared-memory slots go (the next epoch makes new ones),
        so an idle pool keeps nothing in ``/dev/shm``."""
        if self._slots is not None:
            self._slots.reset()

    def usable(self) -> bool:
        """Not shut down and no worker died: fit to be reused by another epoch."""
        return not self._closed and not getattr(self._executor, "_broken", False)

    def shutdown(self, wait: bool = True, bound: float | None = None, name: str = "") -> None:
        """Cancel queued tasks and stop the workers; process workers that do not finish in
        ``PROCESS_GRACE_SECONDS`` are terminated. Idempotent.

        ``bound`` (seconds, given after an interrupt): threads still in their call then are left
        behind, said on stderr (naming stage ``name``), and taken out of the interpreter's
        exit-time joins, so a call that never returns cannot keep the process alive."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        executor = self._executor
        if isinstance(executor, ThreadPoolExecutor):
            if bound is None or not wait:
                executor.shutdown(wait=wait, cancel_futures=True)
                return
            threads = list(getattr(executor, "_threads", ()))
            executor.shutdown(wait=False, cancel_futures=True)
            deadline = time.monotonic() + bound
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            stuck = [t for t in threads if t.is_alive()]
            if stuck:
                _leave_behind(stuck)
                print(f"pipeflow: stage {name or 'map'}: {len(stuck)} call(s) did not return within "
                      f"{bound:g} s; exiting without them", file=sys.stderr, flush=True)
            return
        processes = list((getattr(executor, "_processes", None) or {}).values())
        executor.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            proc.join(PROCESS_GRACE_SECONDS if wait else 0.5)
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
        if wait:
            executor.shutdown(wait=True)
        if self._slots is not None:
            self._slots.reset(close=True)
        if self._shm_prefix:
            # results a crashed worker wrote, or that were cancelled before anyone read them
            sweep(self._shm_prefix)


def _leave_behind(threads: list[threading.Thread]) -> None:
    """Take ``threads`` (a thread pool's, stuck in a call) out of the joins the interpreter
    makes at exit: concurrent.futures' exit handler joins every pool thread, and threading's
    shutdown joins every non-daemon thread. Both would wait for ever for a call that never
    returns; the thread then ends with the process."""
    import concurrent.futures.thread as cft

    queues = getattr(cft, "_threads_queues", None)
    for thread in threads:
        if queues is not None:
            queues.pop(thread, None)
        lock = getattr(thread, "_tstate_lock", None)
        locks = getattr(threading, "_shutdown_locks", None)
        guard = getattr(threading, "_shutdown_locks_lock", None)
        if lock is not None and locks is not None and guard is not None:
            with guard:
                locks.discard(lock)


def _restoring(inner: Future[Any], slots: Slots | None, lent: str | None) -> Future[Any]:
    """A future for the caller whose result has the shared-memory handles turned into arrays;
    the slot ``lent`` for the task goes back unless the result views it."""
    outer: Future[Any] = Future()

    def cancel_inner(done: Future[Any]) -> None:
        if done.cancelled():
            inner.cancel()

    def transfer(done: Future[Any]) -> None:
        if done.cancelled() or done.exception() is not None:
            if slots is not None:
                slots.give_back(lent)
            if done.cancelled():
                outer.cancel()
            else:
                settle(outer, exc=done.exception())
            return
        value = done.result()
        if outer.cancelled():
            discard(value, slots, lent)
            return
        try:
            restored = restore(value, slots, lent)
        except Exception as err:  # noqa: BLE001 - delivered to the consumer
            discard(value, slots, lent)
            settle(outer, exc=err)
            return
        settle(outer, value=restored)

    outer.add_done_callback(cancel_inner)
    inner.add_done_callback(transfer)
    return outer


def make_pool(workers: int, method: Literal["thread", "process"], *, name: str = "pipeflow",
              start_method: str | None = None, preload: tuple[str, ...] = ()) -> WorkerPool:
    """Create a :class:`WorkerPool` (a seam for tests and future pool kinds)."""
    return WorkerPool(workers, method, name=name, start_method=start_method, preload=preload)


def _pool_key(fn: Callable[..., Any], workers: int, method: str, start_method: str | None) -> Hashable:
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return (module, workers, method, start_method or os.environ.get("PIPEFLOW_START_METHOD"))


def lease_pool(fn: Callable[..., Any], workers: int, method: Literal["thread", "process"], *,
               name: str, start_method: str | None = None, owner: Any = None) -> WorkerPool:
    """A pool for running ``fn``: a warm idle process pool ``owner`` returned earlier, or a new one.

    Thread pools are cheap to start and are never kept.
    """
    if method != "process" or owner is None:
        return make_pool(workers, method, name=name, start_method=start_method)
    preload = _fn_preload(fn)
    key = (id(owner), _pool_key(fn, workers, method, start_method))
    return pool_cache.acquire(
        key, lambda: make_pool(workers, method, name=name, start_method=start_method, preload=preload))


def return_pool(pool: WorkerPool, fn: Callable[..., Any], *, start_method: str | None = None,
                owner: Any = None) -> None:
    """Give back a pool after an epoch that ended normally: kept idle while ``owner`` lives
    (process pools), shut down otherwise."""
    if pool.method != "process" or owner is None:
        pool.shutdown(wait=True)
        return
    key = (id(owner), _pool_key(fn, pool.workers, "process", start_method))
    pool.park()
    pool_cache.release(key, pool, owner)


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
