"""Thread-native loading: :class:`Loader`, what ``Pipeline.loader()`` returns.

A ``DataLoader(pipe, num_workers=N)`` runs N copies of the pipeline in worker processes and
hands every batch over a pipe to the training process; each worker holds its own key list,
clients and buffers, and the data is split N ways on top of the ranks. A pipeline already does
its slow work on its own threads (requests, GIL-releasing decode) and, where a function holds
the GIL, on its own processes (``map(method="process")``), so the worker processes mostly add
a hand-off, memory and start-up time.

A :class:`Loader` iterates the pipeline in the training process instead: it appends the
batching (collated as ``DataLoader`` collates), and pinning / the copy to a device on a
background thread that keeps ``prefetch`` batches ready, so the whole chain overlaps the
training step. It keeps what a ``StatefulDataLoader`` gives: ``state_dict()`` /
``load_state_dict()`` anywhere in an epoch, epochs that advance by themselves, sharding by
rank (from ``torch.distributed`` or ``RANK``/``WORLD_SIZE``, with no split among workers) and
``stats()``. With no DataLoader workers, ``workers="auto"`` stages budget the cores of the
whole process (see :func:`pipeflow.executor.autotune.cpu_budget`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch.utils.data import default_convert

from ._checks import check_bool, check_int
from ._words import counted
from .errors import ConfigError
from .graph import batched_by, refuse_a_dropped_result
from .iterator import PipelineIterator
from .run_context import RunContext
from .stages.device import DeviceMover, _device

if TYPE_CHECKING:
    from .stats import PipelineStats

#: a :class:`pipeflow.Pipeline` (not imported, not even for type hints: ``pipeline.py`` imports
#: this module, and the layering allows no cycle)
Pipeline = Any

__all__ = ["Loader", "LoaderOptions"]

#: the key a loader's state carries its options under
STATE_KEY = "loader"


@dataclass(frozen=True)
class LoaderOptions:
    """The options of :meth:`Pipeline.loader <pipeflow.Pipeline.loader>` (checked when made).

    Attributes:
        batch_size: items per batch, as ``DataLoader(batch_size=...)``; None passes items
            one by one (through ``collate``, as the DataLoader does without batching).
        drop_last: drop the last batch of an epoch when it is short.
        collate: True for torch's ``default_collate`` (``default_convert`` per item when
            ``batch_size`` is None), False for plain lists, or a function of the list.
        pin_memory: pin the batches' tensors in page-locked memory (a no-op without CUDA).
        device: copy the batches' tensors to this device (``"cuda:0"``), or None.
        non_blocking: asynchronous copy from pinned memory.
        prefetch: batches kept ready by the background thread that batches, pins and copies.
    """

    batch_size: int | None = 1
    drop_last: bool = False
    collate: bool | Callable[[Any], Any] = True
    pin_memory: bool = False
    device: Any = None
    non_blocking: bool = True
    prefetch: int = 2

    def __post_init__(self) -> None:
        check_int(self.batch_size, "loader(batch_size=...)", low=1, optional=True)
        check_bool(self.drop_last, "loader(drop_last=...)")
        if not isinstance(self.collate, bool) and not callable(self.collate):
            raise ConfigError(f"loader(collate=...) must be True, False or a function, got {self.collate!r}")
        check_bool(self.pin_memory, "loader(pin_memory=...)")
        check_bool(self.non_blocking, "loader(non_blocking=...)")
        check_int(self.prefetch, "loader(prefetch=...)", low=1)
        if self.device is not None:
            _device(self.device)  # a bad device is an error here, not at the first batch

    def signature(self) -> dict[str, Any]:
        """What a saved position depends on: a state saved with other batching cannot resume."""
        return {"batch_size": self.batch_size, "drop_last": self.drop_last}


def extend(pipe: Pipeline, options: LoaderOptions) -> Pipeline:
    """``pipe`` with the loader's stages appended: batch (and collate), then one background
    thread that pins / copies to the device (or only prefetches), ``prefetch`` batches ahead."""
    if options.batch_size is not None:
        pipe = pipe.batch(options.batch_size, drop_last=options.drop_last, collate=options.collate)
    elif options.collate is True:
        pipe = pipe.map(default_convert)
    elif options.collate is not False:
        pipe = pipe.map(options.collate)
    size = options.prefetch
    if options.device is not None:
        return pipe.then(DeviceMover, options.device, pin=options.pin_memory,
                         non_blocking=options.non_blocking, size=size, label="to")
    if options.pin_memory:
        return pipe.pin_memory(size=size)
    return pipe.prefetch(size)


class Loader:
    """Batches of a pipeline, made in the training process by the pipeline's own threads.

    Use it where you would use ``DataLoader(pipe, num_workers=N)``: ``for batch in loader``
    runs one epoch (the next ``for`` runs the next epoch, reshuffled); ``state_dict()`` /
    ``load_state_dict()`` save and restore the position after the last batch returned, as
    ``StatefulDataLoader`` does; ``stats()`` reports every stage, the appended ones too
    (``batch``, ``to``/``pin_memory``/``prefetch``). Starting a new ``for`` ends the previous
    pass; ``close()`` (or ``with``) stops its threads and processes at once, otherwise they
    stop at the end of the epoch or when the loader is garbage collected.
    """

    def __init__(self, pipe: Pipeline, options: LoaderOptions, *, extended: bool = False) -> None:
        """Args:
            pipe: the pipeline to load from.
            options: batching, collate, device and prefetch.
            extended: ``pipe`` already ends in the loader's stages (a resumed loader).
        """
        self._options = options
        if not extended:
            _refuse_batches_of_batches(pipe, options)
        self._pipe = pipe if extended else extend(pipe, options)
        self._pipe.set_epoch(pipe.epoch)
        self._length = None if extended else _batches(pipe, options)
        self._it: PipelineIterator | None = None
        self._pending: dict[str, Any] | None = None

    @property
    def options(self) -> LoaderOptions:
        return self._options

    @property
    def pipeline(self) -> Pipeline:
        """The pipeline this loader iterates: the given one with the loader's stages appended."""
        return self._pipe

    @property
    def epoch(self) -> int:
        """The epoch the next pass runs (or the current one while a pass is running)."""
        return self._pipe.epoch

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` next (epochs otherwise advance by one at the end of each)."""
        self._pipe.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        if RunContext.detect().in_dataloader_worker:
            raise ConfigError("Pipeline.loader() runs in the training process; inside a DataLoader "
                              "worker hand the pipeline itself to the DataLoader")
        self.close()  # a new pass ends the previous one, as with a DataLoader
        it = iter(self._pipe)
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                it.load_state_dict(pending)
            except BaseException:
                it.close()
                self._pending = pending  # nothing lost: the state can be inspected or replaced
                raise
        self._it = it
        return it

    def __len__(self) -> int:
        """Batches per rank and epoch, when the pipeline's length is known (``with_epoch``)."""
        if self._length is None:
            raise TypeError("the length of this loader is not known; give the pipeline a length "
                            "with with_epoch(n) or with_length(n)")
        return self._length

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch returned: small, JSON/pickle friendly.

        Mid-epoch it is the iterator's state (accepted by :func:`pipeflow.merge_states`);
        before a pass or after one ended it names the epoch the next pass starts.
        """
        live = None if self._it is None else self._it.state_dict()
        if self._pending is not None:
            state = dict(self._pending)
        elif live is not None and not live["done"]:
            state = live
        else:
            state = {"epoch": self._pipe.epoch}
        state[STATE_KEY] = self._options.signature()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state`` on the next ``for``: the batch after the last one returned when
        it was saved (a state saved after an epoch ended starts the next epoch).

        Raises:
            ConfigError: the state is not a loader's or a pipeline iterator's, or was saved
                with other batching. A state of another rank or pipeline shape raises when the
                next pass starts.
        """
        if not isinstance(state, dict) or "epoch" not in state:
            raise ConfigError("load_state_dict() needs a state from Loader.state_dict() or "
                              f"PipelineIterator.state_dict(), got {type(state).__name__}")
        saved = state.get(STATE_KEY)
        if saved is not None and saved != self._options.signature():
            raise ConfigError(f"this state was saved by a loader with {saved}; this loader has "
                              f"{self._options.signature()}: a position counts batches of one size")
        self.close()
        epoch = int(state["epoch"])
        stages = {k: v for k, v in state.items() if k != STATE_KEY}
        if state.get("done"):
            epoch, stages = epoch + 1, {}
        self._pipe.set_epoch(epoch)
        self._pending = stages if "stages" in stages else None

    def resume_from(self, merged: dict[str, Any]) -> Loader:
        """A loader over the rest of the epoch ``merged`` was saved in
        (:func:`pipeflow.merge_states` of every rank's ``state_dict()``), on any number of
        ranks: every item no rank had returned in a batch, once; later epochs are the normal
        ones. Needs ``shard_by_rank()`` in the pipeline, as ``Pipeline.resume_from`` does."""
        resumed = Loader(self._pipe.resume_from(merged), self._options, extended=True)
        refuse_a_dropped_result(sys._getframe(1), "loader = loader.resume_from(merged)")
        return resumed

    def stats(self, *, all_ranks: bool = False) -> PipelineStats:
        """What every stage did (see :meth:`Pipeline.stats <pipeflow.Pipeline.stats>`);
        ``all_ranks=True`` sums over the ranks (a collective: every rank calls it)."""
        return self._pipe.stats(all_ranks=all_ranks)

    def explain(self) -> str:
        """The stage graph this loader runs (see :meth:`Pipeline.explain`)."""
        return self._pipe.explain()

    def close(self) -> None:
        """Stop the current pass's threads and processes now. Idempotent."""
        it, self._it = self._it, None
        if it is not None:
            it.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Loader({self._options}):\n{self.explain()}"


def _refuse_batches_of_batches(pipe: Pipeline, options: LoaderOptions) -> None:
    """A pipeline that ends in ``batch(n)`` given to ``loader()`` with its default
    ``batch_size=1`` silently gained a dimension: every batch came wrapped in a batch of one.
    Batching twice on purpose stays possible inside the pipeline (``.batch(4).batch(8)``)."""
    again = options.batch_size
    batch = batched_by(pipe.node) if again is not None else None
    if batch is not None and again is not None:
        size = batch.stage.step_size(batch.args, batch.kwargs)
        raise ConfigError(
            f"this pipeline already makes batches (batch({size})): loader(batch_size={again}) would "
            f"batch them again, {counted(again, 'batch', 'batches')} to a batch; pass "
            "loader(batch_size=None) to take its batches as they are, or leave batching to the loader")


def _batches(pipe: Pipeline, options: LoaderOptions) -> int | None:
    try:
        items = len(pipe)
    except TypeError:
        return None
    if options.batch_size is None:
        return items
    rounding = math.floor if options.drop_last else math.ceil
    return int(rounding(items / options.batch_size))
