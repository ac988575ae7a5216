"""``decode()``: turn the bytes fields of samples into images, tensors, numbers, text."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Literal

from ..errors import ConfigError, DecodeError
from ..formats.decoders import DecodeOptions, FieldDecodeError, Handler, Mode, decode_sample
from ..formats.images import Place
from .base import Stage
from .map import WindowedOptions, WindowedStage

__all__ = ["BatchSlots", "Decoder"]

#: blocks of a run whose slab is still being filled, at most (older ones are let go: their
#: remaining samples get memory of their own and their batch is stacked as usual)
OPEN_SLABS = 8


class _Slab:
    """One batch's worth of image memory, ``(size, *shape)``, and which slots were handed out."""

    __slots__ = ("taken", "tensor")

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor
        self.taken: set[int] = set()


class _SlabRun:
    """The slabs of one run of the stage (a restart begins a new run: a task of the previous
    one still decoding writes into slabs no batch of the new run uses)."""

    def __init__(self, size: int, made: weakref.WeakValueDictionary[int, Any]) -> None:
        self.size = size
        self._made = made
        self._lock = threading.Lock()
        self._open: dict[tuple[str, int], _Slab] = {}

    def slot(self, index: int, name: str, shape: tuple[int, ...], dtype: Any) -> Any:
        """The memory of sample ``index``'s field ``name``: slot ``index % size`` of its
        block's slab, made by the first of the block's samples to ask. None when the slab's
        shape or dtype differ (a grey image among colour ones) or the slot was handed out."""
        import torch

        block, at = divmod(index, self.size)
        key = (name, block)
        with self._lock:
            slab = self._open.get(key)
            if slab is None:
                if len(self._open) >= OPEN_SLABS:
                    del self._open[next(iter(self._open))]
                slab = self._open[key] = _Slab(torch.empty((self.size, *shape), dtype=dtype))
                self._made[id(slab.tensor)] = slab.tensor
            tensor = slab.tensor
            if tensor.shape[1:] != shape or tensor.dtype != dtype or at in slab.taken:
                return None
            slab.taken.add(at)
            if len(slab.taken) == self.size:
                del self._open[key]
        return tensor[at]


class BatchSlots:
    """Decoding straight into the batch: how ``decode(mode="torch")`` read directly by a
    ``batch(size, collate=True)`` saves the collate's copy of every image.

    Without it each decoded image is made contiguous (a copy, on the decode thread) and
    ``default_collate`` stacks the batch's images (a second copy, on the consumer's thread,
    of memory another core wrote). Here the samples are numbered in the order the stage pulls
    them, which is the order it delivers them and the batch groups them; sample ``i`` writes
    its image into slot ``i % size`` of one ``(size, C, H, W)`` tensor, and :meth:`collate`
    returns that tensor as the batch when a batch's images are exactly its slots, in order.
    Anything else (a skipped sample, a short last batch, mixed shapes, a sample that got no
    slot) is collated by ``default_collate`` as before, so the batch is always what
    ``default_collate`` returns; only the images' memory is shared with the batch, and no code
    but the collate ever sees those samples. Thread workers and inline only (process workers
    return their results through a pipe); a DataLoader worker collates as torch does there.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        #: the slabs made, by id (tensors compare by value, not identity)
        self._made: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self._run = _SlabRun(size, self._made)
        self._pulled = 0
        #: id(sample) -> (its run, its number): set when pulled, taken when its decode starts
        self._numbers: dict[int, tuple[_SlabRun, int]] = {}
        self._collate_map: dict[Any, Any] | None = None

    def restart(self) -> None:
        """A new run: numbering from 0 (the batches start anew at the position resumed)."""
        self._run = _SlabRun(self.size, self._made)
        self._pulled = 0
        self._numbers.clear()

    def number(self, sample: Any) -> tuple[bool, Any]:
        """Numbers a sample as it is pulled (the window's ``inline`` hook, in the consumer's
        thread); it still goes to the decode."""
        self._numbers[id(sample)] = (self._run, self._pulled)
        self._pulled += 1
        return False, None

    def places(self, sample: Any) -> Callable[[str], Place] | None:
        """Where the decode of ``sample`` (numbered by :meth:`number`) writes each field."""
        numbered = self._numbers.pop(id(sample), None)
        if numbered is None:
            return None
        run, index = numbered
        return functools.partial(functools.partial, run.slot, index)

    def collate(self, batch: list[Any]) -> Any:
        """``default_collate(batch)``, taking a slab as it is where its slots are the batch."""
        from torch.utils.data import get_worker_info
        from torch.utils.data._utils.collate import collate, default_collate_fn_map

        if get_worker_info() is not None:  # torch stacks into shared memory there
            return collate(batch, collate_fn_map=default_collate_fn_map)
        if self._collate_map is None:
            import torch

            self._collate_map = {**default_collate_fn_map, torch.Tensor: self._tensors}
        return collate(batch, collate_fn_map=self._collate_map)

    def _tensors(self, batch: list[Any], *, collate_fn_map: Any = None) -> Any:
        from torch.utils.data._utils.collate import collate_tensor_fn

        slab = batch[0]._base
        if slab is not None and self._made.get(id(slab)) is slab and _fills(slab, batch):
            return slab
        return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)


def _fills(slab: Any, batch: list[Any]) -> bool:
    """True when ``batch`` is every slot of ``slab``, in order (so stacking it copies the slab)."""
    if slab.dim() == 0 or len(batch) != slab.shape[0]:
        return False
    step, first, shape = slab.stride(0) * slab.element_size(), slab.data_ptr(), slab.shape[1:]
    return all(t._base is slab and t.data_ptr() == first + i * step and t.shape == shape
               and t.is_contiguous() for i, t in enumerate(batch))


class _DecodeFn:
    """Decodes one sample; picklable, so it also runs on process workers."""

    def __init__(self, options: DecodeOptions) -> None:
        self.options = options
        self.stage = "decode"
        #: set only for thread workers or inline (never pickled to a process)
        self.slots: BatchSlots | None = None

    def __call__(self, sample: Any) -> dict[str, Any]:
        if not isinstance(sample, Mapping):
            raise ConfigError(f"decode() needs sample dicts (add group_pairs() before it), "
                              f"got {type(sample).__name__}")
        slots = self.slots
        try:
            return decode_sample(sample, self.options,
                                 place=slots.places(sample) if slots is not None else None)
        except FieldDecodeError as exc:
            raise DecodeError(f"cannot decode field {exc.field_name!r} of "
                              f"{sample.get('__url__', '?')}: {exc.args[1]}",
                              stage=self.stage, key=str(sample.get("__key__", ""))) from exc.cause


class Decoder(WindowedStage):
    """Decodes every ``bytes`` field of each sample dict by its extension.

    See :mod:`pipeflow.formats.decoders` for the table: images become PIL images, ``uint8``
    CHW tensors or ``uint8`` HWC arrays (``mode``); ``cls`` an int, ``txt`` a str, ``json``
    the parsed object, ``npy`` an array, ``pt`` ``torch.load(weights_only=True)``; unknown
    extensions stay bytes. ``__key__``/``__url__`` and non-bytes values pass through.
    Decoding is CPU-bound: ``workers=N`` decodes N samples at once on threads (PIL releases
    the GIL while decoding) or processes, through the same executor as ``map``.

    Args:
        source: the input stage (yielding sample dicts, e.g. from ``group_pairs()``).
        mode: ``"pil"``, ``"torch"`` or ``"numpy"``.
        handlers: extension or field name -> callable ``bytes -> value`` or the name of a
            built-in decoder (``"image"``, ``"cls"``, ``"txt"``, ``"json"``, ``"npy"``,
            ``"pt"``, ``"bytes"``); overrides the defaults.
        resize: ``None``, an int or ``(height, width)``: JPEGs are decoded at the smallest DCT
            scale that covers the size, then images are resized (antialiased bilinear).
        jpeg_decoder: ``"auto"`` (the fastest installed), ``"pil"`` or ``"simplejpeg"``
            (the ``fast-decode`` extra); see :mod:`pipeflow.formats.images`.
        allow_pickle: decode ``pickle``/``pkl``/``pyd`` fields. Off by default because
            unpickling untrusted data runs arbitrary code; such fields raise otherwise.
        on_error: ``"raise"`` :class:`~pipeflow.errors.DecodeError` naming the sample key
            and field, or ``"skip"`` the sample and count it as ``skipped``.
        workers: samples decoded concurrently (0: inline; ``"auto"``, the default: tuned while
            running, up to the cores this process may use).
        method: ``"thread"`` or ``"process"``.
    """

    def __init__(self, source: Stage[Any], mode: Mode = "pil", *,
                 handlers: Mapping[str, Handler | str] | None = None,
                 resize: int | tuple[int, int] | None = None, allow_pickle: bool = False,
                 on_error: Literal["raise", "skip"] = "raise", workers: int | str = "auto",
                 method: Literal["thread", "process"] = "thread",
                 jpeg_decoder: Literal["auto", "pil", "simplejpeg"] = "auto") -> None:
        self.options = DecodeOptions(mode=mode, handlers=handlers or {}, resize=resize,
                                     allow_pickle=allow_pickle, jpeg_decoder=jpeg_decoder)
        self._decode_fn = _DecodeFn(self.options)
        self._numbering: BatchSlots | None = None  # set by the batch reading this stage
        # only undecodable data is skippable; a pipeline wired wrongly always raises
        super().__init__(source, self._decode_fn, WindowedOptions(
            what="decode", workers=workers, method=method, on_error=on_error,
            skippable=lambda exc: not isinstance(exc, ConfigError), kind="cpu",
            inline=self._number if method == "thread" and mode == "torch" else None))
        self.on_error = on_error

    def _number(self, sample: Any) -> tuple[bool, Any]:
        slots = self._numbering
        return slots.number(sample) if slots is not None else (False, None)

    def collate_into_batches(self, size: int) -> Callable[[list[Any]], Any] | None:
        """Called by a ``batch(size, collate=True)`` that reads this stage directly: the
        collate that takes the images decoded into the batch's memory (:class:`BatchSlots`),
        or None where images cannot be (PIL or numpy results, process workers)."""
        if self.window_options.inline is None:
            return None
        slots = self._numbering = self._decode_fn.slots = BatchSlots(size)
        return slots.collate

    def start(self, state: dict[str, Any] | None) -> None:
        self._decode_fn.stage = self.name
        if self._numbering is not None:
            self._numbering.restart()
        super().start(state)

