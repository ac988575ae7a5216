"""Turning a :class:`~pipeflow.pipeline.Pipeline` description into running stages.

The builder creates fresh stage objects in the process (and DataLoader worker) that iterates,
binds them to one :class:`~pipeflow.context.RunContext`, and inserts automatic sharding when
the pipeline has no ``shard_by_rank`` but runs as one of several ranks or workers.
:class:`PipelineIterator` owns epoch semantics, state and shutdown.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

from ._once import first_time
from .context import RunContext
from .errors import ConfigError
from .stages.base import Stage
from .stages.shard import Sharder

if TYPE_CHECKING:
    from .pipeline import Node, Pipeline

__all__ = ["PipelineIterator", "build"]

log = logging.getLogger("pipeflow")


def _has_sharder(node: Node) -> bool:
    return getattr(node.stage, "is_sharder", False) or any(_has_sharder(i) for i in node.inputs)


def build(node: Node, ctx: RunContext) -> Stage[Any]:
    """Instantiate the stage graph described by ``node`` for ``ctx``.

    Automatic sharding: when the graph contains no sharding stage and ``ctx`` says this process
    is one of several shards (ranks x DataLoader workers), every source (a stage without
    inputs) is followed by a ``Sharder``, so each item is read by exactly one shard instead of
    being silently duplicated. Add ``shard_by_rank()`` yourself to choose the place.
    """
    auto = ctx.num_shards > 1 and not _has_sharder(node)
    # one line for the whole run: from the first shard only, and once across worker processes
    if auto and ctx.shard_index == 0 and first_time("auto_shard"):
        log.info("pipeflow: no shard_by_rank() in the pipeline; sharding each source across "
                 "%d ranks x workers automatically", ctx.num_shards)
    return _build(node, ctx, auto)[0]


def _build(node: Node, ctx: RunContext, auto: bool) -> tuple[Stage[Any], bool]:
    inputs = [_build(i, ctx, auto) for i in node.inputs]
    stage = node.stage(*(s for s, _ in inputs), *node.args, **node.kwargs)
    stage.context = ctx
    stage.name = node.title()
    stage.sharded_upstream = any(sharded for _, sharded in inputs)
    sharded = stage.sharded_upstream or stage.is_sharder
    if auto and not node.inputs:
        sharder = Sharder(stage, auto=True)
        sharder.context = ctx
        sharder.name = f"auto_shard({stage.name})"
        return sharder, True
    return stage, sharded


def _fingerprint(stage: Stage[Any]) -> str:
    """The graph's shape by stage class (options left out, so they may change on resume)."""
    inner = ",".join(_fingerprint(s) for s in stage.sources)
    return f"{type(stage).__name__}({inner})" if inner else type(stage).__name__


class PipelineIterator:
    """One pass (epoch) over a pipeline.

    Supports ``state_dict()``/``load_state_dict()`` so ``StatefulDataLoader`` (or your own
    loop) can checkpoint mid-epoch and resume in a fresh process. Closing (explicitly, at the
    end of the epoch, on any exception, or on garbage collection) stops every thread and
    process the stages started.
    """

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline_ref = weakref.ref(pipeline)
        self._ctx = RunContext.detect(pipeline.epoch, stats=pipeline._stats)
        self._root = build(pipeline.node, self._ctx)
        self._done = False

    @property
    def context(self) -> RunContext:
        return self._ctx

    @property
    def root(self) -> Stage[Any]:
        """The last stage of the built graph."""
        return self._root

    def __iter__(self) -> PipelineIterator:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        try:
            return next(self._root)
        except StopIteration:
            self._finish()
            raise
        except BaseException:
            self.close()
            raise

    def _finish(self) -> None:
        self._done = True
        self.close()
        pipeline = self._pipeline_ref()
        if pipeline is not None and pipeline.epoch == self._ctx.epoch:
            pipeline.set_epoch(self._ctx.epoch + 1)
        stats = self._ctx.stats.snapshot()
        skipped = {stage: c for stage, c in stats.items() if c.get("skipped")}
        if skipped:
            log.warning("pipeflow: epoch %d ended with skipped items: %s", self._ctx.epoch, skipped)

    def _shard(self) -> list[int]:
        ctx = self._ctx
        return [ctx.rank, ctx.world_size, ctx.worker_id, ctx.num_workers]

    def state_dict(self) -> dict[str, Any]:
        """The position after the last item returned: small and JSON/pickle friendly.

        Besides the stages' positions it records which shard (rank, world size, DataLoader
        worker, worker count) saved it and the shape of the stage graph, so a state is never
        silently applied to another shard or another pipeline.
        """
        return {"epoch": self._ctx.epoch, "done": self._done, "shard": self._shard(),
                "graph": _fingerprint(self._root), "stages": self._root.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` at the next item (call before iterating, or at any point).

        Raises:
            ConfigError: the state was saved by another shard (different rank, world size,
                DataLoader worker or worker count) or by a pipeline of another shape.
        """
        saved_shard = state.get("shard")
        if saved_shard is not None and list(saved_shard) != self._shard():
            r, w, wid, nw = saved_shard
            cr, cw, cwid, cnw = self._shard()
            raise ConfigError(
                f"this state was saved by rank {r} of {w} (DataLoader worker {wid} of {nw}) and cannot "
                f"resume rank {cr} of {cw} (worker {cwid} of {cnw}): the shard a state belongs to "
                f"must not change between save and load")
        saved_graph = state.get("graph")
        if saved_graph is not None and saved_graph != _fingerprint(self._root):
            raise ConfigError(
                f"this state belongs to a pipeline of another shape: saved {saved_graph}, "
                f"loading into {_fingerprint(self._root)}")
        self._ctx.epoch = int(state["epoch"])
        self._done = bool(state.get("done", False))
        self._root.load_state_dict(state["stages"])

    def close(self) -> None:
        """Stop all background work. Idempotent."""
        root = getattr(self, "_root", None)
        if root is not None:
            root.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # never raise from a finaliser
            pass
