"""The two stages ``Pipeline.resume_from`` adds, and the reading of a state they share.

Elastic resume names every item of the stream before ``shard_by_rank()`` by its index there
(the *source index*; the order before the shard depends only on seed and epoch), and every item
that reaches the point just before the first post-shard buffer (the *drop point*: the input of
the first ``shuffle``/``batch`` after the shard, else the end) by ``(source index, ordinal)``:
the ordinal counts the items that object yielded at that point. :class:`ElasticRemaining` passes
only the source indices not yet completed; :class:`ElasticDropper` drops the items of partly
delivered objects that were delivered before. Both act only in the resumed epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from ..errors import ConfigError
from .assigned import AssignedSource
from .base import REPLAY_KEY, SOURCES_KEY, Stage
from .shard import _sample_key, owned_after, owned_before

__all__ = ["ElasticDropper", "ElasticRemaining", "in_ranges", "locate", "owned_after", "owned_before"]


def in_ranges(g: int, ranges: Sequence[Sequence[Any]]) -> bool:
    """True when ``g`` lies in one of the ``[start, stop (None: no end), step]`` ranges."""
    for start, stop, step in ranges:
        if g >= start and (stop is None or g < stop) and (g - start) % step == 0:
            return True
    return False


def locate(chain: Sequence[type[Stage[Any]]], state: dict[str, Any], where: tuple[int, int, int, int], *,
           after: bool) -> tuple[int, int]:
    """``(source index, record offset)`` a state of ``chain[0]`` points at.

    ``chain`` is the stage classes from the one whose state this is down to the sharder. With
    ``after`` the state was taken after an item and names that item's object; else it was
    taken before one and names the object the next item comes from. The record offset is the
    expanding stage's count (members of a tar, entries of an unbatched list) in that object.
    ``where`` is ``(rank, world, worker, workers)`` of the shard that saved the state; the
    sharder's class reads its own state (``elastic_place``).
    """
    following = not after
    offset = 0
    expanded = False
    st = state
    for cls in chain:
        if not isinstance(st, dict) or REPLAY_KEY in st:
            raise ConfigError("elastic resume cannot read a state saved after an error ended an "
                              f"item mid-way (at {cls.__name__}); resume it on the same topology")
        if cls.is_sharder:
            return cls.elastic_place(st, where, following=following), offset
        split = None if expanded else cls.elastic_expansion(st, after)
        if split is not None:  # the first expanding stage names the item within its input
            expanded = True
            offset, st, following = split
            continue
        st = st[SOURCES_KEY][0]
    raise ConfigError("elastic resume found no shard_by_rank() below the drop point")


def _chain_to_sharder(stage: Stage[Any]) -> list[Stage[Any]]:
    chain = [stage]
    while not chain[-1].is_sharder:
        if len(chain[-1].sources) != 1:
            raise ConfigError(f"elastic resume needs one input per stage, {chain[-1].name} has "
                              f"{len(chain[-1].sources)}")
        chain.append(chain[-1].sources[0])
    return chain


class ElasticRemaining(Stage[Any]):
    """Passes the source units not completed before an elastic resume (in its epoch only).

    A unit is an item, or with ``by="key"`` the consecutive items of one sample key, as the
    ``shard_by_rank()`` after this stage counts them.

    Args:
        source: the stream before ``shard_by_rank()``.
        done: completed unit indices as ``[start, stop, step]`` ranges.
        epoch: the epoch being resumed.
        by: ``"item"`` or ``"key"``, as the sharder.
    """

    def __init__(self, source: Stage[Any], done: Sequence[Sequence[Any]], *, epoch: int,
                 by: str = "item") -> None:
        super().__init__(source)
        self.done = [tuple(r) for r in done]
        self.epoch = epoch
        self.by = by
        self.kept: list[int] = []  # unit index of each unit passed, in order
        self._unit = -1
        self._key: str | None = None

    def start(self, state: dict[str, Any] | None) -> None:
        self._unit = int(state["unit"]) if state else -1
        self._key = state.get("key") if state else None
        active = self.context.epoch == self.epoch
        self._done = self.done if active else []
        self.kept = [u for u in range(self._unit + 1) if not in_ranges(u, self._done)]

    def next(self) -> Any:
        while True:
            item = next(self.source)
            key = _sample_key(item) if self.by == "key" else None
            if key is None or key != self._key:
                self._unit += 1
                if not in_ranges(self._unit, self._done):
                    self.kept.append(self._unit)
            self._key = key
            if not in_ranges(self._unit, self._done):
                return item

    def get_state(self) -> dict[str, Any]:
        return {"unit": self._unit, "key": self._key, "resumed_epoch": self.epoch,
                SOURCES_KEY: [self.source.state_dict()]}


class ElasticDropper(Stage[Any]):
    """Drops the items of partly delivered objects that were delivered before the resume.

    Args:
        source: the stage at the drop point.
        partial: ``{str(source index): [ordinals delivered]}``.
        epoch: the epoch being resumed.
    """

    def __init__(self, source: Stage[Any], partial: dict[str, Sequence[int]], *, epoch: int) -> None:
        super().__init__(source)
        self.partial = {int(g): frozenset(int(j) for j in js) for g, js in partial.items()}
        self.epoch = epoch
        self._obj = -1
        self._count = 0

    def start(self, state: dict[str, Any] | None) -> None:
        self._obj = int(state["obj"]) if state else -1
        self._count = int(state["count"]) if state else 0
        chain = _chain_to_sharder(self.source)
        sharder = chain[-1]
        ctx = sharder.context
        self._where = (ctx.rank, ctx.world_size, ctx.worker_id, max(1, ctx.num_workers))
        self._chain = [type(s) for s in chain]
        self._active = self.context.epoch == self.epoch and bool(self.partial)
        self._unit_at, self._last = _renumbering(sharder, self.partial) if self._active else (int, -1)
        self._active = self._last >= 0

    def next(self) -> Any:
        while True:
            item = next(self.source)
            if not self._active:
                return item
            pos, _ = locate(self._chain, self.source.state_dict(), self._where, after=True)
            if pos > self._last:
                self._active = False
                return item
            g = self._unit_at(pos)
            if g != self._obj:
                self._obj, self._count = g, 0
            ordinal = self._count
            self._count += 1
            if ordinal in self.partial.get(g, ()):
                self.context.stats.incr(self.name, "delivered_before")
                continue
            return item

    def get_state(self) -> dict[str, Any]:
        return {"obj": self._obj, "count": self._count, "resumed_epoch": self.epoch,
                SOURCES_KEY: [self.source.state_dict()]}


def _renumbering(sharder: Stage[Any], partial: dict[int, Any]) -> tuple[Callable[[int], int], int]:
    """How the resumed sharder numbers the units left: ``(position -> source unit, the position
    of the last partly delivered unit this shard gets)``; past that position nothing is dropped,
    and naming each item's unit costs a state per item."""
    if sharder.reads_by_place:  # an assigned source deals the rest itself
        places = cast(AssignedSource, sharder).places()
        if places is None:
            raise ConfigError("elastic resume: the assigned source has nothing to resume")
        owns = cast(AssignedSource, sharder).owns
        owned = [q for q in (places.index_of(g) for g in partial) if q is not None and owns(q)]
        return places.__getitem__, max(owned, default=-1)
    remaining = sharder.sources[0] if sharder.sources else None
    if not isinstance(remaining, ElasticRemaining):
        raise ConfigError("elastic resume: ElasticDropper needs ElasticRemaining before the shard")
    index, count = cast(Any, sharder).shard  # a sharder by its declared trait, of any class
    last, q = -1, 0
    for g in range(max(partial) + 1):
        if in_ranges(g, remaining.done):
            continue
        if g in partial and q % count == index:
            last = q
        q += 1
    return remaining.kept.__getitem__, last
