"""Reading a random-access source by assignment: each shard takes its own places of one global order.

A source that can give its item ``i`` directly (``from_items`` over a sequence, ``list_objects``:
any stage with ``random_access = True``, ``len()`` and ``at(i)``) does not need to be pulled
item by item by every rank and DataLoader worker, each keeping one item in ``ranks x workers``
(a shard after a shuffle has to do that today to stay exact). The builder reads such a source,
with the ``shuffle`` right after it and the ``shard_by_rank()`` (or automatic sharding) after
those, through one :class:`AssignedSource`: the epoch's order is a pure function of the seed and
the epoch (:class:`pipeflow.assign.Order`), the places each shard reads a pure function of its
rank and worker (:class:`pipeflow.assign.Split`), and a shard computes only its own.

The first run of an epoch reads the global order; a restart within the epoch (``repeat()``,
the wrap-around of ``equalize``/``with_epoch``) reads the same shard's places again in a new
random order, so every shard keeps its own items, as with a shuffle after the shard.

State: the round and how many items this shard delivered, whatever the buffer size: a few
bytes.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, cast

from .._checks import check_int
from .._rng import derive_seed
from ..assign import Order, Split, permute
from ..errors import ConfigError
from .base import SOURCES_KEY, Stage
from .shard import warn_if_some_shards_idle

__all__ = ["AssignedSource", "Remaining", "ShuffledSource", "places_from", "rest_of"]


class RandomAccess(Protocol):
    """What an assigned source reads: a stage with ``random_access = True``."""

    def __len__(self) -> int: ...

    def at(self, i: int) -> Any: ...


class Remaining:
    """The places of an epoch's order not delivered before an elastic resume, renumbered from 0.

    Every place before ``start`` was delivered, and so were the places in ``done`` (sorted,
    all ``>= start``): the few that ranks saved at a later step than the slowest one delivered.
    """

    def __init__(self, n: int, start: int, done: Sequence[int]) -> None:
        self.start = start
        self.done = sorted(done)
        self.n = n - start - len(self.done)
        # place q of the rest is start + q + (the done places at or before it)
        self._shifted = [p - start - i for i, p in enumerate(self.done)]

    def __len__(self) -> int:
        return max(0, self.n)

    def __getitem__(self, q: int) -> int:
        return self.start + q + bisect_right(self._shifted, q)

    def index_of(self, p: int) -> int | None:
        """The renumbered place of place ``p``, or None when it was delivered."""
        if p < self.start:
            return None
        i = bisect_left(self.done, p)
        if i < len(self.done) and self.done[i] == p:
            return None
        return p - self.start - i


class AssignedSource(Stage[Any]):
    """This shard's items of a random-access source, in the epoch's global order.

    Args:
        source: a stage with ``random_access = True`` (``len()``, ``at(i)``).
        buffer_size: items mixed together (the ``shuffle`` folded in); 1 keeps the source order.
        seed: the shuffle's seed, combined with the epoch and the round.
        unit: positions a rank takes from each global step (the per-rank batch size the
            builder found downstream); 0 when there is none: item by item, as
            ``shard_by_rank()`` splits (:class:`~pipeflow.assign.Split`).
        split: deal the places over ranks x DataLoader workers (False: one shard reads all).
        rest: in an elastic resume, ``(epoch, start, done)``: in that epoch only the places
            :class:`Remaining` names are dealt.
    """

    is_sharder = True
    #: the unit elastic resume names is a place of the global order (see :meth:`elastic_place`)
    reads_by_place = True
    #: its split is a rule over places of the global order, which elastic resume re-deals
    elastic_roles = frozenset({"shard"})
    #: it splits by item, never by sample key
    by = "item"

    def __init__(self, source: Stage[Any], *, buffer_size: int = 1, seed: int = 0, unit: int = 0,
                 split: bool = True, rest: tuple[int, int, Sequence[int]] | None = None) -> None:
        super().__init__(source)
        check_int(buffer_size, "shuffle(buffer_size=...)", low=1)
        check_int(seed, "shuffle(seed=...)")
        check_int(unit, "unit", low=0)
        self.buffer_size = buffer_size
        self.seed = seed
        self.unit = unit
        self._unit = unit  # the unit of this run: a resumed run keeps the one it was saved with
        self.split_shards = split
        self.rest = rest
        self._round = -1  # incremented by every fresh start (repeat() and equalize reshuffle)
        self._k = 0
        self._count = 0

    # ---- where this shard reads -------------------------------------------------------------
    def split(self) -> Split:
        """How this run deals places over ranks x workers."""
        ctx = self.context
        if not self.split_shards:
            return Split(1, 1, self._unit)
        return Split(ctx.world_size, max(1, ctx.num_workers), self._unit)

    @property
    def where(self) -> tuple[int, int]:
        """``(rank, worker)`` of this process in :meth:`split`."""
        ctx = self.context
        return (ctx.rank, ctx.worker_id) if self.split_shards else (0, 0)

    @property
    def shard(self) -> tuple[int, int]:
        """``(index, count)`` of this process's shard (as :class:`~pipeflow.stages.shard.Sharder`)."""
        split = self.split()
        rank, worker = self.where
        return rank * split.workers + worker, split.shards

    def order(self) -> Order:
        """The global order of this epoch (a function of seed and epoch only)."""
        stream = derive_seed("assign", self.seed, self.context.epoch)
        return Order(len(self._items), self.buffer_size, stream)

    @property
    def _items(self) -> RandomAccess:
        return cast(RandomAccess, self.source)

    def at_place(self, p: int) -> Any:
        """The item at place ``p`` of this epoch's global order (elastic resume names items so)."""
        return self._items.at(self.order()[p])

    def places(self) -> Remaining | None:
        """The places left in an elastic resume's epoch (renumbered), or None for all of them."""
        if self.rest is None or int(self.rest[0]) != self.context.epoch:
            return None
        _, start, done = self.rest
        return Remaining(len(self._items), int(start), done)

    # ---- contract ---------------------------------------------------------------------------
    def start(self, state: dict[str, Any] | None) -> None:
        if state and int(state.get("items", len(self._items))) != len(self._items):
            raise ConfigError(
                f"{self.name}: this state was saved over {state['items']} items and the source now "
                f"has {len(self._items)}: the data changed since the state was saved (the order "
                "and the shares are functions of the item count); resume with the data it was "
                "saved on, or start the epoch anew")
        self._round = int(state["round"]) if state else self._round + 1
        self._k = int(state["index"]) if state else 0
        # batch(n) may change between save and load: the rest of the epoch keeps the split the
        # state was saved with (its places are what the count means), the next epochs use n
        self._unit = int(state.get("unit", self.unit)) if state else self.unit
        self._order = self.order()
        self._places = self.places()
        self._split = self.split()
        self._rank, self._worker = self.where
        total = len(self._places) if self._places is not None else self._order.n
        self._count = self._split.count(self._rank, self._worker, total)
        if state is None and self.context.rank == 0 and self.split_shards:
            ctx = self.context
            warn_if_some_shards_idle(self.name, total, self._split.shards, ctx.world_size,
                                     max(1, ctx.num_workers))
        # a restart within the epoch (repeat, equalize's wrap-around) reshuffles this shard's
        # own places: every shard keeps its items, as with a shuffle after the shard
        self._again = derive_seed("again", self.seed, self.context.epoch, self._round, *self.where) \
            if self._round > 0 and self.buffer_size > 1 else None

    def next(self) -> Any:
        k = self._k
        if k >= self._count:
            raise StopIteration
        if self._again is not None:
            k = permute(k, self._count, self._again)
        p = self._split.position(self._rank, self._worker, k)
        if self._places is not None:
            p = self._places[p]
        self._k += 1
        return self._items.at(self._order[p])

    def get_state(self) -> dict[str, Any]:
        state = {"round": self._round, "index": self._k, "unit": self._unit,
                 "items": len(self._items)}
        if self._places is not None:
            state["resumed_epoch"] = self.context.epoch
        return {**state, SOURCES_KEY: [self.source.state_dict()]}

    # ---- elastic resume: this stage reads its own state ---------------------------------------
    @property
    def splits_all(self) -> bool:
        """True when the places are dealt over ranks and workers."""
        return self.split_shards

    def owns(self, q: int) -> bool:
        """True when this shard reads (renumbered) place ``q``."""
        return self._split.owner(q) == (self._rank, self._worker)

    @classmethod
    def elastic_place(cls, state: dict[str, Any], where: tuple[int, int, int, int], *,
                      following: bool) -> int:
        """The place of the global order a state saved by shard ``where`` = ``(rank, world,
        worker, workers)`` names: the next one it reads (``following``), else the last it read."""
        rank, world, worker, workers = where
        split = Split(world, max(1, workers), int(state.get("unit", 0)))
        k = int(state["index"])
        return split.position(rank, worker, k if following else k - 1)

    @classmethod
    def elastic_done(cls, state: dict[str, Any], where: tuple[int, int, int, int],
                     before: int | None) -> dict[str, Any]:
        """The places shard ``where`` delivered: all of its places before place ``before``
        (None: every one), resolved when resuming, where the item count is known (:func:`rest_of`).
        ``state`` is any state of this stage in the job (for the unit)."""
        return {"places": [*where, int(state.get("unit", 0))], "before": before}

    @classmethod
    def elastic_untouched(cls, state: dict[str, Any], where: tuple[int, int, int, int]) -> Any:
        """The entry of a shard that never started (``state``: another shard's, for the unit):
        nothing delivered, and its first place bounds where the rest starts."""
        rank, world, worker, workers = where
        first = Split(world, max(1, workers), int(state.get("unit", 0))).position(rank, worker, 0)
        return cls.elastic_done(state, where, first)

    @classmethod
    def elastic_window(cls, state: dict[str, Any], where: tuple[int, int, int, int],
                       first: int) -> dict[str, Any]:
        """Which places an old shard reads from ``first`` on (see :func:`places_from`)."""
        return {"start": first, "places": [*where, int(state.get("unit", 0))]}

    def known_length(self) -> int | None:
        return len(self._items)


def rest_of(n: int, done: Sequence[Any]) -> tuple[int, list[int]]:
    """``(start, done places >= start)`` of what a merged elastic state says was delivered: the
    ``elastic_done`` entry of every old shard and the single places of partly read windows."""
    shards = [d for d in done if isinstance(d, dict)]
    befores = [n if d["before"] is None else int(d["before"]) for d in shards]
    start = min(befores, default=0)
    extra: set[int] = set()
    for d, before in zip(shards, befores):
        rank, world, worker, workers, unit = (int(x) for x in d["places"])
        split = Split(world, max(1, workers), unit)
        first, last = split.ordinal(rank, worker, start), split.ordinal(rank, worker, min(before, n))
        extra.update(split.position(rank, worker, k) for k in range(first, last))
    for d in done:
        if not isinstance(d, dict):
            first, step = int(d[0]), int(d[2])
            stop = n if d[1] is None else min(int(d[1]), n)
            if first < start:  # the first of the range's places at or after start
                first += -(-(start - first) // step) * step
            extra.update(range(first, stop, step))
    return start, sorted(g for g in extra if g >= start)


def places_from(window: dict[str, Any], n: int) -> Iterator[int]:
    """The places an old shard reads from ``window["start"]`` on, in order (below ``n``)."""
    rank, world, worker, workers, unit = (int(x) for x in window["places"])
    split = Split(world, max(1, workers), unit)
    k = split.ordinal(rank, worker, int(window["start"]))
    while True:
        p = split.position(rank, worker, k)
        if p >= n:
            return
        yield p
        k += 1


class ShuffledSource(AssignedSource):
    """An :class:`AssignedSource` that folds a ``shuffle`` in: the same stage, under its own
    name, so a graph's shape (what a saved state is checked against) still says whether the
    pipeline shuffles."""

