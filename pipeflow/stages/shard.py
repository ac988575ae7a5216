"""``shard_by_rank``: split items across distributed ranks and DataLoader workers."""

from __future__ import annotations

import logging
from typing import Any, Literal

from .._checks import check_choice
from .._once import first_time
from .._words import counted
from ..formats.keys import split_key
from .base import SOURCES_KEY, Stage

__all__ = ["Sharder", "owned_after", "owned_before", "warn_if_some_shards_idle"]

log = logging.getLogger("pipeflow")


def warn_if_some_shards_idle(name: str, total: int | None, count: int, world: int, workers: int) -> None:
    """One warning per run when ``total`` items are split over more shards (``count``, of
    ``world`` ranks x ``workers``): the data stays correct, but some workers read nothing and
    the run is slower than it looks."""
    if total is None or total >= count or not first_time("idle_shards"):
        return
    log.warning("pipeflow: %s: %s (shards or objects) split over %d ranks x workers (%s x %s): "
                "%s; keep ranks x workers <= %d, or split the data into more shards", name,
                counted(total, "item"), count, counted(world, "rank"),
                counted(workers, "DataLoader worker"),
                counted(count - total, "of them reads nothing", "of them read nothing"), total)

def owned_after(pos: int, index: int, count: int) -> int:
    """The first source index >= ``pos`` that shard ``index`` of ``count`` keeps."""
    return pos + (index - pos) % count


def owned_before(pos: int, index: int, count: int) -> int:
    """The last source index < ``pos`` that shard ``index`` of ``count`` keeps."""
    last = pos - 1
    return last - (last - index) % count



class Sharder(Stage[Any]):
    """Keeps item ``i`` when ``i % num_shards == shard_index``.

    ``num_shards`` is world size x DataLoader workers (either factor can be switched off) and
    ``shard_index`` is ``rank * num_workers + worker_id``; rank and world size come from
    ``torch.distributed`` when initialised, else from ``RANK``/``WORLD_SIZE``.

    With ``by="key"`` the unit is a *sample*, not an item: consecutive items whose URLs share a
    sample key (``s3://b/pairs/7.image`` and ``s3://b/pairs/7.label`` -> ``s3://b/pairs/7``) stay
    together, and sample ``j`` goes to shard ``j % num_shards``. That is what keeps
    ``list_objects(...).open(read=True).group_pairs()`` whole under several workers and ranks:
    every object is fetched once, by the shard that groups its sample. Items that are not URLs
    (or URLs without an extension) count as samples of their own.

    Args:
        source: the input stage.
        ranks: split across distributed ranks.
        workers: split across DataLoader workers.
        by: ``"item"``, ``"key"`` (keep a sample's objects together), or ``"auto"``: ``"key"``
            when ``group_pairs()`` groups whole objects downstream (no ``untar()`` between),
            else ``"item"`` (the builder decides; a stage built alone takes ``"item"``).
        auto: set by the builder for the automatic sharding it inserts (shown in explain()).
    """

    passes_items = True

    is_sharder = True
    #: its split is a rule over source indices, which elastic resume re-deals
    elastic_roles = frozenset({"shard"})

    @classmethod
    def built_options(cls, kwargs: dict[str, Any], *, grouped: bool) -> dict[str, Any]:
        if kwargs.get("by", "auto") == "auto":  # keep grouped objects together
            return {**kwargs, "by": "key" if grouped else "item"}
        return kwargs

    @classmethod
    def splits_by_place(cls, kwargs: dict[str, Any], grouped: bool) -> bool:
        by = kwargs.get("by", "auto")
        by_item = by == "item" or (by == "auto" and not grouped)
        return by_item and kwargs.get("ranks", True) is True and kwargs.get("workers", True) is True

    def __init__(self, source: Stage[Any], *, ranks: bool = True, workers: bool = True,
                 by: Literal["auto", "item", "key"] = "auto", auto: bool = False) -> None:
        super().__init__(source)
        self._ranks = ranks
        self._workers = workers
        by = check_choice(by, "shard_by_rank(by=...)", ("auto", "item", "key"))
        self.by = "item" if by == "auto" else by
        self.auto = auto
        self._pos = 0
        self._sample = -1      # by="key": index of the current sample
        self._key: str | None = None

    # ---- elastic resume: how this stage's state names the units it split ----------------------
    @property
    def splits_all(self) -> bool:
        """True when this sharder splits across ranks and workers (what elastic resume needs)."""
        return self._ranks and self._workers

    @classmethod
    def elastic_place(cls, state: dict[str, Any], where: tuple[int, int, int, int], *,
                      following: bool) -> int:
        """The unit (item, or sample with ``by="key"``) of the stream before the shard that a
        state saved by shard ``where`` = ``(rank, world, worker, workers)`` names: the next one
        it would keep (``following``), else the last one it kept."""
        rank, world, worker, workers = where
        index, count = rank * workers + worker, world * workers
        # by="key" shards whole samples: the unit is the sample, "sample" the current one
        pos = int(state["sample"]) + 1 if "sample" in state else int(state["pos"])
        return owned_after(pos, index, count) if following else owned_before(pos, index, count)

    @classmethod
    def elastic_done(cls, state: dict[str, Any], where: tuple[int, int, int, int],
                     before: int | None) -> list[Any]:
        """The units shard ``where`` delivered: all of its units before ``before`` (None: every
        one), as a ``[start, stop, step]`` range."""
        rank, world, worker, workers = where
        return [rank * workers + worker, before, world * workers]

    @classmethod
    def elastic_untouched(cls, state: dict[str, Any], where: tuple[int, int, int, int]) -> Any:
        """The entry of a shard that never started: None (it delivered nothing)."""
        return None

    @classmethod
    def elastic_window(cls, state: dict[str, Any], where: tuple[int, int, int, int],
                       first: int) -> dict[str, Any]:
        """Which units an old shard reads from ``first`` on: every ``count``-th."""
        rank, world, worker, workers = where
        return {"start": first, "step": world * workers}

    @property
    def shard(self) -> tuple[int, int]:
        """``(index, count)`` of this process's shard."""
        ctx = self.context
        rank, world = (ctx.rank, ctx.world_size) if self._ranks else (0, 1)
        wid, nw = (ctx.worker_id, ctx.num_workers) if self._workers else (0, 1)
        return rank * nw + wid, world * nw

    def start(self, state: dict[str, Any] | None) -> None:
        self._pos = int(state["pos"]) if state else 0
        self._sample = int(state.get("sample", -1)) if state else -1
        self._key = state.get("key") if state else None
        self._index, self._count = self.shard
        if state is None and self.context.rank == 0:
            self._warn_if_some_shards_idle()

    def _known_total(self) -> int | None:
        """Items reaching this sharder in an epoch, when a source knows it through one-to-one
        stages (``from_items``, ``list_objects``, a shuffle of either); None otherwise."""
        stage = self.source
        for _ in range(64):
            total = stage.known_length()
            if total is not None or not (stage.one_to_one and len(stage.sources) == 1):
                return total
            stage = stage.sources[0]
        return None

    def _warn_if_some_shards_idle(self) -> None:
        total = self._known_total() if self.by == "item" else None
        ctx = self.context
        world = ctx.world_size if self._ranks else 1
        workers = ctx.num_workers if self._workers else 1
        warn_if_some_shards_idle(self.name or "shard_by_rank", total, self._count, world, workers)

    def next(self) -> Any:
        if self.by == "key":
            return self._next_by_key()
        source, index, count = self.source, self._index, self._count
        while True:
            item = next(source)
            pos = self._pos
            self._pos = pos + 1
            if pos % count == index:
                return item

    def _next_by_key(self) -> Any:
        source, index, count = self.source, self._index, self._count
        while True:
            item = next(source)
            self._pos += 1
            key = _sample_key(item)
            if key is None or key != self._key:
                self._sample += 1
            self._key = key
            if self._sample % count == index:
                return item

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"pos": self._pos, SOURCES_KEY: [self.source.state_dict()]}
        if self.by == "key":
            state.update(sample=self._sample, key=self._key)
        return state


def _sample_key(item: Any) -> str | None:
    """The sample key of a URL or ``ObjectInfo`` item, None for anything else."""
    url = item if isinstance(item, str) else getattr(item, "url", None)
    if not isinstance(url, str):
        return None
    parts = split_key(url)
    return parts[0] if parts is not None else None
