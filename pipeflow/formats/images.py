"""Image decoding: PIL for every format, an optional faster JPEG decoder, resizing at the decoder.

Two JPEG decoders are supported; both wrap libjpeg-turbo:

* ``"pil"``: Pillow, always installed, the fallback for every format and every case the fast
  decoder does not handle (CMYK JPEGs, data it rejects).
* ``"simplejpeg"``: ``pip install -e '.[fast-decode]'``. Decodes straight into the
  ``uint8`` array that becomes the result, so a ``torch``/``numpy`` result costs no extra copy.

``"auto"`` (the default) picks ``simplejpeg`` when it is importable, else ``"pil"``.
(``torchvision.io.decode_jpeg`` is not offered: its CPU builds are tied to one torch build.)

With ``resize=(h, w)`` a JPEG is decoded at the smallest DCT scale (1/2, 1/4 or 1/8) whose
result still covers ``h x w`` (PIL's ``Image.draft``; libjpeg's scaled IDCT), then resized
with an antialiased bilinear filter: PIL's ``BILINEAR`` for the ``"pil"`` decoder and for
``mode="pil"``, ``torch.nn.functional.interpolate(antialias=True)`` for the fast decoder. Both
decoders pick the same scale and produce the same scaled pixels; the two resize filters differ
by rounding only: at most :data:`RESIZE_TOLERANCE` per channel value (measured: 1), mean
below 0.5 (measured: 0.16).
Without ``resize`` every decoder returns exactly Pillow's pixels.
"""

from __future__ import annotations

import io
import math
from functools import cache
from typing import Any

from ..errors import ConfigError, MissingDependencyError

__all__ = ["JPEG_DECODERS", "RESIZE_TOLERANCE", "decode_image", "draft_size",
           "resolve_jpeg_decoder"]

#: names accepted by ``decode(jpeg_decoder=...)``
JPEG_DECODERS: tuple[str, ...] = ("auto", "pil", "simplejpeg")

#: largest per-value difference between decoders' resized results (see the module docstring)
RESIZE_TOLERANCE = 2

_JPEG_MAGIC = b"\xff\xd8\xff"
_PIL_KEEP_MODES = ("1", "L", "RGB", "RGBA", "I", "F", "I;16")


@cache
def _simplejpeg() -> Any:
    try:
        import simplejpeg
    except ImportError:
        return None
    return simplejpeg


def resolve_jpeg_decoder(name: str) -> str:
    """``"auto"`` -> the fastest installed decoder; an explicit name must be installed.

    Raises:
        ConfigError: an unknown name.
        MissingDependencyError: ``"simplejpeg"`` asked for but not installed.
    """
    if name not in JPEG_DECODERS:
        raise ConfigError(f"decode(jpeg_decoder=...) must be one of {', '.join(map(repr, JPEG_DECODERS))}, "
                          f"got {name!r}")
    if name == "auto":
        return "simplejpeg" if _simplejpeg() is not None else "pil"
    if name == "simplejpeg" and _simplejpeg() is None:
        raise MissingDependencyError("simplejpeg", "fast-decode")
    return name


def draft_size(width: int, height: int, target: tuple[int, int]) -> tuple[int, int]:
    """The ``(width, height)`` of the smallest 1/1, 1/2, 1/4 or 1/8 DCT-scaled decode that
    covers ``target = (height, width)``: the scale Pillow's ``Image.draft`` picks."""
    th, tw = target
    for denom in (8, 4, 2):
        if width >= denom * tw and height >= denom * th:
            return math.ceil(width / denom), math.ceil(height / denom)
    return width, height


def decode_image(data: bytes, *, mode: str, resize: tuple[int, int] | None,
                 jpeg_decoder: str = "pil") -> Any:
    """Decode image bytes to a PIL image, a ``uint8`` CHW tensor or a ``uint8`` HWC array.

    ``jpeg_decoder`` is a resolved name (see :func:`resolve_jpeg_decoder`).
    """
    if jpeg_decoder == "simplejpeg" and mode != "pil" and data[:3] == _JPEG_MAGIC:
        array = _simplejpeg_array(data, resize)
        if array is not None:
            return _to_mode(array, mode, resize)
    return _pil_image(data, mode, resize)


def _simplejpeg_array(data: bytes, resize: tuple[int, int] | None) -> Any:
    """An HWC uint8 array at the draft scale, or None where PIL must decide (CMYK, errors)."""
    sj = _simplejpeg()
    try:
        height, width, colorspace, _ = sj.decode_jpeg_header(data)
        if colorspace not in ("Gray", "YCbCr", "RGB"):
            return None
        min_w, min_h = draft_size(width, height, resize) if resize else (0, 0)
        # islow IDCT and fancy upsampling: the settings Pillow uses, so pixels match exactly
        return sj.decode_jpeg(data, colorspace="GRAY" if colorspace == "Gray" else "RGB",
                              fastdct=False, fastupsample=False, min_height=min_h, min_width=min_w)
    except ValueError:
        return None  # PIL gives the error (or decodes what libjpeg only warns about)


def _to_mode(array: Any, mode: str, resize: tuple[int, int] | None) -> Any:
    import torch

    hwc = torch.from_numpy(array)  # shares the decoder's buffer: no copy
    if resize is not None and tuple(hwc.shape[:2]) != tuple(resize):
        nchw = hwc.permute(2, 0, 1).unsqueeze(0)
        out = torch.nn.functional.interpolate(nchw, size=resize, mode="bilinear",
                                              antialias=True, align_corners=False)[0]
        if mode == "numpy":
            return out.permute(1, 2, 0).contiguous().numpy()
        return out.contiguous()
    if mode == "numpy":
        return array
    return hwc.permute(2, 0, 1).contiguous()


def _rgb_mode(img: Any) -> str:
    return "RGBA" if "A" in img.getbands() or "transparency" in img.info else "RGB"


def _pil_image(data: bytes, mode: str, resize: tuple[int, int] | None) -> Any:
    from PIL import Image

    img: Image.Image  # an ImageFile until converted
    with Image.open(io.BytesIO(data)) as img:
        if resize is not None and img.format == "JPEG":
            img.draft(img.mode, (resize[1], resize[0]))
        img.load()
        if resize is not None:
            height, width = resize
            if img.mode not in _PIL_KEEP_MODES:
                img = img.convert(_rgb_mode(img))
            img = img.resize((width, height), Image.Resampling.BILINEAR)
        if mode == "pil":
            return img.copy() if resize is None else img
        # uint8 arrays: keep L/RGB/RGBA, convert everything else (palette, CMYK, 16-bit...)
        if img.mode not in ("L", "RGB", "RGBA"):
            img = img.convert(_rgb_mode(img))
        import numpy as np

        array = np.array(img, dtype=np.uint8)  # writable, owned by the result
    if array.ndim == 2:
        array = array[:, :, None]
    if mode == "numpy":
        return array
    import torch

    return torch.from_numpy(array).permute(2, 0, 1).contiguous()
