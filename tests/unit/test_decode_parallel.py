"""decode() on the executor: threads and processes give the inline result, in order."""

import io

import numpy as np
import pytest
from PIL import Image

import pipeflow as pf
from pipeflow.errors import DecodeError


def _png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


SAMPLES = [{"__key__": f"s{i}", "image.png": _png(i), "cls": str(i).encode()} for i in range(12)]


@pytest.mark.parametrize("method", ["thread", "process"])
def test_parallel_decode_matches_inline(method):
    inline = list(pf.from_items(SAMPLES).decode("numpy"))
    parallel = list(pf.from_items(SAMPLES).decode("numpy", workers=2, method=method))
    assert [s["__key__"] for s in parallel] == [s["__key__"] for s in inline]
    for a, b in zip(inline, parallel):
        assert np.array_equal(a["image.png"], b["image.png"]) and a["cls"] == b["cls"]


def test_parallel_decode_errors_name_the_key_and_can_be_skipped():
    bad = SAMPLES[:3] + [{"__key__": "broken", "image.png": b"not a png"}] + SAMPLES[3:5]
    with pytest.raises(DecodeError, match="image.png") as info:
        list(pf.from_items(bad).decode("numpy", workers=2))
    assert info.value.key == "broken"
    pipe = pf.from_items(bad).decode("numpy", workers=2, on_error="skip")
    assert [s["__key__"] for s in pipe] == ["s0", "s1", "s2", "s3", "s4"]
    assert any(c.get("skipped") == 1 for c in pipe.stats().values())
