"""Decoding sample fields by extension.

=================================  ==================================================
extension (last part of the field)  result
=================================  ==================================================
``png jpg jpeg ppm pgm pbm bmp``    image: ``PIL.Image`` (mode ``"pil"``), ``uint8``
 ``gif tif tiff webp``              tensor CHW (``"torch"``) or ``uint8`` array HWC
                                    (``"numpy"``); optionally resized at the decoder
                                    (:mod:`pipeflow.formats.images`)
``cls cls2 index``                  ``int``
``txt text``                        ``str`` (UTF-8)
``json jsn``                        the parsed object
``npy``                             ``numpy.ndarray`` (``allow_pickle=False``)
``pt pth``                          ``torch.load(weights_only=True)``
``pickle pkl pyd``                  unpickled object, only with ``allow_pickle=True``
anything else                       the raw ``bytes``
=================================  ==================================================

The extension is the part of the field after its last dot (``image.png`` -> ``png``); a field
without a dot is its own extension (``cls``). ``handlers`` maps an extension (or a whole field
name) to a callable ``bytes -> value`` or to the name of a built-in decoder (``"image"``,
``"cls"``, ``"txt"``, ``"json"``, ``"npy"``, ``"pt"``, ``"bytes"``), which is how fields named
without an extension (``image``, ``label``) get decoded.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .._checks import check_bool, is_int
from ..errors import ConfigError
from .images import decode_image, resolve_jpeg_decoder

__all__ = ["BUILTIN_DECODERS", "DecodeOptions", "decode_sample", "decode_value", "extension_of"]

Mode = Literal["pil", "torch", "numpy"]
Handler = Callable[[bytes], Any]

IMAGE_EXTENSIONS = frozenset(
    {"png", "jpg", "jpeg", "ppm", "pgm", "pbm", "pnm", "bmp", "gif", "tif", "tiff", "webp"})
PICKLE_EXTENSIONS = frozenset({"pickle", "pkl", "pyd"})


def _cls(data: bytes) -> int:
    return int(data.decode("ascii").strip())


def _txt(data: bytes) -> str:
    return data.decode("utf-8")


def _json(data: bytes) -> Any:
    return json.loads(data)


def _npy(data: bytes) -> Any:
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=False)


def _pt(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


def _pickle(data: bytes) -> Any:
    import pickle

    return pickle.loads(data)  # noqa: S301 - only reachable with allow_pickle=True


def _raw(data: bytes) -> bytes:
    return data


_SIMPLE: dict[str, Handler] = {
    "cls": _cls, "cls2": _cls, "index": _cls, "txt": _txt, "text": _txt, "json": _json,
    "jsn": _json, "npy": _npy, "pt": _pt, "pth": _pt,
}

#: built-in decoders by name, for ``handlers={"image": "image", "label": "cls"}``
BUILTIN_DECODERS: tuple[str, ...] = ("image", "cls", "txt", "json", "npy", "pt", "pickle", "bytes")


@dataclass(frozen=True)
class DecodeOptions:
    """Validated options of :func:`decode_sample`.

    Attributes:
        mode: ``"pil"``, ``"torch"`` (uint8 CHW tensor) or ``"numpy"`` (uint8 HWC array).
        handlers: extension or field name -> callable or built-in decoder name.
        resize: ``None``, an int (square) or ``(height, width)``; JPEGs are decoded at the
            smallest DCT scale covering it, then images are resized (antialiased bilinear).
        jpeg_decoder: ``"auto"``, ``"pil"`` or ``"simplejpeg"`` (see
            :mod:`pipeflow.formats.images`); ``"auto"`` is resolved here to the installed one.
        allow_pickle: allow ``pickle``/``pkl``/``pyd`` fields (never on by default: unpickling
            runs arbitrary code).
    """

    mode: Mode = "pil"
    handlers: Mapping[str, Handler | str] = field(default_factory=dict)
    resize: int | tuple[int, int] | None = None
    allow_pickle: bool = False
    jpeg_decoder: str = "auto"

    def __post_init__(self) -> None:
        if self.mode not in ("pil", "torch", "numpy"):
            raise ConfigError(f"decode mode must be 'pil', 'torch' or 'numpy', got {self.mode!r}")
        if not isinstance(self.handlers, Mapping):
            raise ConfigError(f"handlers must be a mapping of extension -> callable, got "
                              f"{type(self.handlers).__name__}")
        for ext, handler in self.handlers.items():
            if not isinstance(ext, str) or not ext:
                raise ConfigError(f"handler keys must be non-empty extension strings, got {ext!r}")
            if isinstance(handler, str):
                if handler not in BUILTIN_DECODERS:
                    raise ConfigError(f"unknown built-in decoder {handler!r} for {ext!r}; "
                                      f"choose from {', '.join(BUILTIN_DECODERS)}")
                if handler == "pickle" and not self.allow_pickle:
                    raise ConfigError("the 'pickle' decoder needs allow_pickle=True")
            elif not callable(handler):
                raise ConfigError(f"handler for {ext!r} must be callable or a decoder name, "
                                  f"got {type(handler).__name__}")
        if self.resize is not None:
            size = self.resize
            if is_int(size):
                size = (size, size)
            if (not isinstance(size, (tuple, list)) or len(size) != 2
                    or not all(is_int(s) and s > 0 for s in size)):
                raise ConfigError(f"resize must be a positive int or (height, width), got "
                                  f"{self.resize!r}")
            object.__setattr__(self, "resize", (int(size[0]), int(size[1])))
        check_bool(self.allow_pickle, "allow_pickle")
        object.__setattr__(self, "handlers", dict(self.handlers))
        object.__setattr__(self, "jpeg_decoder", resolve_jpeg_decoder(self.jpeg_decoder))


def extension_of(field_name: str) -> str:
    """``"image.png"`` -> ``"png"``; ``"cls"`` -> ``"cls"``; lower-cased."""
    return field_name.rsplit(".", 1)[-1].lower()


def _image(data: bytes, options: DecodeOptions) -> Any:
    return decode_image(data, mode=options.mode, resize=options.resize,  # type: ignore[arg-type]
                        jpeg_decoder=options.jpeg_decoder)


def _builtin(name: str, options: DecodeOptions) -> Handler:
    if name == "image":
        return lambda data: _image(data, options)
    if name == "bytes":
        return _raw
    if name == "pickle":
        return _pickle
    return _SIMPLE[name]


def decode_value(field_name: str, data: bytes, options: DecodeOptions) -> Any:
    """Decode one field's bytes according to its extension (see the module table).

    Raises whatever the underlying decoder raises; :func:`decode_sample` wraps it.

    Raises:
        PermissionError: a pickle field without ``allow_pickle=True``.
    """
    ext = extension_of(field_name)
    handler = options.handlers.get(field_name.lower(), options.handlers.get(ext))
    if handler is not None:
        if isinstance(handler, str):
            return _builtin(handler, options)(data)
        return handler(data)
    if ext in IMAGE_EXTENSIONS:
        return _image(data, options)
    simple = _SIMPLE.get(ext)
    if simple is not None:
        return simple(data)
    if ext in PICKLE_EXTENSIONS:
        if not options.allow_pickle:
            raise PermissionError(f"refusing to unpickle field {field_name!r}: pickle can run "
                                  "arbitrary code; pass allow_pickle=True to decode it")
        return _pickle(data)
    return data


def decode_sample(sample: Mapping[str, Any], options: DecodeOptions) -> dict[str, Any]:
    """Decode every ``bytes`` field of a sample dict; ``__key__``-style fields pass through.

    Raises:
        FieldDecodeError: carrying the field name and the original exception as ``__cause__``.
    """
    out: dict[str, Any] = {}
    for name, value in sample.items():
        if name.startswith("__") or not isinstance(value, (bytes, bytearray, memoryview)):
            out[name] = value
            continue
        try:
            out[name] = decode_value(name, bytes(value), options)
        except Exception as exc:  # noqa: BLE001 - re-raised typed by the stage
            raise FieldDecodeError(name, exc) from exc
    return out


class FieldDecodeError(Exception):
    """Internal: which field failed; the Decoder stage turns it into a DecodeError."""

    def __init__(self, field_name: str, cause: BaseException) -> None:
        super().__init__(field_name, f"{type(cause).__name__}: {cause}")
        self.field_name = field_name
        self.cause = cause
