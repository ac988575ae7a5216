"""The decode() stage and the decoder table."""

from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

import pipeflow as pf
from pipeflow.errors import ConfigError, DecodeError
from pipeflow.stages.decode import Decoder
from pipeflow.stages.source import ItemSource


def png(w=6, h=4, mode="RGB", fmt="PNG") -> bytes:
    img = Image.new(mode, (w, h))
    img.putpixel((1, 2), (10, 20, 30) if mode == "RGB" else 200)
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def npy(arr) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def pt(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


SAMPLE = {"__key__": "k", "__url__": "u", "image.png": png(), "cls": b" 3\n", "txt": "héllo".encode(),
          "json": json.dumps({"a": [1, 2]}).encode(), "npy": npy(np.arange(6).reshape(2, 3)),
          "pt": pt({"w": torch.ones(2)}), "weird.bin": b"\x00\x01", "meta": [1, 2]}


def decode(sample, mode="pil", **kw):
    return list(Decoder(ItemSource([sample]), mode, **kw))[0]


def test_table_in_pil_mode():
    out = decode(SAMPLE)
    assert out["__key__"] == "k" and out["__url__"] == "u"
    assert isinstance(out["image.png"], Image.Image) and out["image.png"].size == (6, 4)
    assert out["cls"] == 3 and out["txt"] == "héllo" and out["json"] == {"a": [1, 2]}
    assert np.array_equal(out["npy"], np.arange(6).reshape(2, 3))
    assert torch.equal(out["pt"]["w"], torch.ones(2))
    assert out["weird.bin"] == b"\x00\x01" and out["meta"] == [1, 2]


def test_torch_and_numpy_images():
    t = decode(SAMPLE, "torch")["image.png"]
    assert t.dtype == torch.uint8 and tuple(t.shape) == (3, 4, 6)
    assert t[:, 2, 1].tolist() == [10, 20, 30]
    a = decode(SAMPLE, "numpy")["image.png"]
    assert a.dtype == np.uint8 and a.shape == (4, 6, 3) and a[2, 1].tolist() == [10, 20, 30]
    gray = decode({"__key__": "g", "x.jpg": png(mode="L", fmt="JPEG")}, "torch")["x.jpg"]
    assert tuple(gray.shape) == (1, 4, 6)
    pal = decode({"__key__": "p", "x.bmp": png(mode="P", fmt="BMP")}, "numpy")["x.bmp"]
    assert pal.shape == (4, 6, 3)


def test_resize_is_height_width():
    assert tuple(decode(SAMPLE, "torch", resize=(5, 7))["image.png"].shape) == (3, 5, 7)
    assert decode(SAMPLE, "pil", resize=8)["image.png"].size == (8, 8)


def test_handlers_by_extension_field_and_builtin_name():
    sample = {"__key__": "k", "image": png(), "label": b"4", "x.png": b"raw"}
    out = decode(sample, "numpy", handlers={"image": "image", "label": "cls", "png": lambda b: b.upper()})
    assert out["image"].shape == (4, 6, 3) and out["label"] == 4 and out["x.png"] == b"RAW"


def test_pickle_is_opt_in():
    sample = {"__key__": "k", "obj.pyd": pickle.dumps({"x": 1})}
    with pytest.raises(DecodeError, match="allow_pickle"):
        decode(sample)
    assert decode(sample, allow_pickle=True)["obj.pyd"] == {"x": 1}
    with pytest.raises(ConfigError):
        pf.from_items([]).decode(handlers={"obj": "pickle"})


def test_pt_refuses_arbitrary_objects():
    import fractions

    with pytest.raises(DecodeError) as err:
        decode({"__key__": "k", "x.pt": pt(fractions.Fraction(1, 3))})
    assert err.value.key == "k"


def test_errors_name_key_and_field_and_skip_counts():
    bad = {"__key__": "broken/7", "__url__": "s3://b/s.tar", "image.png": b"not a png", "cls": b"1"}
    with pytest.raises(DecodeError) as err:
        decode(bad)
    assert err.value.key == "broken/7" and "image.png" in str(err.value)
    assert "field 'image.png' of s3://b/s.tar: " in str(err.value)
    with pytest.raises(DecodeError) as err:          # a sample made in memory: no URL to name
        decode({k: v for k, v in bad.items() if k != "__url__"})
    assert str(err.value).startswith("cannot decode field 'image.png': ") and " ?" not in str(err.value)
    pipe = pf.from_items([bad, SAMPLE, {**bad, "image.png": png(), "cls": b"x"}]).decode(on_error="skip")
    assert [s["__key__"] for s in pipe] == ["k"]
    counts = pipe.stats().counters("decode")
    assert counts == {"skipped": 2}


@pytest.mark.parametrize("kwargs", [{"mode": "cv2"}, {"resize": (0, 3)}, {"resize": "224"},
                                    {"handlers": {"png": 3}}, {"handlers": {"png": "nope"}},
                                    {"on_error": "ignore"}, {"allow_pickle": "yes"}, {"handlers": [1]}])
def test_bad_options_fail_when_the_pipeline_is_written(kwargs):
    with pytest.raises(ConfigError):
        pf.from_items([]).decode(**kwargs)


def test_non_dict_items_are_a_config_error():
    with pytest.raises(ConfigError, match="group_pairs"):
        list(Decoder(ItemSource([b"bytes"])))
