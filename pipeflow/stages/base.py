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

Measurement is not the stage's business: each stage carries a
:class:`~pipeflow._meter.StageMeter` that times its calls and computes what ``stats()`` shows.
``__next__`` keeps only the meter's countdown (``_left``), the cheapest place for it, since it
runs on every item.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from .._meter import StageMeter
from ..errors import ConfigError, StageContractError
from ..items import describe_item
from ..run_context import RunContext

__all__ = ["REPLAY_KEY", "SOURCES_KEY", "Rewind", "Stage", "describe_item"]

T = TypeVar("T")

#: pipeflow's own stage classes by class name (see :meth:`Stage.kind`)
_OWN: dict[str, type] = {}

#: the key under which every stage's state holds its sources' states (a list, one per source)
SOURCES_KEY = "sources"
#: the key under which a state counts source items to pull and drop before resuming (:class:`Rewind`)
REPLAY_KEY = "replay"
class Stage(Generic[T]):
    """Base class of all stages. See the module docstring for the contract."""

    #: True for stages that split data across ranks/workers; the builder uses it to decide
    #: on automatic sharding and on how shufflers are seeded.
    is_sharder: bool = False
    #: True for stages that turn every input item into exactly one output item; ``equalize``
    #: counts the items of a known-length source through them
    one_to_one: bool = False
    #: True for stages whose output items are input items, reordered, dropped, repeated or
    #: held back but never made anew (``shuffle``, ``filter``, ``prefetch``, ``take``...): a
    #: pipeline that batches and then runs only such stages still delivers batches
    passes_items: bool = False
    #: True for stages that pull their sources on a thread of their own (``prefetch``): their
    #: consumer-side time is waiting on the input, not work
    pulls_in_background: bool = False
    #: True for sources that give item ``i`` directly: ``len(stage)`` and ``stage.at(i)`` work
    #: once the stage is started. The builder then reads them by assignment
    #: (:mod:`pipeflow.stages.assigned`): each shard computes its own places of one global order
    #: instead of pulling every item and keeping its share.
    random_access: bool = False
    #: True for a sharder that deals places of one global order and re-deals what is left
    #: after an elastic resume itself (``AssignedSource``), instead of a ``shard_by_rank()``
    #: over a stream that elastic resume filters below it
    reads_by_place: bool = False
    #: True for a stage that groups consecutive records by sample key (``group_pairs``): the
    #: builder then shards whole samples below it (``by="key"``), unless an archive expansion
    #: lies between (``splits_objects``)
    groups_by_key: bool = False
    #: True for a stage that turns each object into the records inside it (``untar``): a
    #: grouping above it groups records of one object, so sharding below it stays by item
    splits_objects: bool = False
    #: Where elastic resume (:mod:`pipeflow.elastic`) can re-partition a single chain around
    #: this stage, by its place relative to the ``shard_by_rank()`` and the *drop point* (the
    #: first ``shuffle``/``batch`` above the shard, where items are named): ``"before_shard"``,
    #: ``"to_drop_point"`` (between the shard and the drop point), ``"drop_point"``,
    #: ``"after_drop_point"``, and ``"shard"`` for a sharder whose split elastic resume can
    #: re-deal (with the ``elastic_place`` hooks). Empty (the default): elastic resume refuses the pipeline,
    #: naming the stage. A stage that holds a position between items also implements
    #: :meth:`elastic_expansion` or :meth:`elastic_buffer` when those apply to it.
    elastic_roles: frozenset[str] = frozenset()
    #: True for stages whose resume pulls items of their input again from an earlier position
    #: and tells them apart by their count (a shuffle buffer, the rest of a batch or an object,
    #: the items an unordered map delivered ahead): their input must deliver the same items in
    #: the same order
    replays_input: bool = False
    #: False for stages whose output order depends on timing (an unordered ``map``): no stage
    #: that replays its input can resume exactly downstream of one
    ordered_output: bool = True
    #: True for a stage whose inputs run somewhere else (``offload()``: on a cluster): the
    #: builder hands it its input descriptions unbuilt, in place of source stages, and neither
    #: plans nor shards them in this process
    runs_inputs_elsewhere: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__module__.startswith("pipeflow."):
            _OWN.setdefault(cls.__name__, cls)

    @classmethod
    def kind(cls) -> str:
        """The name of this class in a graph's shape (``fingerprint``): the class name for
        pipeflow's own stages, ``module:QualName`` for any other (a user's class named
        ``Batcher`` is not pipeflow's)."""
        if _OWN.get(cls.__name__) is cls:
            return cls.__name__
        return f"{cls.__module__}:{cls.__qualname__}"

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
        #: the measurement hook (pipeflow._meter): it times this stage's calls
        self._meter = StageMeter()
        # the meter's countdown, read by __next__ on every call: 0, call plainly (the stage
        # counts its own items, no sample is due); n > 1, count the call here, n - 1 times;
        # 1, hand the call to the meter (timed, and restarting first when a reset is due)
        self._left = 1

    @property
    def closed(self) -> bool:
        """True after :meth:`close` until the stage is started again."""
        return self._closed

    @property
    def source(self) -> Stage[Any]:
        """The single input of a one-input stage."""
        return self.sources[0]

    # ---- what a description of this stage promises (read by the builder) -------------------
    @classmethod
    def keeps_steps(cls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """True when this stage, with these options, turns every input item into exactly one
        output item, in order: a batch downstream then holds the same places of the global
        order as at its input (see :mod:`pipeflow.assign`). Defaults to ``one_to_one``."""
        return cls.one_to_one

    @classmethod
    def mixing(cls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """For a stage that only reorders items at random (``shuffle``): the ``buffer_size`` and
        ``seed`` an assigned source folds in when this stage sits right after it; else None."""
        return None

    @classmethod
    def splits_by_place(cls, kwargs: dict[str, Any], grouped: bool) -> bool:
        """True for a sharding stage whose split, with these options, an assigned source can
        take over: by item, across ranks and workers. ``grouped``: a ``group_pairs()`` of
        whole objects lies downstream."""
        return False

    @classmethod
    def step_size(cls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
        """The number of input items one output item groups (``batch(n)``: ``n``), or None."""
        return None

    @classmethod
    def declared_length(cls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
        """Items per rank and epoch a stage described with these options promises whatever
        its input (``with_epoch(n)``: ``n``); ``len(pipeline)`` reads it. None: not known."""
        return None

    @classmethod
    def built_options(cls, kwargs: dict[str, Any], *, grouped: bool) -> dict[str, Any]:
        """The options to build this stage with, given whether a grouping by sample key of
        whole objects lies downstream (``shard_by_rank(by="auto")`` resolves here)."""
        return kwargs

    @classmethod
    def elastic_expansion(cls, state: dict[str, Any], after: bool) -> tuple[int, Any, bool] | None:
        """For a stage that turns one input into several items (``untar``, ``unbatch``), how
        one of its states splits its position for elastic resume: ``(offset, source state,
        following)``: how many items of the current input were delivered, the state of the
        source that names that input, and whether that input is the one the next item comes
        from (else, with ``after``, the one just finished). None for other stages."""
        return None

    # a sharding stage (``is_sharder``) that takes part in elastic resume reads its own state
    # with the four hooks below; ``shard_by_rank()`` (stages/shard.py) and the assigned source
    # (stages/assigned.py) implement them. ``where`` is ``(rank, world, worker, workers)`` of
    # the shard that saved the state.
    @classmethod
    def elastic_place(cls, state: dict[str, Any], where: tuple[int, int, int, int], *,
                      following: bool) -> int:
        """The unit of the stream before the split that a state names: the next one this
        shard would deliver (``following``), else the last one it delivered."""
        raise ConfigError(f"elastic resume cannot re-partition {cls.__name__}")

    @classmethod
    def elastic_done(cls, state: dict[str, Any], where: tuple[int, int, int, int],
                     before: int | None) -> Any:
        """An entry of the merged state's ``done``: the units shard ``where`` delivered, all of
        its units before ``before`` (None: every one)."""
        raise ConfigError(f"elastic resume cannot re-partition {cls.__name__}")

    @classmethod
    def elastic_untouched(cls, state: dict[str, Any], where: tuple[int, int, int, int]) -> Any:
        """The ``done`` entry of a shard that never started (``state``: another shard's), or None."""
        raise ConfigError(f"elastic resume cannot re-partition {cls.__name__}")

    @classmethod
    def elastic_window(cls, state: dict[str, Any], where: tuple[int, int, int, int],
                       first: int) -> dict[str, Any]:
        """Which units an old shard reads from unit ``first`` on, for the merged state."""
        raise ConfigError(f"elastic resume cannot re-partition {cls.__name__}")

    def elastic_supported(self) -> bool:
        """False when these options keep elastic resume from naming this stage's items (an
        unordered map); the class's ``elastic_roles`` say where it may stand."""
        return True

    @classmethod
    def elastic_shares(cls, state: dict[str, Any]) -> list[Any] | None:
        """For a stage whose inputs run elsewhere (``offload()``): from one of its states, the
        iterator state of every share it reads, in worker order (None for a share that has
        delivered nothing yet). Elastic resume merges them as it merges the states of a rank's
        DataLoader workers. None for other stages."""
        return None

    @classmethod
    def elastic_buffer(cls, state: dict[str, Any]) -> dict[str, Any] | None:
        """For a stage that holds items back and hands them out later (``shuffle``): from one of
        its states, ``{"pulled": n, "buffered": [i, ...]}``, the items it pulled since its
        oldest held one and which of those (counted from it) it still held. Elastic resume
        reads it; None for a stage that holds nothing."""
        return None

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

    def delivered(self) -> int | None:
        """Items ``next()`` returned so far, over every run of this stage object, when the stage
        counts them itself; None (the default) has the meter count every call.

        A stage counts itself where its own bookkeeping does it in bulk or for free (a
        position it keeps anyway, a counter per batch), so its calls skip the per-call
        counting, the largest cost of recording on a chain of cheap stages. Such a stage also
        tells the meter where a sample may begin: it calls :meth:`_sample_soon` at an item
        boundary as often as the value it returns says (about every
        :data:`~pipeflow._meter.SAMPLE_EVERY` items).
        """
        return None

    # ---- lifecycle, owned by the base class ----------------------------------------------
    def reset(self, state: dict[str, Any] | None = None) -> None:
        """Restart from the beginning (falsy ``state``) or from ``state``: stop the current
        run, reset the sources to their part of ``state``, then :meth:`start`."""
        self._meter.setup(self._reset, state)

    def _reset(self, state: dict[str, Any] | None) -> None:
        self.stop()
        states = state.get(SOURCES_KEY) if state else None
        for i, src in enumerate(self.sources):
            src.reset(states[i] if states else None)
        self._needs_reset = False
        self._closed = False
        self._resume_state = None
        if not state:
            self.start(None)
        else:
            self._resume_from(state)
        self._meter.started(self)

    def _resume_from(self, state: dict[str, Any]) -> None:
        try:
            self.start(state)
        except BaseException as exc:
            # a start from a state that failed half-way leaves the stage half-rebuilt: keep the
            # state it was asked to resume, so a retry (or a checkpoint taken now) starts from
            # it again instead of from the half-built position
            self._resume_state = dict(state)
            self._needs_reset = True
            if isinstance(exc, StopIteration):
                raise ConfigError(
                    f"{self.name}: its source ended while it rebuilt the position of a saved state "
                    "(the items that state needs are no longer there): the data changed since the "
                    "state was saved; resume with the data it was saved on, or start the epoch "
                    "anew") from None
            raise

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
        meter = getattr(self, "_meter", None)  # None: __init__ skipped (__next__ says so)
        if meter is not None:
            meter.reset_due(self)
        self.stop()
        for src in self.sources:
            src.close()

    def __iter__(self) -> Stage[T]:
        return self

    def __next__(self) -> T:
        try:
            left = self._left
        except AttributeError:
            raise StageContractError(
                f"{type(self).__name__}.__init__ did not call super().__init__(*sources)") from None
        if not left:  # the stage counts its own items and none of its calls is timed now
            return self.next()
        if left > 1:  # counted here, not timed
            self._left = left - 1
            try:
                return self.next()
            except BaseException:
                self._meter.lost += 1  # not an item
                raise
        return self._meter.call(self)

    def _sample_soon(self) -> int:
        """Have the meter time this stage's next call (for a stage that
        counts its own items); returns in how many items to call again."""
        return self._meter.sample_soon(self)

    def _restart_lazily(self) -> None:
        state, self._resume_state = self._resume_state, None
        self.reset(state)
        if self._needs_reset:
            raise StageContractError(
                f"{type(self).__name__}.reset() did not call super().reset(state), so the stage "
                "would restart on every item and never end; implement start(state) and stop() "
                "instead of reset(), or call super().reset(state) first")

    def measure(self) -> dict[str, float]:
        """This stage's numbers for ``stats()`` (:meth:`~pipeflow._meter.StageMeter.measure`:
        items, busy, wait and blocked seconds, lanes); a stage may add its own."""
        return self._meter.measure(self)

    def measure_elsewhere(self) -> dict[str, dict[str, float]]:
        """The numbers of the stages this stage runs in other processes, by label, for
        ``stats()`` (``offload()``: its input stages on the cluster); none for a stage whose
        inputs run here (they measure themselves)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The current position; cheap before the first item, and kept after ``close()``."""
        if self._needs_reset:
            return dict(self._resume_state or {})
        return self.get_state()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Resume from ``state`` when the next item is requested."""
        self._resume_state = dict(state) if state else None
        self._needs_reset = True
        self._meter.reset_due(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class Rewind:
    """The position of a one-input stage before items it pulled but had not delivered when an
    error ended ``next()`` (a half-built batch, the item a function failed on), without saving
    the source's state for every item.

    The source's state is taken at an item boundary (:meth:`boundary`, :meth:`event`) once
    ``EVERY`` items were pulled since the last time, and whenever the stage reports its
    position anyway; the stage counts the items it pulls in ``pulls``. After an error the state
    is that anchor plus how many of the items pulled since were delivered, under
    :data:`REPLAY_KEY`; resuming pulls and drops them again (:meth:`replay`), which costs at
    most about ``EVERY`` upstream items, once.

    The count of pulls also serves the statistics: a stage derives the items it delivered from
    it, and with ``samples=True`` the pulls pace the stage's timing samples (:meth:`event`).
    """

    #: pulls between two saved source states
    EVERY = 1024

    __slots__ = ("anchor", "anchored", "due", "pulls", "sample_at")

    def __init__(self, *, samples: bool = False) -> None:
        """``samples``: the pulls also pace the owner's timing samples (for a stage that
        pulls about once per call)."""
        self.anchor: dict[str, Any] = {}
        #: items pulled from the source, over every run (not counting :meth:`replay`)
        self.pulls = 0
        self.anchored = 0  # ``pulls`` when the anchor was taken
        #: the pull count at which the stage calls :meth:`event`: one comparison per pull
        #: serves both the anchor and the timing samples (it may come early, never late)
        self.due = 0
        #: the pull count at which the owner's next timing sample is due
        self.sample_at = 0 if samples else 1 << 62

    @staticmethod
    def replay(source: Stage[Any], state: dict[str, Any] | None) -> None:
        """Pull and drop the items a state says were delivered after its source position."""
        for _ in range(int(state.get(REPLAY_KEY, 0)) if state else 0):
            next(source)

    def restart(self, source: Stage[Any]) -> None:
        # as cheap as it can be: batch and unbatch take their source's state once per batch,
        # which restarts every Rewind upstream
        self.anchor = source.state_dict()
        self.anchored = self.pulls

    def event(self, source: Stage[Any], owner: Stage[Any]) -> None:
        """``pulls`` reached ``due``, at an item boundary: ask for a timing sample of the owner
        if one is due, take a new anchor if the last one is old."""
        pulls = self.pulls
        if pulls >= self.sample_at:
            self.sample_at = pulls + owner._sample_soon()
        if pulls - self.anchored >= self.EVERY:
            self.restart(source)
        self.due = min(self.anchored + self.EVERY, self.sample_at)

    def boundary(self, source: Stage[Any]) -> None:
        """Nothing pulled is undelivered now: take a new anchor if the last one is old."""
        if self.pulls - self.anchored >= self.EVERY:
            self.restart(source)

    def here(self, source: Stage[Any]) -> dict[str, Any]:
        """The source's state now, which also becomes the anchor (it is paid for anyway)."""
        self.restart(source)
        return self.anchor

    def before(self, undelivered: int) -> dict[str, Any]:
        """The state before the last ``undelivered`` items pulled."""
        return {SOURCES_KEY: [self.anchor], REPLAY_KEY: self.pulls - self.anchored - undelivered}
