"""The in-flight window: items pulled from a source, their results computed on a pool, handed
back in input order (or as they complete), with enough bookkeeping to say where to resume.

Every stage that applies a function to items on workers (``map``, ``open``, ``cache``,
``decode`` with ``workers > 0``) runs one :class:`Window`. The window pulls from the source in
the consumer's thread, so upstream stages never run concurrently with themselves, and holds at
most ``limit`` items submitted but not yet delivered: that bound is the backpressure that caps
memory.

Resuming: each task remembers the source's state from just before its item was pulled. The
position of a window is the state before the oldest item not yet delivered, plus (when results
are delivered out of order) which later items were already delivered; :meth:`Window.restart`
takes that skip list back. The items a resume passes over count as delivered from then on: a
state saved after a resume, while an item from before it is still in flight, names them again
(else a second resume would deliver them twice). A task whose result raised stays in the window
until the stage completes it, so after an error the position is still "before the item that
failed".
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Literal, Protocol

from .._checks import check_bool, check_choice, check_int
from .._meter import TaskMeter
from ..errors import WorkerCrashedError
from ..items import describe_item
from ._bootstrap import crashed_error
from .autotune import Gate, Tuner
from .intraop import single_intraop_thread
from .pool import WorkerPool, lease_pool, return_pool

__all__ = ["Source", "Task", "Window", "WindowOptions", "default_limit"]


def default_limit(workers: int, method: str) -> int:
    """The default ``max_inflight`` of a window with ``workers`` workers (threads or processes)."""
    return max(2 * workers, 1)


class Source(Protocol):
    """What a window pulls from: an iterator with a resumable position (a stage)."""

    def __next__(self) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class WindowOptions:
    """How a :class:`Window` runs its function, every value resolved (no ``"auto"``) and checked
    once, here: the window is built from one of these and nobody changes it afterwards.

    Args:
        workers: pool size; 0 runs ``fn`` in the consumer's thread, one item at a time.
        method: ``"thread"`` or ``"process"``.
        in_order: deliver in input order, else as results complete.
        limit: items submitted but not yet delivered (ignored when ``workers`` is 0; default
            :func:`default_limit`).
        name: shown in worker thread names and errors.
        start_method: multiprocessing start method for process workers.
        inline: optional ``item -> (done, value)`` tried first in the consumer's thread (a
            cache hit); ``(False, None)`` sends the item to the pool.
        on_discard: called with the future of every task dropped undelivered whose work could
            not be cancelled (when it completes), to release what its result holds.
        size_of: ``result -> bytes`` of a delivered result, for a tuner's memory budget.
        gated: with a tuner and thread workers, the tuner's value is the calls running at once
            (a :class:`~pipeflow.executor.autotune.Gate`) and twice as many are in flight.
        solo_inline: gated, CPU-bound work: while the tuner has settled at one call at a time,
            the call runs in the consumer's thread (see :attr:`Window.solo`).
    """

    workers: int = 0
    method: Literal["thread", "process"] = "thread"
    in_order: bool = True
    limit: int | None = None
    name: str = "pipeflow"
    start_method: str | None = None
    inline: Callable[[Any], tuple[bool, Any]] | None = None
    on_discard: Callable[[Future[Any]], None] | None = None
    size_of: Callable[[Any], int] | None = None
    gated: bool = False
    solo_inline: bool = False

    def __post_init__(self) -> None:
        check_int(self.workers, "window workers", low=0)
        check_choice(self.method, "window method", ("thread", "process"))
        check_bool(self.in_order, "window in_order")
        check_int(self.limit, "window limit", low=1, optional=True)


class Task:
    """One item in flight: its sequence number, the source state before it, and its future."""

    __slots__ = ("future", "item", "seq", "snapshot")

    def __init__(self, seq: int, snapshot: dict[str, Any], item: Any, future: Future[Any] | None) -> None:
        self.seq, self.snapshot, self.item, self.future = seq, snapshot, item, future


def _timed_call(fn: Callable[[Any], Any], tuner: Tuner, item: Any) -> Any:
    """``fn(item)``, telling ``tuner`` how long it took (a request's latency, retries included)."""
    t0 = perf_counter()
    try:
        return fn(item)
    finally:
        tuner.served(perf_counter() - t0)


def _done(fn: Callable[[Any], Any], item: Any) -> Future[Any]:
    """Run ``fn(item)`` now, in this thread, as an already completed future."""
    future: Future[Any] = Future()
    try:
        future.set_result(fn(item))
    except Exception as exc:  # delivered through the future like a worker's failure
        future.set_exception(exc)
    return future


def _done_as_on_a_thread(fn: Callable[[Any], Any], item: Any) -> Future[Any]:
    """:func:`_done` for an item that would have gone to a thread worker: any exception, an
    interrupt too, comes through the future, as a thread pool delivers it, so the item stays in
    the window (the position stays before it) until the stage completes it."""
    future: Future[Any] = Future()
    try:
        future.set_result(fn(item))
    except BaseException as exc:
        future.set_exception(exc)
    return future


class Window:
    """Up to ``limit`` applications of ``fn`` in flight on ``workers`` threads or processes.

    Args:
        fn: the per-item function (picklable for ``method="process"``).
        options: how it runs (:class:`WindowOptions`).
        tuner: when set, it owns the limit (``options.workers`` is then the pool's upper
            bound) and is told of every delivered item.
        owner: the object whose lifetime bounds idle process pools kept between epochs (the
            pipeline's stats); None keeps the pool until :meth:`shutdown`.
    """

    def __init__(self, fn: Callable[[Any], Any], options: WindowOptions | None = None, *,
                 tuner: Tuner | None = None, owner: Any = None) -> None:
        options = options or WindowOptions()
        self.fn = fn
        self.options = options
        workers, method = options.workers, options.method
        self.workers = workers
        self.method = method
        self.in_order = options.in_order
        self._limit = (options.limit or default_limit(workers, method)) if workers else 1
        self.tuner = tuner
        self.gate = Gate(tuner) if tuner is not None and options.gated and method == "thread" else None
        self._solo_inline = self.gate is not None and options.solo_inline
        self.size_of = options.size_of
        #: items per process task: two tasks per worker fill the window, each carrying as many
        #: items as that leaves room for (1 with the default window; a deeper ``max_inflight``
        #: asks for chunks, which divide the per-task cost for small per-item work). A tuned
        #: window moves its limit, so it keeps one item per task.
        self.chunk = (max(1, self._limit // (2 * workers))
                      if workers and method == "process" and tuner is None else 1)
        self.name = options.name
        self.start_method = options.start_method
        self.inline = options.inline
        self.on_discard = options.on_discard
        self.owner = owner
        self._pool: WorkerPool | None = None
        self._pending: deque[Task] = deque()
        #: the measurement hook: the workers' time in ``fn``
        self.meter = TaskMeter()
        self._clear()

    @property
    def busy_s(self) -> float:
        """Seconds the workers spent in ``fn``, summed over workers (see
        :attr:`~pipeflow._meter.TaskMeter.busy_s`)."""
        return self.meter.busy_s

    @property
    def limit(self) -> int:
        """Items submitted but not yet delivered, at most (the tuner's value when tuned)."""
        tuner = self.tuner
        if tuner is None or not self.workers:
            return self._limit
        if self.gate is None:
            return tuner.value
        return 1 if self.solo else 2 * tuner.value

    @property
    def running(self) -> int:
        """Calls of ``fn`` that may run at once: the workers, or fewer when tuned."""
        tuner = self.tuner
        if tuner is None or not self.workers:
            return self.workers
        return min(self.workers, tuner.value if self.gate is not None else self.limit)

    @property
    def solo(self) -> bool:
        """True while the calls run in the consumer's thread: CPU-bound work whose tuner tried
        two calls at once and settled back at one (the machine gave the second no gain). A
        decode thread would then cost a hand-off per item (a queue put, wake-ups, a future: a
        few percent of a ~1 ms JPEG decode) to overlap only the consumer's own share of the
        work. The tuner's next probe one step up goes back to the threads, and stays there if it
        pays. Not where one call is all the tuner may run (one core per DataLoader worker):
        nothing would ever measure the thread's overlap with the consumer (its reads of a
        stream from a store, its collate) against this. Nor where the consumer's thread runs torch
        operators on a team of threads (the training thread iterating a pipeline itself, or
        ``DataLoader(num_workers=0)``): a decode's resize there would run on that team, which
        on busy cores waits on its barriers (see :mod:`~pipeflow.executor.intraop`), where a
        decode thread runs it alone."""
        tuner = self.tuner
        return (self._solo_inline and tuner is not None and tuner.value == 1 and tuner.high > 1
                and tuner.settled and single_intraop_thread())

    # ---- lifecycle ------------------------------------------------------------------------
    def restart(self, skip: Iterable[int] = ()) -> None:
        """Drop what is in flight and start counting from a resume point; ``skip`` lists the
        offsets (from the resume point) of items delivered before it."""
        self._clear(skip)
        if self.tuner is not None:
            self.tuner.pause()
        if self.workers and self._pool is None:
            # started lazily: no pool (and no process) exists before the first pass
            self._pool = lease_pool(self.fn, self.workers, self.method, name=self.name,
                                    start_method=self.start_method, owner=self.owner)

    def _clear(self, skip: Iterable[int] = ()) -> None:
        self.cancel()
        self._exhausted = False
        self._seq = 0  # sequence number of the next item pulled, relative to the resume point
        #: items delivered before the resume point's state was saved, not yet pulled again
        self._skip: set[int] = set(skip)
        #: delivered (or passed over as delivered before the resume) while an older item is
        #: still pending; kept until the oldest pending item passes them
        self._delivered: set[int] = set()

    def _release(self) -> None:
        """Exhausted, nothing in flight: a process pool goes back to the per-process cache,
        so the next epoch's window (a new graph) gets the same warm workers."""
        pool = self._pool
        if pool is None or self.owner is None or pool.method != "process":
            return
        self._pool = None
        return_pool(pool, self.fn, start_method=self.start_method, owner=self.owner)

    def cancel(self) -> None:
        """Drop every task not yet delivered."""
        for task in self._pending:
            if task.future is None:  # interrupted between pulling it and sending it
                continue
            if not task.future.cancel() and self.on_discard is not None:
                task.future.add_done_callback(self.on_discard)
        self._pending.clear()

    def shutdown(self, wait: bool = True, bound: float | None = None, name: str = "") -> None:
        """Drop what is in flight and stop the workers (waiting at most ``bound`` seconds for
        threads, see :meth:`Pool.shutdown`)."""
        self.cancel()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=wait, bound=bound, name=name)

    def futures(self) -> list[Future[Any]]:
        """The futures of the tasks not yet delivered, oldest first."""
        return [t.future for t in self._pending if t.future is not None]

    # ---- work -----------------------------------------------------------------------------
    def next_task(self, source: Source) -> Task | None:
        """The task to deliver next (waiting for it), or None when the source is exhausted and
        nothing is left. The task stays in the window until :meth:`complete`."""
        self._fill(source)
        if not self._pending:
            self._release()
            return None
        if self.in_order or len(self._pending) == 1:
            return self._pending[0]
        # every task has its future here: _fill() sends what it pulled before returning
        t0 = perf_counter()
        done, _ = wait([t.future for t in self._pending if t.future is not None],
                       return_when=FIRST_COMPLETED)
        if self.tuner is not None:  # the consumer waited for the first result to come
            self.tuner.waited(perf_counter() - t0)
        return next(t for t in self._pending if t.future in done)

    def wait(self, task: Task) -> Any:
        """``task``'s result (raising its error), waiting for it; a tuner learns how long the
        consumer waited."""
        future = task.future
        assert future is not None  # next_task() returns sent tasks only
        tuner = self.tuner
        if tuner is None or future.done():
            return future.result()
        t0 = perf_counter()
        try:
            return future.result()
        finally:
            tuner.waited(perf_counter() - t0)

    def complete(self, task: Task) -> None:
        """``task`` was delivered (or skipped): it leaves the window."""
        pending = self._pending
        if pending and pending[0] is task:
            pending.popleft()
        else:
            pending.remove(task)
            self._delivered.add(task.seq)  # an older task is still pending
        oldest = pending[0].seq if pending else self._seq
        self._delivered = {s for s in self._delivered if s >= oldest}
        if self.tuner is not None:
            self.tuner.delivered(self._size(task.future))

    def _size(self, future: Future[Any] | None) -> int:
        if self.size_of is None or future is None or not future.done() or future.exception() is not None:
            return 0
        return self.size_of(future.result())

    def _fill(self, source: Source) -> None:
        # decided once per fill (only delivery, in this thread, moves the tuner): solo, one item
        # at a time, in this thread, once the pool's items were delivered
        solo, limit = self.solo, self.limit
        batch: list[Task] = []  # pulled, to be sent to a process worker as one task
        try:
            while not self._exhausted:
                room = limit - len(self._pending)
                if room <= 0 or (not batch and self._pending and room < self.chunk):
                    # a new chunk waits for room for all of it: topping up one item at a
                    # time would send one-item tasks for good
                    return
                snapshot = source.state_dict()
                try:
                    item = next(source)
                except StopIteration:
                    self._exhausted = True
                    return
                seq = self._seq
                self._seq += 1
                if seq in self._skip:
                    self._skip.discard(seq)
                    if self._pending:  # an older item is in flight: the next state names it
                        self._delivered.add(seq)
                    continue
                task = Task(seq, snapshot, item, None)
                self._pending.append(task)
                try:
                    self._start(task, batch, solo)
                except BaseException:
                    self._unsubmitted(batch if task in batch else [task])
                    raise
        finally:
            if batch:  # every task in the window has a future before anyone waits on one
                self._submit(batch)

    def _start(self, task: Task, batch: list[Task], solo: bool = False) -> None:
        item = task.item
        if self.inline is not None:
            done, value = self.inline(item)
            if done:
                task.future = Future()
                task.future.set_result(value)
                return
        if self._pool is None:
            task.future = _done(self.fn, item)
        elif solo:  # timed as a thread task would be: the stage's busy time counts it
            task.future = _done_as_on_a_thread(self.meter.thread_task(self.fn), item)
        elif self.chunk > 1 and self._pool.method == "process":
            batch.append(task)
            if len(batch) >= self.chunk:
                self._submit(batch)
        else:
            task.future = self._submit_one(item)

    def _submit_one(self, item: Any) -> Future[Any]:
        assert self._pool is not None
        try:
            if self._pool.method == "thread":
                fn = self.meter.thread_task(self.fn)
                if self.tuner is not None and self.tuner.store:  # it sizes from latency
                    fn = functools.partial(_timed_call, fn, self.tuner)
                if self.gate is not None:  # waits for its turn in the gate's queue
                    return self.gate.submit(self._pool.submit, fn, item)
                return self._pool.submit(fn, item)
            future = self._pool.submit(self.fn, item)
            future.add_done_callback(self.meter.process_task())
            return future
        except BrokenProcessPool as exc:  # a worker died before this item was queued
            return self._not_submitted(item, exc)

    def _submit(self, batch: list[Task]) -> None:
        """Send ``batch`` to the process pool as one task (a future per item); empties it."""
        assert self._pool is not None
        items = [t.item for t in batch]
        try:
            futures = self._pool.submit_chunk(self.fn, items)
            futures[-1].add_done_callback(self.meter.process_task())
        except BrokenProcessPool as exc:
            futures = [self._not_submitted(item, exc) for item in items]
        except BaseException:
            self._unsubmitted(batch)
            raise
        for task, future in zip(batch, futures):
            task.future = future
        batch.clear()

    def _unsubmitted(self, tasks: list[Task]) -> None:
        """The pool refused ``tasks`` (the newest in the window): they leave it, as an item
        whose submission raised always did."""
        for task in tasks:
            if task in self._pending:
                self._pending.remove(task)
        tasks.clear()

    def _not_submitted(self, item: Any, exc: BaseException) -> Future[Any]:
        # delivered through the task, so the position stays before this item
        crashed = self.crashed(f"could not submit {describe_item(item)}")
        crashed.__cause__ = exc
        failed: Future[Any] = Future()
        failed.set_exception(crashed)
        return failed

    def crashed(self, detail: str) -> WorkerCrashedError:
        """The error for a dead process worker (says when a missing main guard is the cause)."""
        start_method = self._pool.start_method if self._pool is not None else None
        return crashed_error(self.name, start_method, detail)

    # ---- position -------------------------------------------------------------------------
    def position(self, source: Source) -> tuple[dict[str, Any], list[int]]:
        """``(source state, skip offsets)`` to resume after the last item delivered.

        The skip offsets are the items after that state delivered already: delivered out of
        order in this run, passed over as delivered before this run's resume point, or named
        by that resume point and not pulled yet (a smaller window did not reach them)."""
        pending = self._pending  # in pull order: the oldest first
        if pending:
            snapshot, first = pending[0].snapshot, pending[0].seq
        else:
            snapshot, first = source.state_dict(), self._seq
        return snapshot, sorted(s - first for s in self._delivered | self._skip if s >= first)

    def __iter__(self) -> Iterator[Task]:
        return iter(list(self._pending))

