"""``map``: apply a callable to every item, inline or on thread/process workers."""

from __future__ import annotations

import logging
import pickle
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Literal

from ..errors import ConfigError, WorkerCrashedError
from ..executor.pool import WorkerPool, lease_pool, return_pool
from .base import Stage, describe_item

__all__ = ["Mapper"]

log = logging.getLogger("pipeflow")


class _Task:
    __slots__ = ("future", "item", "seq", "snapshot")

    def __init__(self, seq: int, snapshot: dict[str, Any], item: Any, future: Future[Any]) -> None:
        self.seq, self.snapshot, self.item, self.future = seq, snapshot, item, future


class Mapper(Stage[Any]):
    """Yields ``fn(item)`` for every item of ``source``.

    With ``workers > 0``, up to ``max_inflight`` items (default ``2 * workers``) are in flight
    at once: this is the backpressure that bounds memory. The consumer's thread pulls from the
    source, so upstream stages never run concurrently with themselves.

    Errors raised by ``fn`` are re-raised in the consumer with their original type and a note
    naming this stage and the item; with ``on_error="skip"`` they are counted in
    ``stats()[name]["skipped"]`` and logged instead. A worker process that dies raises
    :class:`~pipeflow.errors.WorkerCrashedError`.

    State: the source position before the oldest item not yet delivered (plus, when unordered,
    which later items were already delivered). Items in flight are recomputed after a resume.

    Args:
        source: the input stage.
        fn: a plain callable; for ``method="process"`` it must be picklable (module level).
        workers: 0 runs ``fn`` inline in the consumer's thread.
        method: ``"thread"`` or ``"process"``.
        in_order: deliver results in input order (default) or as they complete.
        max_inflight: bound on items submitted but not yet delivered.
        on_error: ``"raise"`` or ``"skip"``.
        start_method: multiprocessing start method for process workers.
    """

    def __init__(self, source: Stage[Any], fn: Callable[[Any], Any], *, workers: int = 0,
                 method: Literal["thread", "process"] = "thread", in_order: bool = True,
                 max_inflight: int | None = None, on_error: Literal["raise", "skip"] = "raise",
                 start_method: str | None = None) -> None:
        super().__init__(source)
        if not callable(fn):
            raise ConfigError(f"map() needs a callable, got {type(fn).__name__}")
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
            raise ConfigError(f"map(workers=...) must be a non-negative int, got {workers!r}")
        if method not in ("thread", "process"):
            raise ConfigError(f"map(method=...) must be 'thread' or 'process', got {method!r}")
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if max_inflight is not None and (not isinstance(max_inflight, int) or max_inflight < 1):
            raise ConfigError(f"map(max_inflight=...) must be a positive int, got {max_inflight!r}")
        self._fn = fn
        self._workers = workers
        self._method = method
        self._in_order = in_order
        self._max_inflight = max_inflight or max(2 * workers, 1)
        self._on_error = on_error
        self._start_method = start_method
        self._pool: WorkerPool | None = None
        if workers and method == "process":
            self._check_picklable()
        self._reset_run()

    def _reset_run(self) -> None:
        self._pending: deque[_Task] = deque()
        self._exhausted = False
        self._seq = 0  # sequence number of the next item pulled, relative to the resume point
        self._skip: set[int] = set()  # sequence numbers delivered before the resume point
        self._delivered: set[int] = set()  # unordered: delivered while older ones are pending

    # ---- lifecycle ------------------------------------------------------------------------
    def reset(self, state: dict[str, Any] | None = None) -> None:
        self._needs_reset = False
        self._closed = False
        self._cancel_pending()
        self._reset_run()
        if state:
            self.source.reset(state["source"])
            self._skip = set(state.get("skip", ()))
        else:
            self.source.reset(None)
        if self._workers and self._pool is None:
            self._pool = lease_pool(self._fn, self._workers, self._method, name=self.name,
                                    start_method=self._start_method, owner=self._pool_owner())

    def _pool_owner(self) -> object:
        # Process pools are kept between epochs for as long as the pipeline lives; its stats
        # object lives exactly as long and reaches every stage of every epoch's graph.
        return self.context.stats

    def _release_pool(self) -> None:
        """The epoch ended with nothing in flight: keep the workers warm for the next one."""
        pool, self._pool = self._pool, None
        if pool is not None:
            return_pool(pool, self._fn, start_method=self._start_method, owner=self._pool_owner())

    def _check_picklable(self) -> None:
        try:
            pickle.dumps(self._fn)
        except Exception as exc:
            raise ConfigError(
                f"{self.name}: method='process' needs a picklable function (defined at module level, "
                f"not a lambda or closure); {self._fn!r} is not: {exc}") from exc

    def _cancel_pending(self) -> None:
        for task in self._pending:
            task.future.cancel()
        self._pending.clear()

    def close(self) -> None:
        self._cancel_pending()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        super().close()

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False)

    # ---- work -----------------------------------------------------------------------------
    def _inline(self, item: Any) -> tuple[bool, Any]:
        """A hook for subclasses: ``(True, result)`` when an item is cheap enough to finish in
        the consumer's thread (a cache hit), else ``(False, None)`` to send it to the pool."""
        return False, None

    def _apply(self, item: Any) -> tuple[bool, Any]:
        try:
            return True, self._fn(item)
        except Exception as exc:
            return self._failed(exc, item)

    def _failed(self, exc: BaseException, item: Any) -> tuple[bool, Any]:
        if isinstance(exc, BrokenProcessPool):
            raise WorkerCrashedError(
                f"a worker process of {self.name} died (killed, out of memory or crashed) while items "
                f"were in flight, the oldest being {describe_item(item)}") from exc
        if self._on_error == "skip":
            self.context.stats.incr(self.name, "skipped")
            log.warning("pipeflow: %s skipped %s: %s: %s", self.name, describe_item(item),
                        type(exc).__name__, exc)
            return False, None
        exc.add_note(f"pipeflow: raised in stage {self.name} on {describe_item(item)}")
        raise exc

    def _fill(self) -> None:
        pool = self._pool
        if pool is None:  # released at the end of the epoch: nothing more to pull
            return
        while not self._exhausted and len(self._pending) < self._max_inflight:
            snapshot = self.source.state_dict()
            try:
                item = next(self.source)
            except StopIteration:
                self._exhausted = True
                return
            seq = self._seq
            self._seq += 1
            if seq in self._skip:
                self._skip.discard(seq)
                continue
            done, value = self._inline(item)
            if done:
                future: Future[Any] = Future()
                future.set_result(value)
            else:
                try:
                    future = pool.submit(self._fn, item)
                except BrokenProcessPool as exc:  # a worker died before this item was queued
                    raise WorkerCrashedError(
                        f"a worker process of {self.name} died (killed, out of memory or crashed); "
                        f"could not submit {describe_item(item)}") from exc
            self._pending.append(_Task(seq, snapshot, item, future))

    def next(self) -> Any:
        if not self._workers:
            while True:
                ok, value = self._apply(next(self.source))
                if ok:
                    return value
        while True:
            self._fill()
            if not self._pending:
                self._release_pool()
                raise StopIteration
            if self._in_order:
                task = self._pending.popleft()
            else:
                task = self._first_done()
            try:
                value = task.future.result()
            except Exception as exc:
                ok, value = self._failed(exc, task.item)
                if not ok:
                    continue
            return value

    def _first_done(self) -> _Task:
        done, _ = wait([t.future for t in self._pending], return_when=FIRST_COMPLETED)
        for i, task in enumerate(self._pending):
            if task.future in done:
                del self._pending[i]
                if self._pending and task.seq > self._pending[0].seq:
                    self._delivered.add(task.seq)
                oldest = self._pending[0].seq if self._pending else self._seq
                self._delivered = {s for s in self._delivered if s >= oldest}
                return task
        raise AssertionError("wait() returned no finished task")  # pragma: no cover

    def get_state(self) -> dict[str, Any]:
        if not self._pending:
            return {"source": self.source.state_dict(), "skip": []}
        oldest = self._pending[0] if self._in_order else min(self._pending, key=lambda t: t.seq)
        skip = sorted(s - oldest.seq for s in self._delivered if s > oldest.seq)
        skip += sorted(s - oldest.seq for s in self._skip if s > oldest.seq)
        return {"source": oldest.snapshot, "skip": skip}
