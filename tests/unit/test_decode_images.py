"""Image decoding at the training size: DCT-scaled JPEG decodes, decoder choice and parity."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
import torch
from PIL import Image, ImageFilter

import pipeflow as pf
from pipeflow.errors import DISTRIBUTION, ConfigError, DecodeError, MissingDependencyError
from pipeflow.formats import images
from pipeflow.formats.images import RESIZE_TOLERANCE, decode_image, draft_size

simplejpeg = pytest.importorskip("simplejpeg")


def photo(w: int, h: int, *, mode: str = "RGB", seed: int = 0, quality: int = 90) -> bytes:
    """A JPEG that compresses like a photo: smooth shapes plus fine texture."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 255, (h // 32 + 1, w // 32 + 1, 3), dtype=np.uint8)
    base = np.asarray(Image.fromarray(small).resize((w, h), Image.Resampling.BICUBIC), dtype=np.int16)
    noisy = np.clip(base + rng.integers(-12, 12, (h, w, 3)), 0, 255).astype(np.uint8)
    img = Image.fromarray(noisy).filter(ImageFilter.SMOOTH).convert(mode)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


@pytest.mark.parametrize(("size", "target", "expected"), [
    ((1024, 768), (224, 224), (512, 384)),   # 1/4 would be 256x192, too short
    ((2048, 1536), (192, 256), (256, 192)),
    ((500, 375), (224, 224), (500, 375)),    # no scale covers it: full size
    ((1001, 1001), (250, 250), (251, 251)),  # 1001 >= 4 * 250: libjpeg rounds 1001/4 up
    ((999, 999), (250, 250), (500, 500)),    # 999 < 4 * 250: only 1/2
])
def test_draft_size_is_the_smallest_scale_that_covers_the_target(size, target, expected):
    assert draft_size(*size, target) == expected


@pytest.mark.parametrize("size", [(1024, 768), (500, 375), (2048, 1536), (333, 517)])
@pytest.mark.parametrize("target", [(224, 224), (120, 200)])
@pytest.mark.parametrize("mode", ["torch", "numpy"])
def test_decoders_agree_within_the_documented_tolerance(size, target, mode):
    data = photo(*size, seed=size[0])
    fast = decode_image(data, mode=mode, resize=target, jpeg_decoder="simplejpeg")
    slow = decode_image(data, mode=mode, resize=target, jpeg_decoder="pil")
    fast, slow = torch.as_tensor(fast).int(), torch.as_tensor(slow).int()
    assert fast.shape == slow.shape
    assert fast.shape == ((3, *target) if mode == "torch" else (*target, 3))
    diff = (fast - slow).abs()
    assert diff.max().item() <= RESIZE_TOLERANCE, diff.max()
    assert diff.float().mean().item() < 0.5


@pytest.mark.parametrize("jpeg_mode", ["RGB", "L"])
@pytest.mark.parametrize("mode", ["torch", "numpy"])
def test_without_resize_every_decoder_returns_pillows_pixels(jpeg_mode, mode):
    data = photo(321, 203, mode=jpeg_mode)
    expected = np.array(Image.open(io.BytesIO(data)))
    if expected.ndim == 2:
        expected = expected[:, :, None]
    for decoder in ("pil", "simplejpeg"):
        out = decode_image(data, mode=mode, resize=None, jpeg_decoder=decoder)
        got = out.permute(1, 2, 0).numpy() if mode == "torch" else out
        assert got.dtype == np.uint8 and np.array_equal(got, expected), decoder
        if mode == "torch":
            assert out.is_contiguous()


def test_resize_decodes_at_the_reduced_scale():
    data = photo(1024, 768)
    out = decode_image(data, mode="numpy", resize=(224, 224), jpeg_decoder="pil")
    with Image.open(io.BytesIO(data)) as img:
        full = np.array(img.resize((224, 224), Image.Resampling.BILINEAR))
    with Image.open(io.BytesIO(data)) as img:
        img.draft("RGB", (224, 224))
        assert img.size == (512, 384)
        scaled = np.array(img.convert("RGB").resize((224, 224), Image.Resampling.BILINEAR))
    assert np.array_equal(out, scaled)
    assert not np.array_equal(out, full)  # the full decode is a different (slower) path
    sj = decode_image(data, mode="numpy", resize=(224, 224), jpeg_decoder="simplejpeg")
    assert np.abs(sj.astype(int) - full.astype(int)).mean() < 2  # still the same picture


def test_cmyk_and_broken_jpegs_fall_back_to_pil():
    cmyk = photo(64, 48, mode="CMYK")
    for decoder in ("pil", "simplejpeg"):
        out = decode_image(cmyk, mode="torch", resize=(16, 16), jpeg_decoder=decoder)
        assert tuple(out.shape) == (3, 16, 16)
    broken = photo(64, 48)[:200]
    pipe = pf.from_items([{"__key__": "b", "x.jpg": broken}]).decode("torch", jpeg_decoder="simplejpeg")
    with pytest.raises(DecodeError, match="x.jpg"):
        list(pipe)


def test_explain_shows_the_decoder_in_use():
    assert "jpeg_decoder='simplejpeg'" in pf.from_items([]).decode("torch", resize=224).explain()
    assert "jpeg_decoder='pil'" in pf.from_items([]).decode(jpeg_decoder="pil").explain()
    with pytest.raises(ConfigError, match="jpeg_decoder"):
        pf.from_items([]).decode(jpeg_decoder="cv2")


def test_auto_falls_back_to_pil_and_an_explicit_missing_decoder_names_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "simplejpeg", None)
    images._simplejpeg.cache_clear()
    try:
        assert "jpeg_decoder='pil'" in pf.from_items([]).decode("torch").explain()
        with pytest.raises(MissingDependencyError, match=re.escape(f"'{DISTRIBUTION}[fast-decode]'")):
            pf.from_items([]).decode(jpeg_decoder="simplejpeg")
    finally:
        images._simplejpeg.cache_clear()


@pytest.mark.parametrize("method", ["thread", "process"])
def test_decode_stage_resizes_in_parallel_like_inline(method):
    samples = [{"__key__": f"s{i}", "x.jpg": photo(400, 300, seed=i)} for i in range(6)]
    inline = list(pf.from_items(samples).decode("torch", resize=(64, 96)))
    parallel = list(pf.from_items(samples).decode("torch", resize=(64, 96), workers=2, method=method))
    assert [tuple(s["x.jpg"].shape) for s in inline] == [(3, 64, 96)] * 6
    assert all(torch.equal(a["x.jpg"], b["x.jpg"]) for a, b in zip(inline, parallel))
