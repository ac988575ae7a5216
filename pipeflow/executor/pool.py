"""Thread and process worker pools.

The pools are thin owners of ``concurrent.futures`` executors; what pipeflow adds is the policy
around them: the choice of start method, the fallback inside daemonic DataLoader workers (which
may not have children), translation of a dead worker into :class:`WorkerCrashedError`, and a
shutdown that never leaves a process behind even if a task hangs.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Literal

from .._checks import check_choice, check_int
from .._once import first_time

__all__ = ["WorkerPool", "make_pool"]

#: how long close() waits for busy process workers before terminating them
PROCESS_GRACE_SECONDS = 5.0


def _default_start_method() -> str:
    # fork is unsafe once the parent runs threads (prefetchers, S3 clients); forkserver is the
    # safe, reasonably fast choice on Linux, spawn elsewhere.
    methods = multiprocessing.get_all_start_methods()
    return "forkserver" if "forkserver" in methods else "spawn"


def _preload_forkserver(ctx: Any) -> None:
    # The fork server imports these once; every worker forked from it then starts in
    # milliseconds instead of importing torch and pipeflow again (seconds each). It only
    # takes effect if the fork server is not running yet.
    ctx.set_forkserver_preload(["__main__", "pipeflow", "pipeflow.stages.map"])


class WorkerPool:
    """N workers running ``fn(item)`` tasks on threads or processes.

    Args:
        workers: number of workers (>= 1).
        method: ``"thread"`` or ``"process"``.
        name: shown in thread names and errors.
        start_method: multiprocessing start method for process workers
            (default: ``PIPEFLOW_START_METHOD`` or forkserver on Linux).
    """

    def __init__(self, workers: int, method: Literal["thread", "process"], *, name: str = "pipeflow",
                 start_method: str | None = None) -> None:
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
        if method == "thread":
            self._executor = ThreadPoolExecutor(workers, thread_name_prefix=f"pipeflow-{name}")
        else:
            method_name = start_method or os.environ.get("PIPEFLOW_START_METHOD") or _default_start_method()
            ctx = multiprocessing.get_context(method_name)
            self.start_method = method_name
            if method_name == "forkserver":
                _preload_forkserver(ctx)
            self._executor = ProcessPoolExecutor(workers, mp_context=ctx)
        self._closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        return self._executor.submit(fn, *args)

    def shutdown(self, wait: bool = True) -> None:
        """Cancel queued tasks and stop the workers; process workers that do not finish in
        ``PROCESS_GRACE_SECONDS`` are terminated. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        executor = self._executor
        if isinstance(executor, ThreadPoolExecutor):
            executor.shutdown(wait=wait, cancel_futures=True)
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


def make_pool(workers: int, method: Literal["thread", "process"], *, name: str = "pipeflow",
              start_method: str | None = None) -> WorkerPool:
    """Create a :class:`WorkerPool` (a seam for tests and future pool kinds)."""
    return WorkerPool(workers, method, name=name, start_method=start_method)
