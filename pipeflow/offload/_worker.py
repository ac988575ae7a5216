"""The cluster side of an offloaded pipeline: one :class:`ShareWorker` per Ray actor.

A worker runs the pipeline's prefix over one share, ``(rank, world size, worker, workers)``,
through an ordinary :class:`~pipeflow.iterator.PipelineIterator` built for that shard: the
share is a pure function of the seed, the epoch, the rank and the worker, exactly what a
DataLoader worker of that rank would read. Each :meth:`ShareWorker.pull` returns one item and
the iterator's state right after it, and now and then (at most every
:data:`~pipeflow.stats.PUBLISH_EVERY_S` seconds, and with the end of the share) the numbers its
stages measured, so ``stats()`` in the training process covers the stages that ran here.
The training process keeps the state of the last item it received from each worker; a
replacement worker starts from that state, so the prefix itself recomputes what was lost (it is
never a replay of a log of items).

The class is plain Python: :mod:`pipeflow.offload._stage` wraps it with ``ray.remote`` when it
starts workers, so importing it needs no Ray.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..graph import Node
from ..iterator import PipelineIterator
from ..run_context import RunContext
from ..stats import PUBLISH_EVERY_S, Stats
from ._tensors import pack

__all__ = ["ShareWorker"]


class ShareWorker:
    """Runs the prefix over one share of one epoch (the body of a Ray actor).

    Args:
        prefix: the description of the stages that run on the cluster.
        where: ``(rank, world size, worker, workers)`` of the share.
    """

    def __init__(self, prefix: Node, where: tuple[int, int, int, int]) -> None:
        self._prefix = prefix
        self._where = where
        self._it: PipelineIterator | None = None
        self._stats = Stats()
        self._reported = 0.0  # when the numbers last went out with an item (monotonic seconds)

    def begin(self, epoch: int, state: dict[str, Any] | None) -> int:
        """Start ``epoch`` from the beginning of the share, or from ``state`` (the state that
        came with the last item the training process received). Returns this process's id."""
        self.close()
        rank, world, worker, workers = self._where
        # the numbers of one run of the share: the training process adds up the runs
        self._stats = Stats()
        context = RunContext(rank=rank, world_size=world, worker_id=worker, num_workers=workers,
                             stats=self._stats)
        it = PipelineIterator(self._prefix, epoch=epoch, context=context)
        if state:
            it.load_state_dict(state)
        self._it = it
        return os.getpid()

    def pull(self) -> tuple[bool, Any, dict[str, Any], dict[str, dict[str, float]] | None]:
        """``(False, item, state after it, numbers)``, or ``(True, None, final state, numbers)``
        when the share is done. ``numbers`` are the stages' statistics of this run of the share
        (:meth:`pipeflow.stats.Stats.snapshot`), or None when they went out less than
        :data:`~pipeflow.stats.PUBLISH_EVERY_S` ago: a few hundred bytes now and then, never per
        item. An error of the prefix propagates with its type (Ray carries it to the caller)."""
        it = self._it
        if it is None:
            raise RuntimeError("ShareWorker.pull() before begin()")
        try:
            item = next(it)
        except StopIteration:
            return True, None, it.state_dict(), self.numbers()
        # torch tensors cross the object store as numpy views, without a copy (offload/_tensors.py)
        return False, pack(item), it.state_dict(), self._numbers_due()

    def numbers(self) -> dict[str, dict[str, float]]:
        """The statistics of this run of the share, by stage label."""
        self._reported = time.monotonic()
        return self._stats.snapshot()

    def _numbers_due(self) -> dict[str, dict[str, float]] | None:
        if time.monotonic() - self._reported < PUBLISH_EVERY_S:
            return None
        return self.numbers()

    def close(self) -> None:
        """Stop the prefix's threads and processes. Idempotent."""
        it, self._it = self._it, None
        if it is not None:
            it.close()
