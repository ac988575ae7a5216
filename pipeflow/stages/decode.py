"""``decode()``: turn the bytes fields of samples into images, tensors, numbers, text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from ..errors import ConfigError, DecodeError
from ..formats.decoders import DecodeOptions, FieldDecodeError, Handler, Mode, decode_sample
from .base import Stage
from .map import WindowedOptions, WindowedStage

__all__ = ["Decoder"]


class _DecodeFn:
    """Decodes one sample; picklable, so it also runs on process workers."""

    def __init__(self, options: DecodeOptions) -> None:
        self.options = options
        self.stage = "decode"

    def __call__(self, sample: Any) -> dict[str, Any]:
        if not isinstance(sample, Mapping):
            raise ConfigError(f"decode() needs sample dicts (add group_pairs() before it), "
                              f"got {type(sample).__name__}")
        try:
            return decode_sample(sample, self.options)
        except FieldDecodeError as exc:
            url = sample.get("__url__")  # samples made in memory have none
            where = f" of {url}" if url else ""
            raise DecodeError(f"cannot decode field {exc.field_name!r}{where}: {exc.args[1]}",
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
        # only undecodable data is skippable; a pipeline wired wrongly always raises
        super().__init__(source, self._decode_fn, WindowedOptions(
            what="decode", workers=workers, method=method, on_error=on_error,
            skippable=lambda exc: not isinstance(exc, ConfigError), kind="cpu"))
        self.on_error = on_error

    def start(self, state: dict[str, Any] | None) -> None:
        self._decode_fn.stage = self.name
        super().start(state)

