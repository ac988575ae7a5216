"""Running one epoch of a pipeline: :class:`PipelineIterator`.

The iterator builds fresh stages (:func:`pipeflow.graph.build`) in the process and DataLoader
worker that iterates, and owns epoch semantics, state and shutdown. It is given the
description, the epoch, the statistics to count into and what to do at the end of the epoch;
it knows nothing else of the :class:`~pipeflow.pipeline.Pipeline` that made it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ._once import first_time
from ._parent import end_with_parent
from .errors import ConfigError
from .graph import Node, build, fingerprint, walk
from .run_context import RunContext
from .stages.base import Stage
from .stats import Stats

__all__ = ["SKIP_COUNTERS", "PipelineIterator", "skip_counts"]

log = logging.getLogger("pipeflow")


#: counters that mean data was not delivered (``on_error="skip"`` and its kin)
SKIP_COUNTERS = ("skipped", "skipped_objects", "incomplete")


def skip_counts(stats: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """``{stage: {counter: n}}`` of every stage's skip counters that are not zero."""
    out: dict[str, dict[str, float]] = {}
    for stage, counts in stats.items():
        found = {c: n for c, n in counts.items() if c in SKIP_COUNTERS and n}
        if found:
            out[stage] = found
    return out


def _pipeline_order(root: Stage[Any]) -> list[Stage[Any]]:
    """The stages of a built graph, each after its sources (the order explain() reads)."""
    order: list[Stage[Any]] = []
    seen: set[int] = set()

    def visit(stage: Stage[Any]) -> None:
        if id(stage) in seen:
            return
        seen.add(id(stage))
        for src in stage.sources:
            visit(src)
        order.append(stage)

    visit(root)
    return order


def _unreplayable(stages: list[Stage[Any]]) -> tuple[Stage[Any], Stage[Any]] | None:
    """``(stage, unordered)``: a stage whose resume replays its input, and a stage upstream of
    it whose order depends on timing (so the replay would not give the same items); or None."""
    for stage in stages:
        if not stage.replays_input:
            continue
        for src in stage.sources:
            unordered = next((s for s in _pipeline_order(src) if not s.ordered_output), None)
            if unordered is not None:
                return stage, unordered
    return None


def _described(state: Any) -> str:
    """What a value passed as a state is, for an error message (its keys, not its contents)."""
    if isinstance(state, dict):
        keys = ", ".join(repr(k) for k in list(state)[:6])
        return f"a dict with keys {keys}{', ...' if len(state) > 6 else ''}" if state else "an empty dict"
    return type(state).__name__


class PipelineIterator:
    """One pass (epoch) over a pipeline.

    Supports ``state_dict()``/``load_state_dict()`` so ``StatefulDataLoader`` (or your own
    loop) can checkpoint mid-epoch and resume in a fresh process. Closing (explicitly, at the
    end of the epoch, on any exception, or on garbage collection) stops every thread and
    process the stages started.
    """

    def __init__(self, node: Node, *, epoch: int = 0, stats: Stats | None = None,
                 on_epoch_end: Callable[[int], None] | None = None,
                 context: RunContext | None = None) -> None:
        """Args:
            node: the description to build.
            epoch: the epoch shuffles are seeded with.
            stats: the counters the stages count into (a fresh set when None).
            on_epoch_end: called with the epoch when it ends normally (the pipeline uses it
                to advance its own epoch).
            context: the shard this iterator reads (rank, world size, worker, workers), when
                it is not the calling process's own: a cluster worker that runs a rank's share
                of an offloaded prefix (:mod:`pipeflow.offload`). Its epoch is ``epoch``.
        """
        self._on_epoch_end = on_epoch_end
        if context is not None:
            context.epoch = epoch
            if stats is not None:
                context.stats = stats
        self._ctx = context or RunContext.detect(epoch, stats=stats)
        if context is None and self._ctx.in_dataloader_worker:
            # a worker whose command died while forking it would wait on its index queue for
            # ever (torch's watchdog takes init for its parent): it dies with its parent instead
            end_with_parent()
        self._root = build(node, self._ctx)
        self._done = False
        self._replay_checked = False  # whether a mid-epoch state could not be resumed (said once)
        self._stages = _pipeline_order(self._root)
        self._ctx.stats.attach(id(self), self.measure)

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
        except KeyboardInterrupt:
            # Ctrl-C reaches every process of the group. A DataLoader worker then ends, but the
            # main process, exiting, SIGTERMs the workers still alive, and a SIGTERM skips their
            # exit handlers (multiprocessing's /tmp/pymp-* directories stay behind). Waiting
            # here for threads to finish their current pull (up to the prefetch join timeout)
            # lost that race every time: a worker stops them without waiting instead.
            self._ctx.interrupted = self._ctx.in_dataloader_worker
            self._ctx.stopping = True
            self.close()
            raise
        except BaseException:
            self.close()
            raise

    def _finish(self) -> None:
        self._done = True
        self.close()
        if self._on_epoch_end is not None:
            self._on_epoch_end(self._ctx.epoch)
        skipped = skip_counts(self._ctx.stats.snapshot())
        if skipped:
            shown = "; ".join(f"{stage}: " + ", ".join(f"{n} {what}" for what, n in counts.items())
                              for stage, counts in skipped.items())
            log.warning("pipeflow: epoch %d ended with skipped items: %s", self._ctx.epoch, shown)

    def measure(self) -> dict[str, dict[str, float]]:
        """Every stage's numbers (see :meth:`Stage.measure`), sources first; the stages a stage
        runs elsewhere (:meth:`Stage.measure_elsewhere`) come before it."""
        out: dict[str, dict[str, float]] = {}
        for stage in self._stages:
            out.update(stage.measure_elsewhere())
            out[stage.name] = stage.measure()
        return out

    def _shard(self) -> list[int]:
        ctx = self._ctx
        return [ctx.rank, ctx.world_size, ctx.worker_id, ctx.num_workers]

    def state_dict(self) -> dict[str, Any]:
        """The position after the last item returned: small and JSON/pickle friendly.

        Besides the stages' positions it records which shard (rank, world size, DataLoader
        worker, worker count) saved it and the shape of the stage graph, so a state is never
        silently applied to another shard or another pipeline.
        """
        if not self._done:
            self._warn_unreplayable()  # said when the checkpoint is taken, not only at the restart
        return {"epoch": self._ctx.epoch, "done": self._done, "shard": self._shard(),
                "graph": fingerprint(self._root), "stages": self._root.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` at the next item (call before iterating, or at any point).

        Raises:
            ConfigError: the state is not a pipeline iterator's (``None``, a model's state),
                or was saved by another shard (different rank, world size, DataLoader worker or
                worker count) or by a pipeline of another shape. The iterator keeps its
                position then.
        """
        if not isinstance(state, dict) or "epoch" not in state or not isinstance(state.get("stages"), dict):
            raise ConfigError("load_state_dict() needs a state from PipelineIterator.state_dict(), "
                              f"got {_described(state)}")
        saved_shard = state.get("shard")
        if saved_shard is not None and list(saved_shard) != self._shard():
            r, w, wid, nw = saved_shard
            cr, cw, cwid, cnw = self._shard()
            raise ConfigError(
                f"this state was saved by rank {r} of {w} (DataLoader worker {wid} of {nw}) and cannot "
                f"resume rank {cr} of {cw} (worker {cwid} of {cnw}): the shard a state belongs to "
                f"must not change between save and load")
        saved_graph = state.get("graph")
        if saved_graph is not None and saved_graph != fingerprint(self._root):
            raise ConfigError(
                f"this state belongs to a pipeline of another shape: saved {saved_graph}, "
                f"loading into {fingerprint(self._root)}")
        if state.get("stages") and not state.get("done"):
            self._check_replayable()
        self._ctx.epoch = int(state["epoch"])
        self._done = bool(state.get("done", False))
        self._root.load_state_dict(state["stages"])

    def _unreplayable_reason(self) -> str | None:
        found = _unreplayable(self._stages)  # a few dozen stages at most, built once
        if found is None:
            return None
        stage, unordered = found
        return (f"this pipeline cannot resume mid-epoch: {stage.name} re-reads its input from a saved "
                f"position and tells the items apart by their order, but {unordered.name} upstream "
                "delivers them as they complete, in another order every run; use in_order=True there, "
                "or move the unordered map after it")

    def _check_replayable(self) -> None:
        """Refuse a mid-epoch state that cannot resume exactly, rather than deliver some items
        twice and lose others."""
        reason = self._unreplayable_reason()
        if reason is not None:
            raise ConfigError(reason)

    def _warn_unreplayable(self) -> None:
        """The same, said once when a mid-epoch state is saved, so a training job learns it at its
        first checkpoint instead of when it restarts after a failure."""
        if self._replay_checked:
            return
        self._replay_checked = True
        reason = self._unreplayable_reason()
        if reason is not None and first_time("unreplayable_state"):
            log.warning("%s (states saved now load only at an epoch boundary)", reason)

    def close(self) -> None:
        """Stop all background work. Idempotent."""
        root = getattr(self, "_root", None)
        if root is None:
            return
        root.close()
        for stage in walk(root):  # also the sources of a custom stage whose close() skipped them
            if not stage.closed:
                stage.close()
        stats = self._ctx.stats
        stats.detach(id(self), self.measure())
        stats.publish()  # the end of an epoch reaches the owner before the epoch ends there

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # never raise from a finaliser
            pass
