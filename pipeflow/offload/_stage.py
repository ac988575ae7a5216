"""The training side of an offloaded pipeline: :class:`RayOffloader`, what ``offload()`` adds.

The stage stands where the user split the pipeline. Everything above it (its input
description, the *prefix*) runs on the cluster: ``workers`` Ray actors per training rank
(:class:`~pipeflow.offload._worker.ShareWorker`), actor ``a`` of rank ``r`` over the share a
DataLoader worker ``a`` of rank ``r`` would read. The stage takes items from the actors in turn,
as a DataLoader takes batches from its workers, so the split over ranks x workers, the global
order of an assigned source (:mod:`pipeflow.assign`) and exactly-once are the same as with
``DataLoader(num_workers=workers)``.

Items travel as the return values of actor calls: Ray keeps them in its object store (numpy
arrays there are read in place, without a copy) and the training process owns them, so a dying
actor takes none of the items it already returned with it. Each actor has at most ``inflight``
calls outstanding: the backpressure that bounds the object store's share of the job.

A dead actor (killed, out of memory, its node lost) is detected when its next item is due: its
outstanding calls are dropped and a new actor starts its share from the state that came with the
last item this process received from it, so the prefix recomputes exactly the items that were
lost. ``restarts`` bounds how often one share may be replaced in an epoch.

Statistics: each actor sends the numbers its stages measured now and then with an item (and
with the end of its share); :meth:`RayOffloader.measure_elsewhere` sums them over the actors,
so ``stats()`` in the training process shows the stages that ran on the cluster (an actor that
died counts what it reported before, so work done twice is counted twice). The offload stage's
own time in ``next()`` is waiting for the cluster: it counts as ``wait_s``, not ``busy_s``.

State: the turn (which actor the next item comes from), which shares ended, and per share the
prefix's state after its last received item: O(workers) small states, never data.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from ..errors import ClusterError, ConfigError, WorkerCrashedError
from ..stages.base import Stage
from ..stats import merge_stages
from ._cluster import connect
from ._options import OffloadOptions
from ._pool import kill_actors, park, take
from ._tensors import unpack
from ._worker import ShareWorker

__all__ = ["RayOffloader"]

log = logging.getLogger("pipeflow")


class RayOffloader(Stage[Any]):
    """The items of the prefix ``prefix``, computed on a Ray cluster, in the DataLoader's order.

    Args:
        prefix: the description of the stages that run on the cluster (a
            :class:`~pipeflow.graph.Node`; the builder hands it over unbuilt).
        options: the :class:`~pipeflow.offload.OffloadOptions`.
    """

    #: the prefix is split over ranks x cluster workers; nothing after it is sharded again
    is_sharder = True
    #: the builder hands this stage its input description instead of building it here
    runs_inputs_elsewhere = True

    def __init__(self, prefix: Any, options: OffloadOptions) -> None:
        super().__init__()
        if not isinstance(options, OffloadOptions):
            raise ConfigError(f"RayOffloader needs OffloadOptions, got {type(options).__name__}")
        self.prefix = prefix
        self.options = options
        self._ray: Any = None
        self._actors: list[Any] = []
        self._queues: list[deque[Any]] = []
        self._starting: list[bool] = []  # the actor's begin() is still the head of its queue
        self._shares: list[dict[str, Any] | None] = []
        self._ended: list[bool] = []
        self._turn = 0
        self._replaced = [0] * options.workers
        self._restarts_total = 0
        #: per actor, the numbers of its current run; and those of the actors that died
        self._numbers: list[dict[str, dict[str, float]]] = []
        self._numbers_lost: dict[str, dict[str, float]] = {}

    @staticmethod
    def explain_note(args: tuple[Any, ...], kwargs: Any) -> str | None:
        """explain()'s note on this stage's line: where the stages drawn under it run."""
        return "the stages under this line run on the Ray cluster, the ones above it here"

    # ---- contract ---------------------------------------------------------------------------
    def start(self, state: dict[str, Any] | None) -> None:
        workers = self.options.workers
        if self.context.in_dataloader_worker:
            raise ConfigError("offload() runs in the training process: iterate the pipeline or use "
                              "pipe.loader(), not a DataLoader with workers")
        if state and int(state.get("workers", workers)) != workers:
            raise ConfigError(f"this state was saved with offload(workers={state['workers']}); this "
                              f"pipeline has workers={workers}: a share's position belongs to its "
                              "worker (merge_states() resumes on another topology)")
        self._shares = list(state["shares"]) if state else [None] * workers
        self._ended = [bool(e) for e in state["ended"]] if state else [False] * workers
        self._turn = int(state["turn"]) if state else 0
        self._replaced = [0] * workers
        self._ray = connect(self.options.address, self.options.connect_timeout)
        idle = take(self._pool_key())
        self._actors = idle if idle is not None else [None] * workers
        self._queues = [deque() for _ in range(workers)]
        self._starting = [False] * workers
        self._numbers, self._numbers_lost = [{} for _ in range(workers)], {}
        for a in range(workers):
            if not self._ended[a]:
                self._launch(a)

    def next(self) -> Any:
        workers = len(self._ended)
        while not all(self._ended):
            a = self._turn
            if self._ended[a]:
                self._turn = (a + 1) % workers
                continue
            got = self._receive(a)
            if got is None:  # the actor died; its replacement recomputes from the last state
                continue
            done, item, self._shares[a], numbers = got
            if numbers is not None:
                self._numbers[a] = numbers
            self._turn = (a + 1) % workers
            if done:  # the actor stays: it may serve the next epoch (see offload/_pool.py)
                self._ended[a] = True
                continue
            self._queues[a].append(self._actors[a].pull.remote())
            return unpack(item)
        raise StopIteration

    def get_state(self) -> dict[str, Any]:
        return {"workers": self.options.workers, "turn": self._turn, "ended": list(self._ended),
                "shares": list(self._shares)}

    def stop(self) -> None:
        actors, self._actors = self._actors, [None] * len(self._actors)
        self._queues = [deque() for _ in actors]
        if self._ray is None or not self._ray.is_initialized():
            return  # Ray was shut down: its actors went with it
        if self._ended and all(self._ended) and all(a is not None for a in actors):
            park(self._pool_key(), self.prefix, self._ray, actors)  # warm for the next epoch
        else:
            kill_actors(self._ray, actors)

    @classmethod
    def elastic_shares(cls, state: dict[str, Any]) -> list[Any] | None:
        """The prefix's state of each actor's share, in worker order (``merge_states`` reads
        them as a rank's DataLoader workers' states)."""
        return list(state["shares"]) if state.get("shares") else None

    def measure(self) -> dict[str, float]:
        numbers = super().measure()
        # the time in next() is waiting for the cluster's items, not work of this process
        numbers["wait_s"] = numbers.get("wait_s", 0.0) + numbers.get("busy_s", 0.0)
        numbers["busy_s"] = 0.0
        numbers["restarts"] = self._restarts_total
        return numbers

    def measure_elsewhere(self) -> dict[str, dict[str, float]]:
        """The prefix's stages as the actors measured them, summed over this rank's actors
        (``lanes`` and ``workers`` add up, as over DataLoader workers); ``actors`` marks them
        as stages on the cluster."""
        out = merge_stages({}, self._numbers_lost)
        for numbers in self._numbers:
            merge_stages(out, numbers)
        for values in out.values():
            values["actors"] = self.options.workers
        return out

    # ---- the actors -------------------------------------------------------------------------
    def _launch(self, a: int) -> None:
        """Start actor ``a`` (an idle one kept from the last epoch, else a new one) on its share,
        from the last state received from it, and queue ``inflight`` calls (Ray runs one
        caller's calls to an actor in order)."""
        ray, options, ctx = self._ray, self.options, self.context
        actor = self._actors[a]
        if actor is None:
            cls = ray.remote(ShareWorker).options(num_cpus=options.cpus, max_restarts=0,
                                                  max_task_retries=0)
            actor = cls.remote(self.prefix, (ctx.rank, ctx.world_size, a, options.workers))
        begun = actor.begin.remote(ctx.epoch, self._shares[a])
        self._actors[a] = actor
        self._queues[a] = deque([begun] + [actor.pull.remote() for _ in range(options.inflight)])
        self._starting[a] = True

    def _receive(self, a: int) -> tuple[bool, Any, dict[str, Any], Any] | None:
        """The next result of actor ``a``, or None when it died (and was replaced)."""
        ray = self._ray
        errors = ray.exceptions
        queue = self._queues[a]
        try:
            if self._starting[a]:
                self._await_start(a, queue.popleft())
            value = ray.get(queue.popleft())
        except (errors.RayActorError, errors.ObjectLostError, errors.NodeDiedError,
                errors.WorkerCrashedError) as exc:
            if getattr(exc, "actor_init_failed", False):
                raise self._cannot_start(a, exc) from exc  # a new actor would fail the same way
            self._replace(a, exc)
            return None
        except errors.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BaseException):
                raise cause from exc  # the prefix's own error, with its type
            raise
        return value

    def _await_start(self, a: int, begun: Any) -> None:
        """Wait for actor ``a`` to be placed and to load its share's state, within
        ``start_timeout``: a cluster without room for it is an error, not a wait forever."""
        ray, options = self._ray, self.options
        try:
            ray.get(begun, timeout=options.start_timeout)
        except ray.exceptions.GetTimeoutError as exc:
            raise ClusterError(
                f"{self.name}: the cluster did not start cluster worker {a} within "
                f"{options.start_timeout:g}s (offload(workers={options.workers}, cpus={options.cpus:g}) "
                f"per rank: are there enough free CPUs?)", address=options.address or "") from exc
        self._starting[a] = False

    def _cannot_start(self, a: int, exc: BaseException) -> ClusterError:
        return ClusterError(
            f"{self.name}: cluster worker {a} could not be created: the prefix does not load in the "
            "cluster's Python (are pipeflow and the modules of your functions installed there?): "
            f"{exc}", address=self.options.address or "")

    def _replace(self, a: int, exc: BaseException) -> None:
        # what the dead actor did still counts; a new dict, as stats() may read the old one
        # from another thread meanwhile
        lost = {label: dict(values) for label, values in self._numbers_lost.items()}
        self._numbers_lost, self._numbers[a] = merge_stages(lost, self._numbers[a]), {}
        self._replaced[a] += 1
        self._restarts_total += 1
        self._kill(a)
        ctx = self.context
        if self._replaced[a] > self.options.restarts:
            raise WorkerCrashedError(
                f"{self.name}: cluster worker {a} of rank {ctx.rank} died {self._replaced[a]} times in "
                f"epoch {ctx.epoch} (offload(restarts={self.options.restarts})): {exc}") from exc
        log.warning("pipeflow: %s: cluster worker %d of rank %d died; a new one continues its share "
                    "from the last item received (%s)", self.name, a, ctx.rank, type(exc).__name__)
        self._launch(a)

    def _kill(self, a: int) -> None:
        """End actor ``a`` now and drop its outstanding calls (idempotent)."""
        actor, self._actors[a] = self._actors[a], None
        self._queues[a] = deque()
        kill_actors(self._ray, [actor])

    def _pool_key(self) -> tuple[Any, ...]:
        """What an idle actor must match to serve this run: the same description, Ray
        session, rank, world size, worker count and CPUs."""
        ctx, options = self.context, self.options
        job = self._ray.get_runtime_context().get_job_id()
        return (id(self.prefix), job, ctx.rank, ctx.world_size, options.workers, options.cpus)
