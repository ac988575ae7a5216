"""Compressed TFRecord files (TensorFlow's GZIP and ZLIB options) and error positions."""

from __future__ import annotations

import gzip
import io
import struct
import zlib

import pytest

import pipeflow as pf
from pipeflow.errors import ConfigError, CorruptDataError
from pipeflow.formats.example import encode_example
from pipeflow.formats.tfrecord import detect_compression, iter_records, iter_tfrecords
from pipeflow.pipeline import tfrecord_stream

from ._formats_helpers import OneWay

PAYLOADS = [encode_example({"i": i, "blob": bytes([i]) * (i * 997)}) for i in range(12)]


def _plain(payloads=PAYLOADS) -> bytes:
    buf = io.BytesIO()
    pf.formats.write_tfrecords(buf, payloads)
    return buf.getvalue()


COMPRESSORS = {
    "none": lambda data: data,
    "gzip": gzip.compress,
    "zlib": zlib.compress,
}


@pytest.mark.parametrize("kind", list(COMPRESSORS))
def test_detected_by_content_and_read(kind):
    data = COMPRESSORS[kind](_plain())
    assert detect_compression(data[:12]) == kind
    assert list(iter_tfrecords(OneWay(data, 333), f"mem://x.{kind}")) == PAYLOADS
    assert list(iter_tfrecords(io.BytesIO(data), compression=kind)) == PAYLOADS


@pytest.mark.parametrize("kind", ["gzip", "zlib"])
def test_pipeline_reads_compressed_files_and_resumes(tmp_path, kind):
    path = tmp_path / f"part.tfrecord.{kind}"
    path.write_bytes(COMPRESSORS[kind](_plain()))
    out = list(pf.from_items([str(path)]).read_tfrecord())
    assert [o["i"].tolist() for o in out] == [[i] for i in range(12)]
    assert list(pf.from_items([str(path)]).read_tfrecord(compression=kind, parse_example=False))[3].data \
        == PAYLOADS[3]
    assert list(iter_tfrecords(open(path, "rb"), skip=5)) == PAYLOADS[5:]
    streamed = list(tfrecord_stream(str(path)))
    assert [o["__key__"] for o in streamed] == [o["__key__"] for o in out]
    assert [o["i"].tolist() for o in tfrecord_stream(str(path), compression=kind)] == \
        [[i] for i in range(12)]


def test_plain_file_whose_first_bytes_look_like_gzip_stays_plain():
    # a first record of 0x8b1f bytes starts with gzip's magic; its header CRC says plain
    payloads = [b"\x00" * 0x8B1F, b"second"]
    data = _plain(payloads)
    assert data[:2] == b"\x1f\x8b"
    assert detect_compression(data[:12]) == "none"
    assert list(iter_tfrecords(io.BytesIO(data))) == payloads


def test_plain_file_read_as_gzip_and_gzip_read_as_plain_fail_loudly():
    with pytest.raises(CorruptDataError, match="length CRC mismatch"):
        list(iter_tfrecords(io.BytesIO(gzip.compress(_plain())), "mem://g", compression="none"))
    with pytest.raises(CorruptDataError, match="gzip stream is corrupt"):
        list(iter_tfrecords(io.BytesIO(_plain()), "mem://p", compression="gzip"))


@pytest.mark.parametrize("kind", ["gzip", "zlib"])
def test_truncated_or_damaged_compressed_file_is_corrupt_data(kind):
    data = COMPRESSORS[kind](_plain())
    for cut in (len(data) - 1, len(data) // 2, 20):
        with pytest.raises(CorruptDataError) as err:
            list(iter_tfrecords(OneWay(data[:cut], 100), "s3://b/t.tfrecord.gz"))
        assert "s3://b/t.tfrecord.gz" in str(err.value)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF
    with pytest.raises(CorruptDataError):
        list(iter_tfrecords(io.BytesIO(bytes(flipped)), "s3://b/t.tfrecord.gz"))


def test_gzip_with_trailing_garbage_is_corrupt_data():
    with pytest.raises(CorruptDataError, match="trailing garbage"):
        list(iter_tfrecords(io.BytesIO(gzip.compress(_plain()) + b"junk"), "mem://g"))


def test_unknown_compression_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"read_tfrecord\(compression=...\)"):
        pf.from_items([]).read_tfrecord(compression="snappy")
    with pytest.raises(ConfigError, match=r"tfrecord_stream\(compression=...\)"):
        tfrecord_stream(str(tmp_path / "x"), compression="GZIP")
    with pytest.raises(ConfigError):
        list(iter_tfrecords(io.BytesIO(b""), compression="lz4"))


@pytest.mark.parametrize("kind", ["none", "gzip"])
def test_not_an_example_error_names_url_record_and_offset(tmp_path, kind):
    payloads = PAYLOADS[:3] + [b"\xff\xff\xff"]
    offset = sum(12 + len(p) + 4 for p in payloads[:3])
    path = tmp_path / "mixed.tfrecord"
    path.write_bytes(COMPRESSORS[kind](_plain(payloads)))
    assert [(i, o) for i, o, _ in iter_records(open(path, "rb"))][3] == (3, offset)
    for pipe in (pf.from_items([str(path)]).read_tfrecord(), tfrecord_stream(str(path))):
        with pytest.raises(CorruptDataError) as err:
            list(pipe)
        text = str(err.value)
        assert "not a tf.train.Example" in text
        assert str(path) in text and "record 3" in text and f"offset {offset}" in text


def test_crc_error_offsets_count_uncompressed_bytes():
    data = bytearray(_plain())
    second = 12 + len(PAYLOADS[0]) + 4
    data[second + 12] ^= 0x01  # first payload byte of record 1
    with pytest.raises(CorruptDataError, match=f"record 1, offset {second}"):
        list(iter_tfrecords(io.BytesIO(gzip.compress(bytes(data))), "mem://c"))
    assert struct.unpack("<Q", bytes(data[second:second + 8]))[0] == len(PAYLOADS[1])
