"""``tf.train.Example`` protobuf encoding and decoding, by hand (no TensorFlow, no protobuf).

The schema (``tensorflow/core/example/{example,feature}.proto``)::

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }
    Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                             Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }

Decoding accepts packed and unpacked repeated scalars and skips unknown fields, as protobuf
parsers must. A decoded feature is a ``list[bytes]`` (bytes_list), a ``numpy.float32`` array
(float_list) or a ``numpy.int64`` array (int64_list).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["ExampleFormatError", "decode_example", "encode_example"]


class ExampleFormatError(ValueError):
    """The payload is not a valid ``tf.train.Example``."""


# ---- decoding ------------------------------------------------------------------------------
def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise ExampleFormatError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ExampleFormatError("varint too long")


def _fields(buf: bytes, start: int, end: int):
    """Yield ``(field number, wire type, value or (start, end))`` for a message."""
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ExampleFormatError("field number 0")
        if wire == 0:
            value, pos = _varint(buf, pos, end)
            yield number, wire, value
        elif wire == 2:
            length, pos = _varint(buf, pos, end)
            if pos + length > end:
                raise ExampleFormatError("length-delimited field overruns its message")
            yield number, wire, (pos, pos + length)
            pos += length
        elif wire == 5:
            if pos + 4 > end:
                raise ExampleFormatError("truncated fixed32")
            yield number, wire, (pos, pos + 4)
            pos += 4
        elif wire == 1:
            if pos + 8 > end:
                raise ExampleFormatError("truncated fixed64")
            yield number, wire, (pos, pos + 8)
            pos += 8
        else:
            raise ExampleFormatError(f"unsupported wire type {wire}")


def _to_int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _decode_feature(buf: bytes, start: int, end: int) -> Any:
    result: Any = []
    for number, wire, value in _fields(buf, start, end):
        if wire != 2 or number not in (1, 2, 3):
            continue  # unknown field
        s, e = value
        if number == 1:
            out: list[bytes] = []
            for n, w, v in _fields(buf, s, e):
                if n == 1 and w == 2:
                    out.append(buf[v[0]:v[1]])
            result = out
        elif number == 2:
            parts: list[Any] = []
            for n, w, v in _fields(buf, s, e):
                if n != 1:
                    continue
                if w == 2:  # packed
                    if (v[1] - v[0]) % 4:
                        raise ExampleFormatError("packed float list length is not a multiple of 4")
                    parts.append(np.frombuffer(buf, dtype="<f4", count=(v[1] - v[0]) // 4,
                                               offset=v[0]))
                elif w == 5:
                    parts.append(np.frombuffer(buf, dtype="<f4", count=1, offset=v[0]))
            result = (np.concatenate(parts) if parts else np.zeros(0)).astype(np.float32)
        else:
            ints: list[int] = []
            for n, w, v in _fields(buf, s, e):
                if n != 1:
                    continue
                if w == 2:  # packed
                    p = v[0]
                    while p < v[1]:
                        x, p = _varint(buf, p, v[1])
                        ints.append(_to_int64(x))
                elif w == 0:
                    ints.append(_to_int64(v))
            result = np.array(ints, dtype=np.int64)
    return result


def decode_example(payload: bytes) -> dict[str, Any]:
    """Parse a serialized ``tf.train.Example`` into ``{feature name: values}``.

    Raises:
        ExampleFormatError: the bytes are not a valid Example.
    """
    buf = bytes(payload)
    features: dict[str, Any] = {}
    for number, wire, value in _fields(buf, 0, len(buf)):
        if number != 1 or wire != 2:
            continue
        for n, w, entry in _fields(buf, value[0], value[1]):
            if n != 1 or w != 2:
                continue
            key = None
            feature: Any = []
            for en, ew, ev in _fields(buf, entry[0], entry[1]):
                if ew != 2:
                    continue
                if en == 1:
                    try:
                        key = buf[ev[0]:ev[1]].decode("utf-8")
                    except UnicodeDecodeError as exc:
                        raise ExampleFormatError("feature name is not UTF-8") from exc
                elif en == 2:
                    feature = _decode_feature(buf, ev[0], ev[1])
            features[key if key is not None else ""] = feature
    return features


# ---- encoding ------------------------------------------------------------------------------
def _enc_varint(v: int) -> bytes:
    if v < 0:
        v += 1 << 64
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _enc_varint(number << 3 | 2) + _enc_varint(len(payload)) + payload


def _encode_feature(name: str, value: Any) -> bytes:
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "SUO":
            value = [v if isinstance(v, bytes) else str(v).encode() for v in value.ravel()]
        elif value.dtype.kind == "f":
            value = value.astype("<f4").ravel()
            return _len_field(2, _len_field(1, value.tobytes()))
        elif value.dtype.kind in "iub":
            value = [int(v) for v in value.ravel()]
        else:
            raise TypeError(f"feature {name!r}: unsupported array dtype {value.dtype}")
    if isinstance(value, (bytes, bytearray, str)) or not isinstance(value, Sequence):
        value = [value]
    if not value:
        return _len_field(1, b"")  # an empty bytes_list
    first = value[0]
    if all(isinstance(v, (bytes, bytearray, str)) for v in value):
        body = b"".join(_len_field(1, v.encode("utf-8") if isinstance(v, str) else bytes(v))
                        for v in value)
        return _len_field(1, body)
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
        body = b"".join(_enc_varint(int(v)) for v in value)
        return _len_field(3, _len_field(1, body))
    if all(isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool)
           for v in value):
        return _len_field(2, _len_field(1, struct.pack(f"<{len(value)}f", *value)))
    raise TypeError(f"feature {name!r}: cannot encode values of type {type(first).__name__} "
                    "(use bytes/str, ints or floats)")


def encode_example(features: Mapping[str, Any]) -> bytes:
    """Serialize ``{name: value}`` as a ``tf.train.Example``.

    Values: ``bytes``/``str`` or a list of them (bytes_list), an ``int`` or list of ints
    (int64_list, packed), a ``float`` or list of floats (float_list, packed), or a numpy array
    (by dtype). Keys are written in sorted order so output is deterministic.

    Raises:
        TypeError: a value of an unsupported type.
    """
    entries = b"".join(
        _len_field(1, _len_field(1, name.encode("utf-8"))
                   + _len_field(2, _encode_feature(name, features[name])))
        for name in sorted(features))
    return _len_field(1, entries)
