"""TFRecord framing, CRC32C, tf.train.Example, and the read_tfrecord / tfrecord_stream stages."""

from __future__ import annotations

import io
import os
import struct
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeflow as pf
from pipeflow.errors import ConfigError, CorruptDataError
from pipeflow.formats import crc32c as crcmod
from pipeflow.formats.example import ExampleFormatError, decode_example, encode_example
from pipeflow.formats.tfrecord import TFRecordWriter, iter_tfrecords, write_tfrecords
from pipeflow.items import Opened, Record
from pipeflow.pipeline import tfrecord_stream
from pipeflow.stages.read_tfrecord import TFRecordReader
from pipeflow.stages.source import ItemSource

from ._formats_helpers import OneWay, take


def test_crc32c_known_values_and_implementations_agree():
    assert crcmod.crc32c_pure(b"123456789") == 0xE3069283
    assert crcmod.crc32c(b"123456789") == 0xE3069283
    assert crcmod.crc32c(b"") == 0
    for n in (1, 100, 4095, 4096, 4097, 70000, 600001):
        data = os.urandom(n)
        assert crcmod._crc32c_numpy(data) == crcmod.crc32c_pure(data) == crcmod.crc32c(data)


# A record written by TensorFlow 2.x: tf.io.TFRecordWriter with one tf.train.Example
# {"label": int64_list [7], "name": bytes_list [b"cat"], "score": float_list [0.5]}.
def _tf_reference_example() -> bytes:
    # hand-assembled protobuf, field by field, independent of encode_example
    def ld(n, b):
        return bytes([n << 3 | 2, len(b)]) + b
    label = ld(1, b"label") + ld(2, ld(3, ld(1, b"\x07")))
    name = ld(1, b"name") + ld(2, ld(1, ld(1, b"cat")))
    score = ld(1, b"score") + ld(2, ld(2, ld(1, struct.pack("<f", 0.5))))
    return ld(1, ld(1, label) + ld(1, name) + ld(1, score))


def test_decode_hand_assembled_example():
    out = decode_example(_tf_reference_example())
    assert out["name"] == [b"cat"]
    assert out["label"].dtype == np.int64 and out["label"].tolist() == [7]
    assert out["score"].dtype == np.float32 and out["score"].tolist() == [0.5]
    assert encode_example({"label": 7, "name": b"cat", "score": 0.5}) == _tf_reference_example()


def test_unpacked_scalars_negative_ints_and_unknown_fields():
    def ld(n, b):
        return bytes([n << 3 | 2, len(b)]) + b
    ints = ld(3, bytes([1 << 3 | 0, 5]) + bytes([1 << 3 | 0]) + b"\xff" * 9 + b"\x01")  # 5, -1
    f32 = bytes([1 << 3 | 5])
    floats = ld(2, f32 + struct.pack("<f", 1.5) + f32 + struct.pack("<f", 2.0))
    unknown = bytes([9 << 3 | 0, 1])
    msg = ld(1, ld(1, ld(1, b"i") + ld(2, ints)) + ld(1, ld(1, b"f") + ld(2, floats)) + unknown)
    out = decode_example(msg + unknown)
    assert out["i"].tolist() == [5, -1] and out["f"].tolist() == [1.5, 2.0]


def test_example_round_trip_types():
    feats = {"b": [b"x", "y"], "i": [1, -2, 2**40], "f": [0.25, -1.0], "arr": np.arange(4, dtype=np.int32),
             "farr": np.ones((2, 2), dtype=np.float64), "empty": []}
    out = decode_example(encode_example(feats))
    assert out["b"] == [b"x", b"y"] and out["i"].tolist() == [1, -2, 2**40]
    assert out["f"].tolist() == [0.25, -1.0] and out["arr"].tolist() == [0, 1, 2, 3]
    assert out["farr"].tolist() == [1.0] * 4 and out["empty"] == []
    with pytest.raises(TypeError):
        encode_example({"x": object()})
    with pytest.raises(ExampleFormatError):
        decode_example(b"\x0a\x05ab")


def records(n=5):
    return [encode_example({"i": i, "img": os.urandom(50 * i)}) for i in range(n)]


def test_framing_round_trip_and_truncation():
    buf = io.BytesIO()
    assert write_tfrecords(buf, records()) == 5
    data = buf.getvalue()
    got = list(iter_tfrecords(OneWay(data, 7), "u"))
    assert [decode_example(p)["i"].tolist() for p in got] == [[i] for i in range(5)]
    assert list(iter_tfrecords(io.BytesIO(data), skip=3)) == got[3:]
    for cut in (1, 11, 12, 30, len(data) - 1):
        with pytest.raises(CorruptDataError, match="truncated"):
            list(iter_tfrecords(io.BytesIO(data[:cut]), "s3://b/x.tfrecord"))


def test_crc_mismatch_detected_unless_disabled():
    buf = io.BytesIO()
    write_tfrecords(buf, [b"hello world"])
    bad = bytearray(buf.getvalue())
    bad[14] ^= 1  # payload byte
    with pytest.raises(CorruptDataError, match="data CRC") as err:
        list(iter_tfrecords(io.BytesIO(bytes(bad)), "s3://b/x.tfrecord"))
    assert "s3://b/x.tfrecord" in str(err.value) and "record 0" in str(err.value)
    assert list(iter_tfrecords(io.BytesIO(bytes(bad)), check_crc=False)) == [b"hemlo world"]
    bad = bytearray(buf.getvalue())
    bad[0] ^= 1  # length
    with pytest.raises(CorruptDataError, match="length CRC"):
        list(iter_tfrecords(io.BytesIO(bytes(bad))))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=5), st.data())
def test_property_damage_is_loud(payloads, data):
    buf = io.BytesIO()
    write_tfrecords(buf, payloads)
    raw = bytearray(buf.getvalue())
    if data.draw(st.booleans()):
        cut = data.draw(st.integers(0, len(raw) - 1))
        raw = raw[:cut]
    else:
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] ^= data.draw(st.integers(1, 255))
    try:
        got = list(iter_tfrecords(io.BytesIO(bytes(raw))))
    except CorruptDataError:
        return
    # only a cut exactly at a record boundary reads cleanly, and then yields a prefix
    assert got == payloads[: len(got)] and len(got) < len(payloads)


@pytest.fixture
def tf_files(tmp_path):
    paths = []
    for s in range(2):
        p = tmp_path / f"part-{s}.tfrecord"
        with TFRecordWriter(p) as w:
            for i in range(4):
                w.write(encode_example({"shard": s, "i": i, "name": f"{s}-{i}"}))
        paths.append(str(p))
    return paths


def test_read_tfrecord_stage(tf_files):
    out = list(pf.from_items(tf_files).read_tfrecord())
    assert [o["__key__"] for o in out] == [f"{p}#{i}" for p in tf_files for i in range(4)]
    assert [o["name"] for o in out] == [[f"{s}-{i}".encode()] for s in range(2) for i in range(4)]
    opened = [Opened(tf_files[0], open(tf_files[0], "rb"))]
    raw = list(TFRecordReader(ItemSource(opened), parse_example=False))
    assert isinstance(raw[0], Record) and decode_example(raw[0].data)["i"].tolist() == [0]


@pytest.mark.parametrize("k", [0, 2, 4, 5, 8])
def test_read_tfrecord_state_round_trip(tf_files, k):
    full = list(TFRecordReader(ItemSource(tf_files)))
    stage = TFRecordReader(ItemSource(tf_files))
    head = take(stage, k)
    state = stage.state_dict()
    stage.close()
    fresh = TFRecordReader(ItemSource(tf_files))
    fresh.load_state_dict(state)
    rest = list(fresh)
    assert [h["__key__"] for h in head + rest] == [f["__key__"] for f in full]


def test_read_tfrecord_skip_counts(tf_files, tmp_path):
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(open(tf_files[0], "rb").read()[:-3])
    notex = tmp_path / "notexample.tfrecord"
    write_tfrecords(notex, [b"\xff\xff\xff"])
    with pytest.raises(CorruptDataError):
        list(pf.from_items([str(notex)]).read_tfrecord())
    pipe = pf.from_items([str(bad), str(notex), tf_files[1]]).read_tfrecord(on_error="skip")
    out = list(pipe)
    assert len(out) == 3 + 4
    (counts,) = [v for k, v in pipe.stats().items() if k.startswith("read_tfrecord")]
    assert counts["skipped_objects"] == 2


def test_tfrecord_stream_from_fifo(tmp_path):
    fifo = tmp_path / "train_0"
    os.mkfifo(fifo)
    payloads = [encode_example({"i": i}) for i in range(20)]

    def writer():
        with open(fifo, "wb") as f:
            write_tfrecords(f, payloads)

    t = threading.Thread(target=writer)
    t.start()
    out = list(tfrecord_stream(str(tmp_path / "train_{epoch}")))
    t.join(timeout=10)
    assert [o["i"].tolist() for o in out] == [[i] for i in range(20)]


def test_tfrecord_stream_state_and_errors(tf_files, tmp_path):
    pipe = tfrecord_stream(tf_files[0])
    it = iter(pipe)
    head = take(it, 2)
    state = it.state_dict()
    it.close()
    it2 = iter(pipe)
    it2.load_state_dict(state)
    assert [o["i"].tolist() for o in head + list(it2)] == [[i] for i in range(4)]
    with pytest.raises(FileNotFoundError):
        list(tfrecord_stream(str(tmp_path / "missing")))
    with pytest.raises(ConfigError):
        list(tfrecord_stream(str(tmp_path / "x_{nope}")))
    with pytest.raises(ConfigError):
        tfrecord_stream(tf_files[0], check_crc="no")


def test_an_empty_file_is_a_tfrecord_file_of_no_records_unlike_an_empty_tar(tmp_path):
    # what TFRecordWriter (TensorFlow's and ours) leaves when nothing was written: a valid file
    with TFRecordWriter(str(tmp_path / "none.tfrecord")):
        pass
    assert os.path.getsize(tmp_path / "none.tfrecord") == 0
    (tmp_path / "none.tar").write_bytes(b"")
    reader = pf.from_items([str(tmp_path / "none.tfrecord")]).open("local").read_tfrecord()
    assert list(reader) == []
    assert reader.stats()["read_tfrecord"]["objects"] == 1  # read, and counted
    # no tar writer makes a 0-byte archive: that is a failed upload or a cut copy
    with pytest.raises(CorruptDataError, match="empty archive"):
        list(pf.from_items([str(tmp_path / "none.tar")]).open("local").untar())
