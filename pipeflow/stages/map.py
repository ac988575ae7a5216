"""``map``: apply a callable to every item, inline or on thread/process workers.

:class:`WindowedStage` is the shared shape of every stage that applies a function to items
(``map``, ``open``, ``cache``, ``decode``): it runs one :class:`~pipeflow.executor.window.Window`
and decides what a failed item means (skip and count it, or raise it with a note naming the
stage and item). A stage says how in one :class:`WindowedOptions`, checked where the pipeline
is written; the window is built from it once, at the first start (``"auto"`` is sized in the
process that runs the work), and nobody changes it afterwards.
"""

from __future__ import annotations

import functools
import logging
import pickle
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Literal

from .._checks import check_bool, check_choice, check_int_or_auto, is_int
from ..errors import ConfigError, WorkerCrashedError
from ..executor.autotune import AUTO, BYTE_BUDGET, Kind, Tuner, bounds, dataloader_workers
from ..executor.pool import prestart, stop_grace_seconds
from ..executor.window import Window, WindowOptions
from .base import SOURCES_KEY, Rewind, Stage, describe_item

__all__ = ["Mapper", "WindowedOptions", "WindowedStage"]

log = logging.getLogger("pipeflow")


@dataclass(frozen=True)
class WindowedOptions:
    """How a :class:`WindowedStage` applies its function; checked on construction.

    Args:
        what: the method name used in option errors (``"map"``, ``"open"``, ...).
        workers, method, in_order, max_inflight, start_method: see :class:`Mapper`.
        on_error: ``"raise"`` or ``"skip"``.
        inline: ``item -> (done, value)`` tried in the consumer's thread first (cache hits).
        on_discard: releases the result of a task dropped undelivered (open streams).
        skippable: which exceptions ``on_error="skip"`` may skip (default: all).
        kind: what bounds ``"auto"``: ``"cpu"`` work, ``"thread"`` work that may wait, or
            ``"io"`` requests (see :func:`~pipeflow.executor.autotune.bounds`); by default
            ``"thread"`` for thread workers and ``"cpu"`` for processes.
        size_of: ``result -> bytes`` held in flight, for the memory budget of ``"auto"``.
    """

    what: str
    workers: int | str = 0
    method: Literal["thread", "process"] = "thread"
    in_order: bool = True
    max_inflight: int | str | None = None
    on_error: Literal["raise", "skip"] = "raise"
    start_method: str | None = None
    inline: Callable[[Any], tuple[bool, Any]] | None = None
    on_discard: Callable[[Future[Any]], None] | None = None
    skippable: Callable[[BaseException], bool] | None = None
    kind: Kind | None = None
    size_of: Callable[[Any], int] | None = None

    def __post_init__(self) -> None:
        what = self.what
        check_int_or_auto(self.workers, f"{what}(workers=...)", low=0)
        check_choice(self.method, f"{what}(method=...)", ("thread", "process"))
        check_bool(self.in_order, f"{what}(in_order=...)")
        check_choice(self.on_error, f"{what}(on_error=...)", ("raise", "skip"))
        check_int_or_auto(self.max_inflight, f"{what}(max_inflight=...)", low=1, optional=True)
        if self.max_inflight == AUTO and self.workers == 0:
            raise ConfigError(f"{what}(max_inflight='auto') needs workers > 0 or workers='auto'")

    @property
    def tuned(self) -> bool:
        """True when a :class:`~pipeflow.executor.autotune.Tuner` sizes the window."""
        return AUTO in (self.workers, self.max_inflight)

    def window(self, name: str) -> tuple[WindowOptions, Tuner | None]:
        """The window's options and its tuner, ``"auto"`` sized for this process."""
        workers, limit, tuner = self.workers, self.max_inflight, None
        if self.tuned:
            workers, tuner = self._tune()
            limit = None
        assert is_int(workers) and (limit is None or is_int(limit))  # "auto" resolved above
        return WindowOptions(workers=workers, method=self.method, in_order=self.in_order, limit=limit,
                             name=name, start_method=self.start_method, inline=self.inline,
                             on_discard=self.on_discard, size_of=self.size_of,
                             gated=self._gated, solo_inline=self._gated and self._kind == "cpu"), tuner

    @property
    def _kind(self) -> Kind:
        return self.kind or ("thread" if self.method == "thread" else "cpu")

    @property
    def _gated(self) -> bool:
        """Work on threads tuned whole (``workers="auto"``, no explicit bound on items in flight:
        a thread map, a decode on threads): its tuner sets the calls running at once, with
        twice as many items in flight, as ``workers=N`` keeps ``2 * N``. A thread that finishes
        then takes the next item at once, instead of idling until the consumer takes the oldest
        result (with one core per DataLoader worker, a decode tuned to one call in flight
        decoded nothing while its consumer collated)."""
        kind = self._kind
        return (kind in ("thread", "cpu") and self.method == "thread" and self.workers == AUTO
                and not is_int(self.max_inflight))

    def _tune(self) -> tuple[int, Tuner]:
        """The pool's size and the tuner that moves the limit below it."""
        kind = self._kind
        workers, max_inflight = self.workers, self.max_inflight
        if workers == AUTO:
            start, high = bounds(kind)
            if kind == "cpu" and self.method == "process":
                # Processes share no GIL: start at one per core. From one item in flight, its
                # process idles while this process turns each result around, and the first
                # doubling (two items on two processes) idles both the same way: worth
                # 1.04-1.4x, it read as no gain on a loaded machine in two benchmark repeats
                # of three, and the tuner kept one item in flight (one process with two
                # delivered 1.45x as much). Where the map is not the limit, the idle
                # processes cost memory only.
                start = high
            if is_int(max_inflight):  # an explicit bound on items in flight caps everything
                size, tuner = min(high, max_inflight), Tuner(1, max_inflight, min(start, max_inflight))
            elif self._gated:  # the value is the calls running at once, on a pool that size
                size, tuner = high, Tuner(1, high, start)
            else:
                # results delivered in order hold their slot until delivered, so the limit may
                # go past the pool's size. Whole objects (`open(read=True)`): a quarter of the
                # limit's bound may run at once, the rest holds results behind a slow head (a
                # request being retried). Under a steady 10% of 503s, 16 requests running of
                # up to 64 in flight per DataLoader worker delivered 1.14x what 32 of 64 did
                # (8 interleaved pairs of 15 s), and as much without 503s (0.99x at T=0 and
                # 20 ms): threads beyond what the latency needs only cost CPU
                size, tuner = (max(1, high // 2) if kind == "io" else high), Tuner(1, 2 * high, start)
        else:
            assert is_int(workers)  # max_inflight is the "auto" one
            size, tuner = workers, Tuner(workers, 4 * workers, 2 * workers)
        if kind in ("io", "stream"):
            tuner.byte_budget = BYTE_BUDGET // dataloader_workers()
            tuner.store = True  # requests: latency and demand size the limit
        return size, tuner


def _decisions(tuner: Tuner) -> dict[str, float]:
    """What a tuner decided, for ``stats()``: how it climbed (steps up, probes of a settled
    limit, seconds of delivery until it first settled), its push-backs and the ones it undid,
    and for requests to a store the latency it sizes from (milliseconds, the last interval's
    mean)."""
    numbers: dict[str, float] = {}
    if tuner.settled_after_s is not None:
        numbers["settle_s"] = round(tuner.settled_after_s, 3)
    for key in ("steps_up", "probes", "followed", "backoffs", "steady_errors", "slowdowns"):  # when any
        if getattr(tuner, key):
            numbers[key] = getattr(tuner, key)
    if tuner.latency_s is not None:
        numbers["latency_ms"] = round(1000.0 * tuner.latency_s, 3)
    return numbers


class WindowedStage(Stage[Any]):
    """A one-input stage yielding ``fn(item)`` for every item, through an in-flight window.

    Args:
        source: the input stage.
        fn: the per-item function.
        options: how it is applied (:class:`WindowedOptions`).

    State: the source position before the oldest item not yet delivered (plus, when unordered,
    which later items were already delivered). Items in flight are recomputed after a resume;
    an item whose function raised was not delivered, so the state stays before it.
    """

    def __init__(self, source: Stage[Any], fn: Callable[[Any], Any], options: WindowedOptions) -> None:
        super().__init__(source)
        if not callable(fn):
            raise ConfigError(f"{options.what}() needs a callable, got {type(fn).__name__}")
        #: how this stage applies its function (read-only)
        self.window_options = options
        self._fn = fn
        self._inline = options.inline
        #: 0 runs ``fn`` in the consumer's thread and no window is ever built
        self._pooled = options.workers != 0
        #: skips would make equalize's count an overestimate
        self.one_to_one = options.on_error == "raise"
        #: unordered, the state names the items delivered ahead by their count in the input
        self.ordered_output = options.in_order
        self.replays_input = not options.in_order
        if self._pooled and options.method == "process":
            self._check_picklable()
        self._prestart = self._pooled and options.method == "process"
        #: built at the first start() from the options, then kept: the pool and the tuner's
        #: value carry over restarts (repeat() resets this stage every round)
        self._window: Window | None = None
        #: inline (workers=0): the position before an item whose function raised
        self._rewind = Rewind(samples=True)
        self._undelivered = 0
        self._dropped = 0  # inline: items pulled and not delivered (skipped, or raised)

    elastic_roles = frozenset({"before_shard", "to_drop_point", "after_drop_point"})

    def elastic_supported(self) -> bool:
        return self.window_options.in_order  # unordered: a state cannot name which items were delivered

    @classmethod
    def keeps_steps(cls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        # skips would shift every later item, and an unordered window reorders them
        return kwargs.get("on_error", "raise") == "raise" and kwargs.get("in_order", True) is True

    def _check_picklable(self) -> None:
        try:
            pickle.dumps(self._fn)
        except Exception as exc:
            raise ConfigError(
                f"{self.name}: method='process' needs a picklable function (defined at module level, "
                f"not a lambda or closure); {self._fn!r} is not: {exc}") from exc

    @property
    def window(self) -> Window | None:
        """The in-flight window (read it, e.g. ``window.futures()``; the stage drives it), from
        the first start on; None before, and always with ``workers=0``."""
        return self._window

    def measure(self) -> dict[str, float]:
        numbers = super().measure()
        window = self._window
        workers = window.workers if window is not None else 0
        if window is not None and window.tuner is not None and workers:
            workers = window.running  # the pool's threads beyond the tuned limit stay idle
            numbers["inflight"] = window.limit
            numbers.update(_decisions(window.tuner))
        numbers["workers"] = workers
        if window is not None and workers:
            # the work runs on the pool: the consumer's thread only waits for it; process
            # tasks are timed from submission, so a queued task's wait is capped here
            numbers["busy_s"] = min(window.busy_s, self._meter.active() * workers)
            numbers["lanes"] = workers
        return numbers

    def delivered(self) -> int | None:
        # inline, items are counted from the pulls the stage counts anyway; with workers every
        # item costs far more than counting it per call
        return None if self._pooled else self._rewind.pulls - self._dropped

    # ---- lifecycle ------------------------------------------------------------------------
    def start(self, state: dict[str, Any] | None) -> None:
        if self._prestart:
            # before the upstream stages produce anything: the fork server's imports (1-2 s)
            # overlap their first items instead of following them
            self._prestart = False
            prestart(self._fn, self.window_options.start_method)
        Rewind.replay(self.source, state)
        self._rewind.restart(self.source)
        self._undelivered = 0
        if not self._pooled:
            return
        if self._window is None:
            options, tuner = self.window_options.window(self.name)
            # idle process pools live as long as the pipeline (its stats)
            self._window = Window(self._fn, options, tuner=tuner, owner=self.context.stats)
            if tuner is not None:  # retried requests of this stage make the tuner back off
                tuner.watch(functools.partial(self.context.stats.count, self.name, "retries"))
                self._share_limits(tuner)
        self._window.restart(state.get("skip", ()) if state else ())

    def _share_limits(self, tuner: Tuner) -> None:
        """A store's tuner in one of several DataLoader workers: settled limits shared with the
        other workers' tuners of this stage (:class:`~pipeflow.executor.autotune.Siblings`),
        named by the pipeline's statistics channel (one per pipeline object, the same in every
        worker) and this stage's label."""
        ctx = self.context
        channel = ctx.stats.channel
        if tuner.store and ctx.num_workers > 1 and channel is not None:
            tuner.share(f"{channel.path}/{self.name}", ctx.worker_id, ctx.num_workers)

    def stop(self) -> None:
        if self._window is not None:
            self._window.cancel()

    def close(self) -> None:
        super().close()
        # the pool outlives restarts (repeat() resets this stage every round); close ends it,
        # without waiting for the threads' current calls in a worker ending on Ctrl-C
        if self._window is not None:
            # (after Ctrl-C in the main process: a bounded wait, a stuck call is left behind)
            self._window.shutdown(wait=not self.context.interrupted,
                                  bound=stop_grace_seconds() if self.context.stopping else None,
                                  name=self.name)

    def __del__(self) -> None:
        window = getattr(self, "_window", None)
        if window is not None:
            window.shutdown(wait=False)

    # ---- work -----------------------------------------------------------------------------
    def next(self) -> Any:
        window = self._window
        if window is None:
            return self._next_inline()
        while True:
            task = window.next_task(self.source)
            if task is None:
                raise StopIteration
            try:
                value = window.wait(task)
            except Exception as exc:
                self._failed(exc, task.item)  # raises unless the item is skipped
                window.complete(task)
                continue
            window.complete(task)
            return value

    def _next_inline(self) -> Any:
        # no window here: one item at a time needs no futures, and no source state per item
        rewind, source, inline, fn = self._rewind, self.source, self._inline, self._fn
        self._undelivered = 0
        while True:
            if rewind.pulls >= rewind.due:
                rewind.event(source, self)
            item = next(source)
            rewind.pulls += 1
            try:
                if inline is not None:
                    done, value = inline(item)
                    if done:
                        return value
                return fn(item)
            except BaseException as exc:
                self._dropped += 1
                if not isinstance(exc, Exception):
                    raise
                self._undelivered = 1  # the state stays before this item
                self._failed(exc, item)  # raises unless the item is skipped
                self._undelivered = 0

    def _failed(self, exc: BaseException, item: Any) -> None:
        if isinstance(exc, WorkerCrashedError):
            raise exc  # never skippable: the pool is gone
        if isinstance(exc, BrokenProcessPool) and self._window is not None:
            oldest = describe_item(item)
            raise self._window.crashed(f"items were in flight, the oldest being {oldest}") from exc
        options = self.window_options
        if options.on_error == "skip" and (options.skippable is None or options.skippable(exc)):
            self.context.stats.incr(self.name, "skipped")
            log.warning("pipeflow: %s skipped %s: %s: %s", self.name, describe_item(item),
                        type(exc).__name__, exc)
            return
        exc.add_note(f"pipeflow: raised in stage {self.description} on {describe_item(item)}")
        raise exc

    def get_state(self) -> dict[str, Any]:
        window = self._window
        if window is None:
            if self._undelivered:
                return self._rewind.before(self._undelivered)
            return {SOURCES_KEY: [self._rewind.here(self.source)], "skip": []}
        snapshot, skip = window.position(self.source)
        return {SOURCES_KEY: [snapshot], "skip": skip}


class Mapper(WindowedStage):
    """Yields ``fn(item)`` for every item of ``source``.

    With ``workers > 0``, up to ``max_inflight`` items (default ``2 * workers``) are in flight
    at once: this is the backpressure that bounds memory. Process workers get
    ``max_inflight // (2 * workers)`` items per task (1 by default), each with its own result
    or error. The consumer's thread pulls from the
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
        workers: 0 runs ``fn`` inline in the consumer's thread; ``"auto"`` tunes the
            concurrency while running (docs/autotune.md), up to the cores for processes and
            four threads per core.
        method: ``"thread"`` or ``"process"``.
        in_order: deliver results in input order (default) or as they complete.
        max_inflight: bound on items submitted but not yet delivered; ``"auto"`` tunes it
            between ``workers`` and ``4 * workers``.
        on_error: ``"raise"`` or ``"skip"``.
        start_method: multiprocessing start method for process workers.
    """

    def __init__(self, source: Stage[Any], fn: Callable[[Any], Any], *, workers: int | str = 0,
                 method: Literal["thread", "process"] = "thread", in_order: bool = True,
                 max_inflight: int | str | None = None, on_error: Literal["raise", "skip"] = "raise",
                 start_method: str | None = None) -> None:
        super().__init__(source, fn, WindowedOptions(
            what="map", workers=workers, method=method, in_order=in_order, max_inflight=max_inflight,
            on_error=on_error, start_method=start_method))
