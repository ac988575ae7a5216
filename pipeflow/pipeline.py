"""The fluent, immutable :class:`Pipeline` facade.

A ``Pipeline`` is a description: a graph of stage classes with their options. Every method
returns a new ``Pipeline`` and never changes the receiver, so a prefix can be shared by several
pipelines. Iterating builds fresh stage objects for the process and worker that iterates
(see :mod:`pipeflow.iterator`), which is what makes a pipeline safe to hand to a ``DataLoader``
with any number of workers and either start method.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import Any, Literal

import torch.utils.data

from ._braces import expand_url_items
from ._checks import check_choice, check_int
from .elastic import resume_node
from .errors import ConfigError
from .formats.images import resolve_jpeg_decoder
from .graph import (
    Node,
    batched_by,
    checks_options,
    draw,
    format_value,
    make_label,
    order_notes,
    refuse_a_dropped_result,
    stage_names,
    validate,
)
from .iterator import PipelineIterator
from .keytable import KeyTable, shareable
from .loader import Loader, LoaderOptions
from .offload import OffloadOptions, RayOffloader
from .sinks import shards as _shards
from .stages.base import Stage
from .stages.batch import Batcher
from .stages.cache import Cacher
from .stages.decode import Decoder
from .stages.device import DeviceMover
from .stages.epoch import EpochSizer
from .stages.equalize import Equalizer
from .stages.fetch_batch import BatchFetcher
from .stages.fields import FieldMapper, Renamer, TupleMaker
from .stages.filter import Filterer
from .stages.group import PairGrouper
from .stages.listing import LIST_THREADS, ObjectLister, obtain_listing
from .stages.map import Mapper
from .stages.mix import Interleaver, Mixer
from .stages.open import Opener
from .stages.prefetch import Prefetcher
from .stages.read_tfrecord import PerProcessTFRecordStream, TFRecordReader, TFRecordStream
from .stages.repeat import Repeater
from .stages.resample import Resampler
from .stages.sample_shuffle import SampleShuffler
from .stages.shard import Sharder
from .stages.shuffle import Shuffler
from .stages.source import ItemSource
from .stages.take import Taker
from .stages.unbatch import Unbatcher
from .stages.untar import Untarrer
from .stages.zip import Zipper
from .stats import PipelineStats, Stats, StatsChannel, remove_channel, track_channel

__all__ = ["Pipeline", "from_items", "interleave", "mix"]


class Pipeline(torch.utils.data.IterableDataset):
    """A chain of stages; iterate it directly or hand it to a ``DataLoader``.

    Build one with :func:`from_items` (or ``list_objects``) and chain methods. Each method
    returns a new pipeline. The only mutable thing is the epoch (:meth:`set_epoch`), as with
    ``DistributedSampler``.
    """

    _length: int | None = None

    def __init__(self, node: Node) -> None:
        super().__init__()
        self._node = node
        self._epoch = 0
        self._stats = Stats()
        #: where processes iterating a copy of this pipeline (DataLoader workers) publish
        #: their statistics; the directory is made when the pipeline leaves this process
        self._channel = StatsChannel()
        track_channel(self._channel)
        weakref.finalize(self, remove_channel, self._channel)

    # ---- building ------------------------------------------------------------------------
    def then(self, stage: type[Stage[Any]], *args: Any, label: str | None = None,
             **kwargs: Any) -> Pipeline:
        """Append a custom stage class: ``stage(source_stage, *args, **kwargs)``.

        The class subclasses :class:`~pipeflow.stages.base.Stage` and implements ``next()``,
        plus ``start(state)``/``stop()``/``get_state()`` when it holds a position or resources
        (see docs/ARCHITECTURE.md). ``label`` replaces its name in ``explain()`` and ``stats()``.
        """
        name = label or make_label(stage.__name__, args, kwargs)
        validate(stage, 1, args, kwargs)
        return Pipeline(Node(stage, args, kwargs, (self._node,), name))

    def _then(self, name: str, stage: type[Stage[Any]], *args: Any, **kwargs: Any) -> Pipeline:
        validate(stage, 1, args, kwargs)
        return Pipeline(Node(stage, args, kwargs, (self._node,), make_label(name, args, kwargs)))

    @property
    def node(self) -> Node:
        """The description of the last stage (read-only)."""
        return self._node

    # ---- core stages ---------------------------------------------------------------------
    @checks_options
    def shuffle(self, buffer_size: int, *, seed: int = 0, by: Literal["item", "key"] = "item") -> Pipeline:
        """Buffer shuffle, reseeded from ``(seed, epoch)`` every epoch; ``by="key"`` moves whole
        samples (a sample's objects, as ``list_objects`` lists them, stay together)."""
        if by == "key":
            return self._then("shuffle", SampleShuffler, buffer_size, seed=seed, by=by)
        check_choice(by, "shuffle(by=...)", ("item", "key"))
        return self._then("shuffle", Shuffler, buffer_size, seed=seed)

    @checks_options
    def shard_by_rank(self, *, ranks: bool = True, workers: bool = True,
                      by: Literal["auto", "item", "key"] = "auto") -> Pipeline:
        """Keep every N-th item (``by="key"``: every N-th sample, its objects together; ``"auto"``:
        by key when ``group_pairs`` groups whole objects downstream), N = ranks x DataLoader
        workers; disables automatic sharding."""
        return self._then("shard_by_rank", Sharder, ranks=ranks, workers=workers, by=by)

    @checks_options
    def map(self, fn: Callable[[Any], Any], *, workers: int | Literal["auto"] = 0,
            method: Literal["thread", "process"] = "thread", in_order: bool = True,
            max_inflight: int | Literal["auto"] | None = None, on_error: Literal["raise", "skip"] = "raise",
            ) -> Pipeline:
        """Apply ``fn`` to every item, inline (``workers=0``) or on N thread/process workers
        (``"auto"``: tuned while running)."""
        return self._then("map", Mapper, fn, workers=workers, method=method, in_order=in_order,
                          max_inflight=max_inflight, on_error=on_error)

    @checks_options
    def filter(self, predicate: Callable[[Any], bool]) -> Pipeline:
        """Keep the items for which ``predicate`` is true."""
        return self._then("filter", Filterer, predicate)

    @checks_options
    def batch(self, size: int, *, drop_last: bool = False,
              collate: bool | Callable[[list[Any]], Any] = False) -> Pipeline:
        """Group items into lists of ``size``; ``collate=True`` uses torch's default_collate."""
        return self._then("batch", Batcher, size, drop_last=drop_last, collate=collate)

    @checks_options
    def unbatch(self) -> Pipeline:
        """Flatten lists (or tuples) of items back into single items."""
        return self._then("unbatch", Unbatcher)

    @checks_options
    def prefetch(self, size: int | Literal["auto"] = 2) -> Pipeline:
        """Run everything upstream in a background thread, keeping up to ``size`` items ready
        (``"auto"``: grown while running when the consumer finds the buffer empty)."""
        return self._then("prefetch", Prefetcher, size)

    @checks_options
    def offload(self, *, workers: int = 2, inflight: int = 2, address: str | None = None,
                cpus: float = 1.0, restarts: int = 3, connect_timeout: float = 5.0,
                start_timeout: float = 60.0) -> Pipeline:
        """Run everything before this point on a Ray cluster: ``workers`` Ray actors per
        training rank, each over the share a DataLoader worker would read, at most ``inflight``
        items ahead each; the stages after it run here. A dead actor is replaced and its share
        continues from the last item received (up to ``restarts`` times per worker and epoch).
        ``address``: ``"HOST:PORT"`` of ``ray start --head`` (None: this process's Ray
        connection, else Ray's default). Needs the ``ray`` extra. See docs/offload.md."""
        options = OffloadOptions(workers=workers, inflight=inflight, address=address, cpus=cpus,
                                 restarts=restarts, connect_timeout=connect_timeout,
                                 start_timeout=start_timeout)
        label = make_label("offload", (), options.shown())
        return Pipeline(Node(RayOffloader, (options,), {}, (self._node,), label))

    @checks_options
    def take(self, n: int, *, across: Literal["each", "all"] = "each") -> Pipeline:
        """Stop after ``n`` items: in each process that iterates (``"each"``: every rank x
        DataLoader worker takes ``n``), or ``n`` for the whole epoch (``"all"``)."""
        return self._then("take", Taker, n, across=across)

    @checks_options
    def repeat(self, times: int | None = None) -> Pipeline:
        """Restart the upstream stages ``times`` times (forever when None), reshuffling each round."""
        return self._then("repeat", Repeater, times)

    @checks_options
    def zip(self, *others: Pipeline) -> Pipeline:
        """Yield tuples of one item from this pipeline and each of ``others``; stop at the shortest."""
        nodes = (self._node,) + tuple(o._node for o in others)
        validate(Zipper, len(nodes), (), {})
        return Pipeline(Node(Zipper, (), {}, nodes, f"zip({len(nodes)} inputs)"))

    # ---- sample dicts, resampling and devices, as webdataset and torchdata users know them --
    @checks_options
    def to_tuple(self, *fields: str, on_missing: Literal["raise", "skip", "none"] = "raise") -> Pipeline:
        """Sample dicts as tuples of the named fields (``"jpg;png"``: the first one present)."""
        return self._then("to_tuple", TupleMaker, *fields, on_missing=on_missing)

    @checks_options
    def rename(self, *, keep: bool = True, on_missing: Literal["raise", "skip", "none"] = "raise",
               **fields: str) -> Pipeline:
        """Rename sample fields: ``rename(image="jpg;png", label="cls")``."""
        return self._then("rename", Renamer, keep=keep, on_missing=on_missing, **fields)

    @checks_options
    def map_dict(self, *, on_missing: Literal["raise", "skip", "none"] = "raise",
                 **fns: Callable[[Any], Any]) -> Pipeline:
        """Apply a function to named sample fields: ``map_dict(jpg=decode, cls=int)``."""
        return self._then("map_dict", FieldMapper, on_missing=on_missing, **fns)

    @checks_options
    def resample(self, n: int | None = None, *, seed: int = 0) -> Pipeline:
        """Draw items with replacement (``n`` per rank x worker, forever when None), each rank
        and worker its own sequence: endless streams over a shard list."""
        return self._then("resample", Resampler, n, seed=seed)

    @checks_options
    def pin_memory(self, *, size: int = 2) -> Pipeline:
        """Pin tensors (in dicts, lists, tuples) on a background thread; without CUDA a no-op."""
        return self._then("pin_memory", DeviceMover, pin=True, size=size)

    @checks_options
    def to(self, device: Any, *, non_blocking: bool = True, size: int = 2) -> Pipeline:
        """Copy tensors (in dicts, lists, tuples) to ``device`` on a background thread."""
        return self._then("to", DeviceMover, device, non_blocking=non_blocking, size=size)

    # ---- backends ------------------------------------------------------------------------
    @checks_options
    def open(self, backend: str | Any = None, *, workers: int | Literal["auto"] = "auto", read: bool = False,
             on_error: Literal["raise", "skip"] = "raise", request_rate: float | None = None,
             **options: Any) -> Pipeline:
        """Open URL / ``ObjectInfo`` items as ``Opened(url, stream)`` (``Record`` with ``read=True``).

        ``backend`` is a name (``"boto3"``, ``"s3torchconnector"``, ...) or None to choose by URL
        scheme; ``workers=N`` keeps N requests in flight on threads, results in order
        (``"auto"``, the default: tuned while running; 0 opens inline). ``request_rate``: requests
        per second for the whole job (every rank and DataLoader worker), split evenly among its
        processes: the store's per-prefix limit is the job's, not one worker's.
        """
        if request_rate is not None:
            options["request_rate"] = request_rate
        return self._then("open", Opener, backend, workers=workers, read=read, on_error=on_error,
                          **options)

    @checks_options
    def fetch_batch(self, backend: str | Any = "s5cmd", *, batch_size: int = 1000,
                    to: str | None = None, delete: bool = True,
                    output: Literal["bytes", "path"] = "bytes", workers: int = 16,
                    on_error: Literal["raise", "skip"] = "raise", timeout: float | None = None,
                    options: dict[str, Any] | None = None) -> Pipeline:
        """Download URL items (or tuples of URLs) in background batches; yield Records or paths."""
        return self._then("fetch_batch", BatchFetcher, backend, batch_size=batch_size, to=to,
                          delete=delete, output=output, workers=workers, on_error=on_error,
                          timeout=timeout, options=options)

    # ---- formats -------------------------------------------------------------------------
    @checks_options
    def untar(self, *, on_error: Literal["raise", "skip"] = "raise") -> Pipeline:
        """Expand opened tar shards (plain/gzip/bz2/xz) into ``Record(member, bytes, url)``."""
        return self._then("untar", Untarrer, on_error=on_error)

    @checks_options
    def group_pairs(self, *, required: Sequence[str] | None = None,
                    on_incomplete: Literal["raise", "skip"] = "raise") -> Pipeline:
        """Group records sharing a key (``a/b.image.png`` -> key ``a/b``) into sample dicts, with
        as many fields as the sample has (the name is historical: not only pairs)."""
        return self._then("group_pairs", PairGrouper, required=required, on_incomplete=on_incomplete)

    @checks_options
    def decode(self, mode: Literal["pil", "torch", "numpy"] = "pil", *,
               handlers: dict[str, Any] | None = None,
               resize: int | tuple[int, int] | None = None, allow_pickle: bool = False,
               on_error: Literal["raise", "skip"] = "raise", workers: int | Literal["auto"] = "auto",
               method: Literal["thread", "process"] = "thread",
               jpeg_decoder: Literal["auto", "pil", "simplejpeg"] = "auto") -> Pipeline:
        """Decode sample fields by extension (images, cls, txt, json, npy, pt; pickle opt-in),
        inline (``workers=0``) or on ``workers`` threads/processes (default ``"auto"``: tuned
        while running); ``resize`` decodes JPEGs at a reduced scale.
        ``jpeg_decoder="auto"`` is resolved here, so explain() shows the decoder in use."""
        return self._then("decode", Decoder, mode, handlers=handlers, resize=resize,
                          allow_pickle=allow_pickle, on_error=on_error, workers=workers, method=method,
                          jpeg_decoder=resolve_jpeg_decoder(jpeg_decoder))

    @checks_options
    def read_tfrecord(self, *, check_crc: bool = True, parse_example: bool = True,
                      on_error: Literal["raise", "skip"] = "raise",
                      compression: Literal["auto", "none", "gzip", "zlib"] = "auto") -> Pipeline:
        """Read opened TFRecord files; parse ``tf.train.Example`` records into dicts."""
        return self._then("read_tfrecord", TFRecordReader, check_crc=check_crc,
                          parse_example=parse_example, on_error=on_error, compression=compression)


    # ---- recipes support -----------------------------------------------------------------
    @checks_options
    def cache(self, directory: str, *, max_bytes: int, backend: Any = None, workers: int = 0,
              on_error: Literal["raise", "skip"] = "raise",
              backend_options: dict[str, Any] | None = None) -> Pipeline:
        """Read URLs through a local disk cache (LRU, shared by worker processes) into Records.

        Items are URLs; the output is ``Record(url, data, url)`` as with ``open(read=True)``.
        Misses are read with ``backend`` and kept; later epochs read from disk only.
        """
        return self._then("cache", Cacher, directory, max_bytes=max_bytes, backend=backend,
                          workers=workers, on_error=on_error, backend_options=backend_options)

    @checks_options
    def equalize(self, *, total: int | None = None, per_shard: int | None = None,
                 mode: Literal["drop", "pad"] = "drop") -> Pipeline:
        """Make every rank x DataLoader worker yield the same number of items (no DDP hang).

        ``total`` is the item count before sharding (read from a ``from_items`` source when
        omitted); each shard yields ``floor(total / shards)`` (``"drop"``) or the ceiling
        (``"pad"``, short shards wrap around). ``per_shard`` sets the count directly.
        """
        return self._then("equalize", Equalizer, total=total, per_shard=per_shard, mode=mode)

    # ---- epoch length --------------------------------------------------------------------
    @checks_options
    def with_epoch(self, n: int) -> Pipeline:
        """Exactly ``n`` items per rank and epoch, split over the DataLoader workers (cut short
        or wrapped around); ``len()`` is then ``n``. See :mod:`pipeflow.stages.epoch`."""
        return self._then("with_epoch", EpochSizer, n)

    @checks_options
    def with_length(self, n: int) -> Pipeline:
        """The same pipeline with ``len()`` declared as ``n`` (items per rank); iteration is
        unchanged, so the number is the caller's promise (``with_epoch`` makes it true)."""
        check_int(n, "with_length(n)", low=0)
        described = Pipeline(self._node)
        described._length = n
        return described

    def __len__(self) -> int:
        """Items per rank and epoch, when known: after ``with_epoch(n)`` or ``with_length(n)``."""
        if self._length is not None:
            return self._length
        declared = self._node.stage.declared_length(self._node.args, self._node.kwargs)
        if declared is not None:
            return declared
        raise TypeError("the length of this pipeline is not known; set it with with_epoch(n) "
                        "(exactly n items per rank) or with_length(n)")

    def __bool__(self) -> bool:  # a pipeline is truthy even when len() is unknown or 0
        return True

    # ---- running -------------------------------------------------------------------------
    def resume_from(self, merged: dict[str, Any]) -> Pipeline:
        """The rest of the epoch ``merged`` (:func:`pipeflow.merge_states`) was saved in, on any
        number of ranks x DataLoader workers: every item the old topology had not delivered,
        once; later epochs are the normal ones. See docs/guarantees.md (elastic resume)."""
        resumed = Pipeline(resume_node(self._node, merged))  # a state that does not fit: said first
        refuse_a_dropped_result(sys._getframe(1), "pipe = pipe.resume_from(merged)")
        resumed._length = self._length
        resumed.set_epoch(int(merged["epoch"]))
        return resumed

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch used to reseed shuffles on the next iteration (like DistributedSampler)."""
        self._epoch = int(epoch)

    @property
    def epoch(self) -> int:
        """The epoch set by :meth:`set_epoch` (0 until then)."""
        return self._epoch

    def __iter__(self) -> PipelineIterator:
        # a weak reference: a live iterator must not keep its pipeline alive
        ref = weakref.ref(self)

        def advance(epoch: int) -> None:
            pipeline = ref()
            if pipeline is not None and pipeline.epoch == epoch:
                pipeline.set_epoch(epoch + 1)

        _refuse_dataloader_batching(self._node, sys._getframe(1))
        if self._stats.pid != os.getpid():
            # a copy in another process (a forked DataLoader worker inherits the owner's
            # counters): count afresh and publish to the owner
            self._stats = Stats(channel=None if self._channel.is_owner else self._channel)
        return PipelineIterator(self._node, epoch=self._epoch, stats=self._stats, on_epoch_end=advance)

    @checks_options
    def loader(self, *, batch_size: int | None = 1, drop_last: bool = False,
               collate: bool | Callable[[Any], Any] = True, pin_memory: bool = False,
               device: Any = None, non_blocking: bool = True, prefetch: int = 2) -> Loader:
        """Batches made in this process by the pipeline's own threads: use it in place of
        ``DataLoader(pipe, num_workers=N)`` (same batching and collate, ``state_dict()`` /
        ``load_state_dict()``, sharding by rank, ``stats()``). See :mod:`pipeflow.loader`."""
        return Loader(self, LoaderOptions(batch_size=batch_size, drop_last=drop_last, collate=collate,
                                          pin_memory=pin_memory, device=device,
                                          non_blocking=non_blocking, prefetch=prefetch))

    def stats(self, *, all_ranks: bool = False) -> PipelineStats:
        """What every stage did: a :class:`~pipeflow.stats.PipelineStats` mapping each stage's
        short label (as :meth:`explain` shows it: ``"decode"``, ``"map#2"``) to its items, busy,
        wait and blocked seconds and counters (skips, retries, ...), with a verdict
        (``.bottleneck``, ``.advice``; ``print()`` it). The printed table and verdict name each
        stage by what it is (``map#2(decode_fn)``, ``.name(label)``). ``busy_s`` is a stage's
        own work, its sources' excluded.

        The numbers of DataLoader worker processes are included (they publish a snapshot at
        most every 0.5 s and at the end of each epoch). ``all_ranks=True`` also sums over the
        ranks of ``torch.distributed``; every rank must call it (it is a collective).
        """
        parts = [(self._stats.snapshot(), 1)]
        if self._channel.is_owner:
            parts += [(published.get("stages", {}), 1) for published in self._channel.read()]
        if all_ranks:
            parts = _gather_ranks(parts)
        return PipelineStats.combine(parts, names=stage_names(self._node))

    @checks_options
    def write_shards(self, url: str, *, format: Literal["tar", "tfrecord"] = "tar",
                     max_size: int | None = 256 << 20, max_count: int | None = None,
                     name: str = "shard-{index:06d}", workers: int = 4, backend: str | Any = None,
                     overwrite: bool = False, progress: Callable[[int, int], None] | None = None,
                     backend_options: dict[str, Any] | None = None) -> Any:
        """Run the pipeline once and write its samples as tar or TFRecord shards under ``url``
        (each shard atomic, a rerun continues an interrupted write, ``manifest.json`` beside
        them); returns the :class:`~pipeflow.sinks.ShardManifest`. See docs/formats.md."""
        return _shards.write_shards(self, url, format=format, max_size=max_size, max_count=max_count,
                            name=name, workers=workers, backend=backend, overwrite=overwrite,
                            progress=progress, backend_options=backend_options)

    def explain(self) -> str:
        """A text drawing of the stage graph: each stage's short label (the key of its counters
        in :meth:`stats`, ``map#2`` for the second ``map``) and options; each source says
        whether its order is the same at any number of ranks x DataLoader workers, and if not,
        why (see docs/guarantees.md)."""
        return draw(self._node, order_notes(self._node))

    def __repr__(self) -> str:
        return "Pipeline:\n" + draw(self._node)

    # pickling for DataLoader workers: descriptions only, never a live iterator
    def __getstate__(self) -> dict[str, Any]:
        self._channel.create()  # a copy in another process publishes its statistics there
        state = self.__dict__.copy()
        state["_stats"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        channel = state["_channel"]
        self._stats = Stats(channel=None if channel.is_owner else channel)


def _refuse_dataloader_batching(node: Node, caller: FrameType) -> None:
    """A pipeline that ends in ``batch(n)`` under ``DataLoader(pipe)`` without
    ``batch_size=None`` has its batches batched again (the DataLoader's default is
    ``batch_size=1``): silently one dimension more, or torch's "each element in list of batch
    should be of equal size" from inside ``default_collate`` at the first short batch.

    A DataLoader does not tell its dataset how it batches. The one place that shows it is the
    fetcher that calls ``iter()`` on the dataset (in each worker, or in the main process
    without workers): its ``auto_collation`` is True when ``batch_size`` is not None. It is
    read where it is, from the calling frame (torch has no public way to ask); should torch
    rename it, this check falls silent and nothing else changes. A ``collate_fn`` of the user's
    own is left alone: it may take the pipeline's batch as it is (``lambda b: b[0]``).

    Raises:
        ConfigError: the pipeline delivers batches and the DataLoader would batch them.
    """
    code = caller.f_code
    if code.co_name != "__init__" or os.path.basename(code.co_filename) != "fetch.py":
        return  # not torch's fetcher; and ``f_locals`` is read nowhere else, since on Python
        # 3.11 reading it keeps a snapshot of the caller's variables alive with its frame
    fetcher = caller.f_locals.get("self")
    if type(fetcher).__name__ != "_IterableDatasetFetcher":
        return
    if getattr(fetcher, "auto_collation", None) is not True:
        return
    if getattr(fetcher, "collate_fn", None) is not torch.utils.data.default_collate:
        return  # a collate_fn of the user's own (e.g. ``lambda b: b[0]``) decides what a batch is
    batch = batched_by(node)
    if batch is not None:
        size = batch.stage.step_size(batch.args, batch.kwargs)
        raise ConfigError(
            f"this pipeline already makes batches (batch({size})): a DataLoader with a batch_size (its "
            "default is 1) would batch them again; pass DataLoader(pipe, batch_size=None, ...) to take "
            "its batches as they are, or leave batching to the DataLoader; to batch its batches "
            "on purpose, add a second .batch() to the pipeline and pass batch_size=None")


def _gather_ranks(parts: list[tuple[dict[str, Any], int]]) -> list[tuple[dict[str, Any], int]]:
    """Every rank's parts, gathered on every rank (a collective call)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return parts
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, parts)
    return [part for rank_parts in gathered for part in rank_parts]


# ---- sources and fan-in ----------------------------------------------------------------------
@checks_options
def from_items(items: Iterable[Any]) -> Pipeline:
    """A pipeline over the items of a collection (materialised once if not a sequence).

    A URL or path string with brace notation (``"s3://b/shard-{000..099}.tar"``) stands for
    the strings it denotes, in order (see :mod:`pipeflow._braces`); other strings are kept.
    """
    source = ItemSource(items)  # validates, and materialises a generator once, here
    items = expand_url_items(source.items)
    if shareable(items):  # a long list of keys: held once per node, not copied into each worker
        items = KeyTable.build(items)
    return Pipeline(Node(ItemSource, (items,), {}, (), f"from_items({format_value(items)})"))


@checks_options
def mix(pipelines: Sequence[Pipeline], weights: Sequence[float] | Callable[[int, int], Sequence[float]],
        *, seed: int = 0, stop: Literal["first", "all"] = "all") -> Pipeline:
    """Sample items from several pipelines at random with the given weights.

    Args:
        pipelines: the inputs.
        weights: one weight per input, or ``f(epoch, step) -> weights`` to change the mix
            during training.
        seed: random seed, combined with the epoch.
        stop: ``"first"`` ends when any input is exhausted; ``"all"`` keeps drawing from the
            others (renormalising their weights) until all are.
    """
    nodes = tuple(p._node for p in pipelines)
    validate(Mixer, len(nodes), (), {"weights": weights, "seed": seed, "stop": stop})
    title = make_label("mix", (), {"weights": weights, "seed": seed, "stop": stop})
    return Pipeline(Node(Mixer, (), {"weights": weights, "seed": seed, "stop": stop}, nodes, title))


@checks_options
def interleave(pipelines: Sequence[Pipeline], *, stop: Literal["first", "all"] = "all") -> Pipeline:
    """Round-robin over several pipelines: one item from each in turn."""
    nodes = tuple(p._node for p in pipelines)
    validate(Interleaver, len(nodes), (), {"stop": stop})
    title = make_label("interleave", (), {"stop": stop})
    return Pipeline(Node(Interleaver, (), {"stop": stop}, nodes, title))


# ---- formats: pipe-mode source -----------------------------------------------------------------
@checks_options
def tfrecord_stream(path: str, *, check_crc: bool = True, parse_example: bool = True,
                    compression: Literal["auto", "none", "gzip", "zlib"] = "auto") -> Pipeline:
    """A pipeline over one continuous stream of TFRecords (a FIFO, as SageMaker Pipe mode
    delivers it, a pipe or a file). ``path`` may contain ``{epoch}``, ``{rank}``, ``{worker}``.
    """
    per_process = "{rank}" in str(path) or "{worker}" in str(path)
    cls = PerProcessTFRecordStream if per_process else TFRecordStream
    kwargs = {"check_crc": check_crc, "parse_example": parse_example, "compression": compression}
    validate(cls, 0, (path,), kwargs)
    return Pipeline(Node(cls, (path,), kwargs, (), make_label("tfrecord_stream", (path,), kwargs)))


# ---- backends: listing source ------------------------------------------------------------------
@checks_options
def list_objects(url: str, *, pattern: str | None = None, backend: str | Any = None,
                 manifest: str | None = None, threads: int = LIST_THREADS, **options: Any) -> Pipeline:
    """A pipeline over the objects under ``url`` (``ObjectInfo`` items, sorted by URL).

    The store is listed once per job, here (by rank 0 under torchrun with a process group, or
    read from ``manifest``, a local path or ``s3://`` URL written on first use), never again in
    each rank or DataLoader worker; ``threads`` list requests run at once where the backend can
    list key ranges concurrently. See :mod:`pipeflow.stages.listing` and ``docs/scale.md``.
    """
    validate(ObjectLister, 0, (url,), {"pattern": pattern, "backend": backend, "manifest": manifest,
                                       "threads": threads, "options": options})
    objects = obtain_listing(url, pattern=pattern, backend=backend, manifest=manifest,
                             threads=threads, options=options)
    kwargs: dict[str, Any] = {"pattern": pattern, "backend": backend, "manifest": manifest,
                              "objects": objects, "threads": threads, "options": options}
    shown = {k: v for k, v in (("pattern", pattern), ("backend", backend), ("manifest", manifest)) if v}
    return Pipeline(Node(ObjectLister, (url,), kwargs, (), make_label("list_objects", (url,), shown)))
