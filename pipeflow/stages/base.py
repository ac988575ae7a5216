"""The stage contract every pipeflow stage implements, and the lifecycle the base class owns.

A stage is a small iterator class. A subclass implements hooks:

* ``next()``: return the next item or raise ``StopIteration``.
* ``start(state)``: begin a run, from the beginning when ``state`` is None, else from a state
  previously returned by ``get_state``. The sources have already been reset (to the states
  under :data:`SOURCES_KEY`). Expensive setup (threads, connections) lives here, not in
  ``__init__``.
* ``stop()``: end the current run: release what ``start`` and ``next`` acquired. Called before
  every restart and by ``close``; must be idempotent.
* ``get_state()``: a small, symbolic description of the position (indices, seeds, cursors),
  from which ``start`` resumes exactly after the last item returned by ``next``. The sources'
  states go under :data:`SOURCES_KEY`, one per source (the default does just that).

The base class owns the rest, and subclasses do not override it: ``__iter__``/``__next__``,
``reset`` (stop, reset the sources, start), ``close``, lazy reset (nothing starts until the
first item is requested, so ``load_state_dict`` right after construction is cheap) and
``state_dict``, which keeps answering with the position of the last item delivered after an
error or ``close()``. A subclass that overrides ``reset`` anyway must call
``super().reset(state)``; one that does not is refused with
:class:`~pipeflow.errors.StageContractError` at its first item instead of restarting forever.
"""

from __future__ import annotations

from random import getrandbits
from time import perf_counter
from typing import Any, Generic, TypeVar

from ..errors import StageContractError
from ..items import describe_item
from ..run_context import RunContext

__all__ = ["REPLAY_KEY", "SOURCES_KEY", "Rewind", "Stage", "describe_item"]

T = TypeVar("T")

#: the key under which every stage's state holds its sources' states (a list, one per source)
SOURCES_KEY = "sources"
#: the key under which a state counts source items to pull and drop before resuming (:class:`Rewind`)
REPLAY_KEY = "replay"
#: two calls in about this many (a power of two) are timed, in a row, the second one
#: also measuring the gap since the first returned (the time the output waited on the consumer)
SAMPLE_EVERY = 256
#: the first calls of a stage are all timed: a short run gets exact figures, and one call
#: slowed by the machine (another process got the core) is not multiplied by the sampling ratio
TIME_ALL_FIRST = 64
_JITTER_BITS = SAMPLE_EVERY.bit_length() - 1  # intervals of SAMPLE_EVERY / 2 .. 3/2


class Meter:
    """A stage's measurements: calls counted always, two in :data:`SAMPLE_EVERY` timed."""

    __slots__ = ("gap_s", "gaps", "issued", "lost", "once_s", "returned", "second",
                 "slow_calls", "timed", "timed_s")

    def __init__(self) -> None:
        self.second = False
        self.slow_calls = self.issued = self.lost = self.timed = self.gaps = 0
        self.timed_s = self.gap_s = self.returned = 0.0
        self.once_s = 0.0  # setup and end-of-run calls, counted unscaled

    def items(self, left: int) -> int:
        """Items delivered, given the cheap calls ``left`` before the next timed one."""
        return self.slow_calls + self.issued - max(0, left - 1) - self.lost


class Stage(Generic[T]):
    """Base class of all stages. See the module docstring for the contract."""

    #: True for stages that split data across ranks/workers; the builder uses it to decide
    #: on automatic sharding and on how shufflers are seeded.
    is_sharder: bool = False
    #: True for stages that turn every input item into exactly one output item; ``equalize``
    #: counts the items of a known-length source through them
    one_to_one: bool = False
    #: True for stages that pull their sources on a thread of their own (``prefetch``): their
    #: consumer-side time is waiting on the input, not work
    pulls_in_background: bool = False

    def __init__(self, *sources: Stage[Any]) -> None:
        self.sources: tuple[Stage[Any], ...] = sources
        self.context: RunContext = RunContext()
        #: the short label (``map#2``) keying stats() and naming the stage in errors; set by
        #: the builder
        self.name: str = type(self).__name__
        #: the stage's line in explain(), with its options; set by the builder
        self.description: str = type(self).__name__
        #: set by the builder: True when a sharding stage lies upstream of this one
        self.sharded_upstream: bool = False
        self._needs_reset = True
        self._resume_state: dict[str, Any] | None = None
        self._closed = False
        # one attribute, not eleven: many instance attributes make every attribute load of
        # a stage slower (the instance dict stops sharing its keys)
        self._meter = Meter()
        self._left = 0  # cheap calls before the next timed one; 0 also when a reset is due

    @property
    def closed(self) -> bool:
        """True after :meth:`close` until the stage is started again."""
        return self._closed

    @property
    def source(self) -> Stage[Any]:
        """The single input of a one-input stage."""
        return self.sources[0]

    # ---- hooks, implemented by subclasses -----------------------------------------------
    def start(self, state: dict[str, Any] | None) -> None:
        """Begin a run from the beginning (None) or from ``state``; the sources are reset."""

    def stop(self) -> None:
        """End the current run and release its resources. Idempotent."""

    def next(self) -> T:
        """Return the next item; raise ``StopIteration`` at the end."""
        raise NotImplementedError

    def get_state(self) -> dict[str, Any]:
        """Return the position after the last item returned by ``next``."""
        return {SOURCES_KEY: [src.state_dict() for src in self.sources]} if self.sources else {}

    def known_length(self) -> int | None:
        """The number of items this stage yields in an epoch when known without reading data."""
        return None

    # ---- lifecycle, owned by the base class ----------------------------------------------
    def reset(self, state: dict[str, Any] | None = None) -> None:
        """Restart from the beginning (falsy ``state``) or from ``state``: stop the current
        run, reset the sources to their part of ``state``, then :meth:`start`."""
        t0 = perf_counter()
        try:
            self._reset(state)
        finally:
            self._meter.once_s += perf_counter() - t0

    def _reset(self, state: dict[str, Any] | None) -> None:
        self.stop()
        states = state.get(SOURCES_KEY) if state else None
        for i, src in enumerate(self.sources):
            src.reset(states[i] if states else None)
        self._needs_reset = False
        self._closed = False
        self._resume_state = None
        self.start(state or None)

    def close(self) -> None:
        """Release resources held by this stage and its sources. Idempotent.

        The position reached is kept: ``state_dict()`` still returns it, and iterating again
        resumes from it.
        """
        if not getattr(self, "_needs_reset", True):
            # after an error too: the stages' own bookkeeping is only updated for items they
            # delivered, so this is the position of the last item delivered
            self._resume_state = self.get_state()
        self._closed = True
        self._needs_reset = True
        self._reset_due()
        self.stop()
        for src in self.sources:
            src.close()

    def __iter__(self) -> Stage[T]:
        return self

    def __next__(self) -> T:
        try:
            left = self._left - 1
        except AttributeError:
            raise StageContractError(
                f"{type(self).__name__}.__init__ did not call super().__init__(*sources)") from None
        if left > 0:  # the cheap path: counted, not timed (_left is 0 while a reset is due)
            self._left = left
            try:
                return self.next()
            except BaseException:
                self._meter.lost += 1  # not an item
                raise
        return self._timed_next(self._meter)

    def _timed_next(self, meter: Meter) -> T:
        t0 = perf_counter()
        second = meter.second
        if second and meter.returned:
            meter.gap_s += t0 - meter.returned
            meter.gaps += 1
        meter.returned = 0.0
        meter.slow_calls += 1
        # the next call is timed too (measuring the gap), then SAMPLE_EVERY - 2 are not
        meter.second = not second
        # a jittered interval, so a stage with a period of its own (a batch every 8 calls)
        # is not always sampled in the same phase
        if not second or meter.slow_calls < TIME_ALL_FIRST:
            left = 1
        else:
            left = SAMPLE_EVERY // 2 + getrandbits(_JITTER_BITS)
        meter.issued += left - 1
        self._left = left
        try:
            if self._needs_reset:
                self._restart_lazily()
            value = self.next()
        except BaseException:
            meter.lost += 1
            meter.once_s += perf_counter() - t0
            raise
        t1 = perf_counter()
        meter.timed_s += t1 - t0
        meter.timed += 1
        if not second:
            meter.returned = t1
        return value

    def _reset_due(self) -> None:
        # route the next call through the slow path, which resets; unused cheap calls are
        # taken back so they are not counted as items
        left = getattr(self, "_left", 0)
        if left > 1:
            self._meter.issued -= left - 1
        self._left = 0

    @property
    def items_out(self) -> int:
        """Items delivered by ``next()`` so far (over every run of this stage object)."""
        return self._meter.items(self._left)

    def _restart_lazily(self) -> None:
        state, self._resume_state = self._resume_state, None
        t0 = perf_counter()
        self.reset(state)
        if self._needs_reset:
            raise StageContractError(
                f"{type(self).__name__}.reset() did not call super().reset(state), so the stage "
                "would restart on every item and never end; implement start(state) and stop() "
                "instead of reset(), or call super().reset(state) first")
        # reset() counted itself as unscaled time; keep it out of the sampled call
        self._meter.timed_s -= perf_counter() - t0

    # ---- measurement ----------------------------------------------------------------------
    def inclusive_s(self) -> float:
        """Estimated seconds spent in this stage's ``next()`` and setup, its sources' included
        (when they run on the same thread)."""
        meter = self._meter
        sampled = meter.timed_s * meter.items(self._left) / meter.timed if meter.timed else 0.0
        return max(0.0, sampled) + meter.once_s

    def measure(self) -> dict[str, float]:
        """This stage's numbers: ``items`` delivered, ``busy_s`` in its own work, ``wait_s``
        waiting on its input, ``blocked_s`` its output waited on the consumer, ``lanes`` (how
        many threads do its work)."""
        inclusive = self.inclusive_s()
        if self.pulls_in_background:
            busy, wait = 0.0, inclusive
        else:
            wait = sum(src.inclusive_s() for src in self.sources)
            busy = max(0.0, inclusive - wait)
        meter = self._meter
        items = meter.items(self._left)
        blocked = meter.gap_s * items / meter.gaps if meter.gaps else 0.0
        return {"items": items, "busy_s": busy, "wait_s": wait, "blocked_s": blocked, "lanes": 1}

    def state_dict(self) -> dict[str, Any]:
        """The current position; cheap before the first item, and kept after ``close()``."""
        if self._needs_reset:
            return dict(self._resume_state or {})
        return self.get_state()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Resume from ``state`` when the next item is requested."""
        self._resume_state = dict(state) if state else None
        self._needs_reset = True
        self._reset_due()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class Rewind:
    """The position of a one-input stage before items it pulled but had not delivered when an
    error ended ``next()`` (a half-built batch, the item a function failed on), without saving
    the source's state for every item.

    The source's state is taken at an item boundary (:meth:`boundary`) once ``EVERY`` items
    were pulled since the last time, and whenever the stage reports its position anyway; the
    stage counts the items it pulls since in ``since``. After an error the state is that
    anchor plus how many of those items were delivered, under :data:`REPLAY_KEY`; resuming
    pulls and drops them again (:meth:`replay`), which costs at most about ``EVERY`` upstream
    items, once.
    """

    #: pulls between two saved source states
    EVERY = 1024

    __slots__ = ("anchor", "since")

    def __init__(self) -> None:
        self.anchor: dict[str, Any] = {}
        self.since = 0

    @staticmethod
    def replay(source: Stage[Any], state: dict[str, Any] | None) -> None:
        """Pull and drop the items a state says were delivered after its source position."""
        for _ in range(int(state.get(REPLAY_KEY, 0)) if state else 0):
            next(source)

    def restart(self, source: Stage[Any]) -> None:
        self.anchor = source.state_dict()
        self.since = 0

    def boundary(self, source: Stage[Any]) -> None:
        """Nothing pulled is undelivered now: take a new anchor if the last one is old."""
        if self.since >= self.EVERY:
            self.restart(source)

    def here(self, source: Stage[Any]) -> dict[str, Any]:
        """The source's state now, which also becomes the anchor (it is paid for anyway)."""
        self.restart(source)
        return self.anchor

    def before(self, undelivered: int) -> dict[str, Any]:
        """The state before the last ``undelivered`` items pulled."""
        return {SOURCES_KEY: [self.anchor], REPLAY_KEY: self.since - undelivered}
