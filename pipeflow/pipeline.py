"""The fluent, immutable :class:`Pipeline` facade.

A ``Pipeline`` is a description: a graph of stage classes with their options. Every method
returns a new ``Pipeline`` and never changes the receiver, so a prefix can be shared by several
pipelines. Iterating builds fresh stage objects for the process and worker that iterates
(see :mod:`pipeflow.runner`), which is what makes a pipeline safe to hand to a ``DataLoader``
with any number of workers and either start method.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch.utils.data

from .context import Stats
from .stages.base import Stage

__all__ = ["Pipeline", "from_items", "interleave", "mix"]


@dataclass(frozen=True)
class Node:
    """One stage in a pipeline description."""

    stage: type[Stage[Any]]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    inputs: tuple[Node, ...] = ()
    label: str = ""

    def title(self) -> str:
        return self.label or self.stage.__name__


#: option names whose values are never shown (explain(), reprs, stage names in errors and stats)
_SECRET_WORDS = ("secret", "token", "password", "passwd", "access_key", "credential", "key_id")


def _is_secret(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: ("***" if isinstance(k, str) and _is_secret(k) else _redact(v)) for k, v in value.items()}
    return value


def _fmt(value: Any) -> str:
    if callable(value) and hasattr(value, "__qualname__"):
        return value.__qualname__
    if isinstance(value, (list, tuple)) and len(value) > 4:
        return f"[{len(value)} items]"
    text = repr(_redact(value))
    return text if len(text) <= 60 else text[:57] + "..."


def _label(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    parts = [_fmt(a) for a in args]
    parts += [f"{k}={'***' if _is_secret(k) else _fmt(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


class _Placeholder(Stage[Any]):
    """Stands in for the inputs when a stage is constructed only to validate its options."""


def _validate(stage: type[Stage[Any]], n_inputs: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    # Stage constructors only check and store options (setup happens in reset), so building
    # one against placeholders reports a bad option where the pipeline is written, not
    # later inside a DataLoader worker.
    stage(*(_Placeholder() for _ in range(n_inputs)), *args, **kwargs).close()


class Pipeline(torch.utils.data.IterableDataset):
    """A chain of stages; iterate it directly or hand it to a ``DataLoader``.

    Build one with :func:`from_items` (or ``list_objects``) and chain methods. Each method
    returns a new pipeline. The only mutable thing is the epoch (:meth:`set_epoch`), as with
    ``DistributedSampler``.
    """

    def __init__(self, node: Node) -> None:
        super().__init__()
        self._node = node
        self._epoch = 0
        self._stats = Stats()

    # ---- building -----------------------------------------------------------------------
    def then(self, stage: type[Stage[Any]], *args: Any, label: str | None = None,
             **kwargs: Any) -> Pipeline:
        """Append a custom stage class: ``stage(source_stage, *args, **kwargs)``."""
        name = label or _label(stage.__name__, args, kwargs)
        _validate(stage, 1, args, kwargs)
        return Pipeline(Node(stage, args, kwargs, (self._node,), name))

    def _then(self, name: str, stage: type[Stage[Any]], *args: Any, **kwargs: Any) -> Pipeline:
        _validate(stage, 1, args, kwargs)
        return Pipeline(Node(stage, args, kwargs, (self._node,), _label(name, args, kwargs)))

    @property
    def node(self) -> Node:
        """The description of the last stage (read-only)."""
        return self._node

    # ---- core stages --------------------------------------------------------------------
    def shuffle(self, buffer_size: int, *, seed: int = 0) -> Pipeline:
        """Buffer shuffle, reseeded from ``(seed, epoch)`` every epoch."""
        from .stages.shuffle import Shuffler
        return self._then("shuffle", Shuffler, buffer_size, seed=seed)

    def shard_by_rank(self, *, ranks: bool = True, workers: bool = True) -> Pipeline:
        """Keep every N-th item, N = ranks x DataLoader workers; disables automatic sharding."""
        from .stages.shard import Sharder
        return self._then("shard_by_rank", Sharder, ranks=ranks, workers=workers)

    def map(self, fn: Callable[[Any], Any], *, workers: int = 0,
            method: Literal["thread", "process"] = "thread", in_order: bool = True,
            max_inflight: int | None = None, on_error: Literal["raise", "skip"] = "raise",
            ) -> Pipeline:
        """Apply ``fn`` to every item, inline (``workers=0``) or on N thread/process workers."""
        from .stages.map import Mapper
        return self._then("map", Mapper, fn, workers=workers, method=method, in_order=in_order,
                          max_inflight=max_inflight, on_error=on_error)

    def filter(self, predicate: Callable[[Any], bool]) -> Pipeline:
        """Keep the items for which ``predicate`` is true."""
        from .stages.filter import Filterer
        return self._then("filter", Filterer, predicate)

    def batch(self, size: int, *, drop_last: bool = False,
              collate: bool | Callable[[list[Any]], Any] = False) -> Pipeline:
        """Group items into lists of ``size``; ``collate=True`` uses torch's default_collate."""
        from .stages.batch import Batcher
        return self._then("batch", Batcher, size, drop_last=drop_last, collate=collate)

    def unbatch(self) -> Pipeline:
        """Flatten lists (or tuples) of items back into single items."""
        from .stages.unbatch import Unbatcher
        return self._then("unbatch", Unbatcher)

    def prefetch(self, size: int = 2) -> Pipeline:
        """Run everything upstream in a background thread, keeping up to ``size`` items ready."""
        from .stages.prefetch import Prefetcher
        return self._then("prefetch", Prefetcher, size)

    def take(self, n: int) -> Pipeline:
        """Stop after ``n`` items."""
        from .stages.take import Taker
        return self._then("take", Taker, n)

    def repeat(self, times: int | None = None) -> Pipeline:
        """Restart the upstream stages ``times`` times (forever when None), reshuffling each round."""
        from .stages.repeat import Repeater
        return self._then("repeat", Repeater, times)

    def zip(self, *others: Pipeline) -> Pipeline:
        """Yield tuples of one item from this pipeline and each of ``others``; stop at the shortest."""
        from .stages.zip import Zipper
        nodes = (self._node,) + tuple(o._node for o in others)
        _validate(Zipper, len(nodes), (), {})
        return Pipeline(Node(Zipper, (), {}, nodes, f"zip({len(nodes)} inputs)"))

    # ---- backends (issue: storage backends) ---------------------------------------------
    def open(self, backend: str | Any = None, *, workers: int = 0, read: bool = False,
             on_error: Literal["raise", "skip"] = "raise", **options: Any) -> Pipeline:
        """Open URL / ``ObjectInfo`` items as ``Opened(url, stream)`` (``Record`` with ``read=True``).

        ``backend`` is a name (``"boto3"``, ``"s3torchconnector"``, ...) or None to choose by URL
        scheme; ``workers=N`` keeps N requests in flight on threads, results in order.
        """
        from .stages.open import Opener
        return self._then("open", Opener, backend, workers=workers, read=read, on_error=on_error,
                          **options)

    def fetch_batch(self, backend: str | Any = "s5cmd", *, batch_size: int = 1000,
                    to: str | None = None, delete: bool = True,
                    output: Literal["bytes", "path"] = "bytes", workers: int = 16,
                    on_error: Literal["raise", "skip"] = "raise", timeout: float | None = None,
                    options: dict[str, Any] | None = None) -> Pipeline:
        """Download URL items (or tuples of URLs) in background batches; yield Records or paths."""
        from .stages.fetch_batch import BatchFetcher
        return self._then("fetch_batch", BatchFetcher, backend, batch_size=batch_size, to=to,
                          delete=delete, output=output, workers=workers, on_error=on_error,
                          timeout=timeout, options=options)

    # ---- formats (issue: formats) -------------------------------------------------------
    def untar(self, *, on_error: Literal["raise", "skip"] = "raise") -> Pipeline:
        """Expand opened tar shards (plain/gzip/bz2/xz) into ``Record(member, bytes, url)``."""
        from .stages.untar import Untarrer
        return self._then("untar", Untarrer, on_error=on_error)

    def group_pairs(self, *, required: Sequence[str] | None = None,
                    on_incomplete: Literal["raise", "skip"] = "raise") -> Pipeline:
        """Group records sharing a key (``a/b.image.png`` -> key ``a/b``) into sample dicts."""
        from .stages.group import Grouper
        return self._then("group_pairs", Grouper, required=required, on_incomplete=on_incomplete)

    def decode(self, mode: Literal["pil", "torch", "numpy"] = "pil", *,
               handlers: dict[str, Any] | None = None,
               resize: int | tuple[int, int] | None = None, allow_pickle: bool = False,
               on_error: Literal["raise", "skip"] = "raise", workers: int = 0,
               method: Literal["thread", "process"] = "thread",
               jpeg_decoder: Literal["auto", "pil", "simplejpeg"] = "auto") -> Pipeline:
        """Decode sample fields by extension (images, cls, txt, json, npy, pt; pickle opt-in),
        inline or on ``workers`` threads/processes; ``resize`` decodes JPEGs at a reduced scale.
        ``jpeg_decoder="auto"`` is resolved here, so explain() shows the decoder in use."""
        from .formats.images import resolve_jpeg_decoder
        from .stages.decode import Decoder
        return self._then("decode", Decoder, mode, handlers=handlers, resize=resize,
                          allow_pickle=allow_pickle, on_error=on_error, workers=workers, method=method,
                          jpeg_decoder=resolve_jpeg_decoder(jpeg_decoder))

    def read_tfrecord(self, *, check_crc: bool = True, parse_example: bool = True,
                      on_error: Literal["raise", "skip"] = "raise") -> Pipeline:
        """Read opened TFRecord files; parse ``tf.train.Example`` records into dicts."""
        from .stages.tfrecord import TFRecordReader
        return self._then("read_tfrecord", TFRecordReader, check_crc=check_crc,
                          parse_example=parse_example, on_error=on_error)


    # ---- recipes support (issue: recipes) -----------------------------------------------
    def cache(self, directory: str, *, max_bytes: int, backend: Any = None, workers: int = 0,
              on_error: Literal["raise", "skip"] = "raise",
              backend_options: dict[str, Any] | None = None) -> Pipeline:
        """Read URLs through a local disk cache (LRU, shared by worker processes) into Records.

        Items are URLs; the output is ``Record(url, data, url)`` as with ``open(read=True)``.
        Misses are read with ``backend`` and kept; later epochs read from disk only.
        """
        from .stages.cache import Cacher
        return self._then("cache", Cacher, directory, max_bytes=max_bytes, backend=backend,
                          workers=workers, on_error=on_error, backend_options=backend_options)

    def equalize(self, *, total: int | None = None, per_shard: int | None = None,
                 mode: Literal["drop", "pad"] = "drop") -> Pipeline:
        """Make every rank x DataLoader worker yield the same number of items (no DDP hang).

        ``total`` is the item count before sharding (read from a ``from_items`` source when
        omitted); each shard yields ``floor(total / shards)`` (``"drop"``) or the ceiling
        (``"pad"``, short shards wrap around). ``per_shard`` sets the count directly.
        """
        from .stages.equalize import Equalizer
        return self._then("equalize", Equalizer, total=total, per_shard=per_shard, mode=mode)

    # ---- running ------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Set the epoch used to reseed shuffles on the next iteration (like DistributedSampler)."""
        self._epoch = int(epoch)

    @property
    def epoch(self) -> int:
        return self._epoch

    def __iter__(self):  # type: ignore[override]
        from .runner import PipelineIterator
        return PipelineIterator(self)

    def stats(self) -> dict[str, dict[str, int]]:
        """Counters (skips, retries, ...) of the iterations run by this process, by stage."""
        return self._stats.snapshot()

    def explain(self) -> str:
        """A text drawing of the stage graph with every stage's options."""
        lines: list[str] = []

        def walk(node: Node, prefix: str, last: bool, root: bool) -> None:
            connector = "" if root else ("└─ " if last else "├─ ")
            lines.append(prefix + connector + node.title())
            child_prefix = prefix + ("" if root else ("   " if last else "│  "))
            for i, inp in enumerate(node.inputs):
                walk(inp, child_prefix, i == len(node.inputs) - 1, False)

        walk(self._node, "", True, True)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return "Pipeline:\n" + self.explain()

    # pickling for DataLoader workers: descriptions only, never a live iterator
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_stats"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._stats = Stats()


# ---- sources and fan-in ----------------------------------------------------------------------
def from_items(items: Iterable[Any]) -> Pipeline:
    """A pipeline over the items of a collection (materialised once if not a sequence)."""
    from .stages.source import ItemSource
    source = ItemSource(items)  # validates, and materialises a generator once, here
    items = source.items
    return Pipeline(Node(ItemSource, (items,), {}, (), f"from_items({_fmt(items)})"))


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
    from .stages.mix import Mixer
    nodes = tuple(p._node for p in pipelines)
    _validate(Mixer, len(nodes), (), {"weights": weights, "seed": seed, "stop": stop})
    label = _label("mix", (), {"weights": weights, "seed": seed, "stop": stop})
    return Pipeline(Node(Mixer, (), {"weights": weights, "seed": seed, "stop": stop}, nodes, label))


def interleave(pipelines: Sequence[Pipeline], *, stop: Literal["first", "all"] = "all") -> Pipeline:
    """Round-robin over several pipelines: one item from each in turn."""
    from .stages.mix import Interleaver
    nodes = tuple(p._node for p in pipelines)
    _validate(Interleaver, len(nodes), (), {"stop": stop})
    return Pipeline(Node(Interleaver, (), {"stop": stop}, nodes, _label("interleave", (), {"stop": stop})))


# ---- formats: pipe-mode source -----------------------------------------------------------------
def tfrecord_stream(path: str, *, check_crc: bool = True, parse_example: bool = True) -> Pipeline:
    """A pipeline over one continuous stream of TFRecords (a FIFO, as SageMaker Pipe mode
    delivers it, a pipe or a file). ``path`` may contain ``{epoch}``, ``{rank}``, ``{worker}``.
    """
    from .stages.tfrecord import PerProcessTFRecordStream, TFRecordStream
    per_process = "{rank}" in str(path) or "{worker}" in str(path)
    cls = PerProcessTFRecordStream if per_process else TFRecordStream
    kwargs = {"check_crc": check_crc, "parse_example": parse_example}
    _validate(cls, 0, (path,), kwargs)
    return Pipeline(Node(cls, (path,), kwargs, (), _label("tfrecord_stream", (path,), kwargs)))


# ---- backends: listing source ------------------------------------------------------------------
def list_objects(url: str, *, pattern: str | None = None, backend: str | Any = None,
                 manifest: str | None = None, **options: Any) -> Pipeline:
    """A pipeline over the objects under ``url`` (``ObjectInfo`` items, sorted by URL).

    The store is listed once, here (or read from ``manifest``, written on first use), never
    again in each DataLoader worker. See :mod:`pipeflow.stages.listing`.
    """
    import os as _os

    from .stages.listing import ListObjects, list_now, write_manifest
    kwargs: dict[str, Any] = {"pattern": pattern, "backend": backend, "manifest": manifest,
                              "options": options}
    if manifest is None:
        kwargs["objects"] = tuple(list_now(url, pattern=pattern, backend=backend, **options))
    elif not _os.path.exists(manifest):
        write_manifest(manifest, url, pattern, list_now(url, pattern=pattern, backend=backend, **options))
    _validate(ListObjects, 0, (url,), kwargs)
    shown = {k: v for k, v in (("pattern", pattern), ("backend", backend), ("manifest", manifest)) if v}
    return Pipeline(Node(ListObjects, (url,), kwargs, (), _label("list_objects", (url,), shown)))
