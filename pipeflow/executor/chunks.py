"""Several items in one process task, each with its own outcome.

A process task costs a fixed amount besides the work (a future, a wake-up of the executor's
manager thread, a pickled message each way, a lock on the result queue): about 0.1-0.3 ms here,
as much as a tenth of a small JPEG decode. Sending a few items per task divides that cost,
as ``ProcessPoolExecutor.map(chunksize=...)`` does, but unlike ``map`` each item keeps its own
result or exception: the worker catches per item, and the owner turns one task's reply back
into one future per item, so order, errors (type, traceback, the item named) and resume
positions are exactly those of one task per item.
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any

from .shm import discard, restore, run_task

__all__ = ["RemoteTraceback", "run_chunk", "settle", "spread"]


class RemoteTraceback(Exception):
    """The worker's traceback, attached as ``__cause__`` of an error raised by ``fn`` (as
    ``concurrent.futures`` does for one-item tasks)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


# ---- worker side ----------------------------------------------------------------------------
def run_chunk(fn: Callable[[Any], Any], items: Sequence[Any]) -> bytes:
    """What a process worker runs for a chunk: ``[(ok, value or error, traceback), ...]``,
    pickled here so that a result that cannot be pickled fails its own item only."""
    outcomes: list[tuple[bool, Any, str]] = []
    try:
        for item in items:
            try:
                outcomes.append((True, run_task(fn, item), ""))
            except Exception as exc:  # noqa: BLE001 - delivered to the item's future
                outcomes.append((False, exc, "".join(traceback.format_exception(exc))))
    except BaseException:  # the whole task fails: nobody will read what was exported
        for ok, value, _ in outcomes:
            if ok:
                discard(value)
        raise
    try:
        return pickle.dumps(outcomes, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - find the item(s) at fault; the rest go through
        return pickle.dumps([_picklable(o) for o in outcomes], protocol=pickle.HIGHEST_PROTOCOL)


def _picklable(outcome: tuple[bool, Any, str]) -> tuple[bool, Any, str]:
    try:
        pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - this item's error
        if outcome[0]:
            discard(outcome[1])
        return (False, exc, "".join(traceback.format_exception(exc)))
    return outcome


# ---- owner side -----------------------------------------------------------------------------
def spread(inner: Future[Any], outers: list[Future[Any]]) -> None:
    """Make each of ``outers`` follow its item's outcome in ``inner`` (a :func:`run_chunk`
    task); ``inner`` is cancelled once every outer future is."""
    left = [len(outers)]

    def cancelled(done: Future[Any]) -> None:
        if done.cancelled():
            left[0] -= 1
            if left[0] == 0:
                inner.cancel()

    for outer in outers:
        outer.add_done_callback(cancelled)
    inner.add_done_callback(lambda done: _deliver(done, outers))


def _deliver(inner: Future[Any], outers: list[Future[Any]]) -> None:
    if inner.cancelled():
        for outer in outers:
            outer.cancel()
        return
    exc = inner.exception()
    outcomes: Any = None
    if exc is None:
        try:
            outcomes = pickle.loads(inner.result())
        except Exception as err:  # noqa: BLE001 - delivered to every item
            exc = err
    if exc is not None:
        for outer in outers:
            settle(outer, exc=exc)
        return
    for outer, (ok, value, tb) in zip(outers, outcomes):
        if not ok:
            value.__cause__ = RemoteTraceback(tb)
            settle(outer, exc=value)
        elif outer.cancelled():
            discard(value)
        else:
            try:
                settle(outer, value=restore(value))
            except Exception as err:  # noqa: BLE001 - delivered to the consumer
                discard(value)
                settle(outer, exc=err)


def settle(future: Future[Any], *, value: Any = None, exc: BaseException | None = None) -> None:
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(value)
    except InvalidStateError:  # cancelled meanwhile; what it carried is dropped
        pass
