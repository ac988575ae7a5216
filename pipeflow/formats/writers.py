"""Encoding samples into shard bytes: tar members and TFRecord records.

A shard is the concatenation of its samples' encodings followed by a trailer (the tar
end-of-archive blocks; nothing for TFRecord), so the size of a shard is known exactly before a
sample is added to it, and the same samples always give the same bytes (fixed metadata, no
timestamps): a rerun can check a shard it wrote before by its checksum.

Accepted items:

* a sample dict ``{"__key__": key, field: value, ...}`` (what ``group_pairs()`` yields): in a
  tar each field is a member ``{key}.{field}`` (WebDataset's layout); in a TFRecord file the
  sample is one ``tf.train.Example`` with one feature per field, plus the key as the bytes
  feature ``key`` unless the sample has a ``key`` field of its own. Fields whose names start
  with ``__`` (``__url__``) are not written.
* a :class:`~pipeflow.items.Record` (what ``untar()`` and ``read_tfrecord(parse_example=False)``
  yield): a tar member named ``record.name``, or a TFRecord record whose payload is
  ``record.data``;
* ``bytes`` (TFRecord only): one record with that payload.
"""

from __future__ import annotations

import tarfile
from io import BytesIO
from typing import Any, ClassVar

from ..errors import StageError
from ..items import Record
from .example import encode_example
from .keys import split_key
from .tar import BLOCK
from .tfrecord import TFRecordWriter

__all__ = ["ENCODERS", "ShardEncoder", "TarEncoder", "TFRecordEncoder"]


def _error(message: str, key: str) -> StageError:
    return StageError(message, stage="write_shards", key=key)


def _as_bytes(value: Any, field: str, key: str) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode()  # WebDataset's convention for class labels (.cls)
    raise _error(f"field {field!r} is a {type(value).__name__}; tar shards store bytes, str or "
                 "int values: encode it first (for example with .map())", key)


def _check_member_name(name: str, key: str) -> None:
    parts = name.split("/")
    if not name or "://" in name or name.startswith("/") or ".." in parts or "" in parts[:-1]:
        raise _error(f"member name {name!r} is not a relative path; make sample keys relative "
                     "(for example with .map()) before writing shards", key)


def _check_key(key: Any) -> str:
    if not isinstance(key, str) or not key:
        raise _error(f"a sample needs a non-empty str '__key__', got {key!r}", repr(key))
    if "." in key.rsplit("/", 1)[-1]:
        # readers split a member name at the first dot of its base name: the key would change
        raise _error("the last part of a sample key must not contain a dot (readers would "
                     "split the key there)", key)
    return key


class ShardEncoder:
    """Turns one item into the bytes it occupies in a shard; see the module docstring."""

    #: the shard file suffix
    extension: ClassVar[str] = ""
    #: the bytes that end a shard
    trailer: ClassVar[bytes] = b""

    def encode(self, item: Any) -> tuple[str | None, bytes]:
        """``(sample key or None, encoded bytes)``."""
        raise NotImplementedError


class TarEncoder(ShardEncoder):
    """POSIX (PAX) tar members with fixed metadata: mode 0644, owner 0, mtime 0."""

    extension = ".tar"
    trailer = b"\0" * (2 * BLOCK)

    def encode(self, item: Any) -> tuple[str | None, bytes]:
        if isinstance(item, Record):
            _check_member_name(item.name, item.name)
            split = split_key(item.name)
            key = split[0] if split is not None else None  # a member of no sample (README)
            return key, _member(item.name, _as_bytes(item.data, item.name, item.name))
        if not isinstance(item, dict):
            raise _error(f"tar shards take sample dicts or Records, got {type(item).__name__}",
                         repr(item)[:80])
        key = _check_key(item.get("__key__"))
        parts = []
        for field, value in item.items():
            if field.startswith("__"):
                continue
            name = f"{key}.{field}"
            _check_member_name(name, key)
            parts.append(_member(name, _as_bytes(value, field, key)))
        if not parts:
            raise _error("the sample has no fields to write", key)
        return key, b"".join(parts)


def _member(name: str, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0
    header = info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")
    pad = -len(data) % BLOCK
    return b"".join((header, data, b"\0" * pad))


class TFRecordEncoder(ShardEncoder):
    """One record per item, framed with masked CRC-32Cs as TensorFlow writes them."""

    extension = ".tfrecord"

    def encode(self, item: Any) -> tuple[str | None, bytes]:
        key: str | None = None
        if isinstance(item, (bytes, bytearray, memoryview)):
            payload = bytes(item)
        elif isinstance(item, Record):
            key, payload = item.name, bytes(item.data)
        elif isinstance(item, dict):
            key = _check_key(item.get("__key__"))
            features = {k: v for k, v in item.items() if not k.startswith("__")}
            features.setdefault("key", key.encode("utf-8"))
            try:
                payload = encode_example(features)
            except (TypeError, ValueError) as exc:
                raise _error(f"cannot encode the sample as a tf.train.Example: {exc}", key) from exc
        else:
            raise _error("TFRecord shards take sample dicts, Records or bytes, got "
                         f"{type(item).__name__}", repr(item)[:80])
        return key, _frame(payload)


def _frame(payload: bytes) -> bytes:
    buf = BytesIO()
    TFRecordWriter(buf).write(payload)
    return buf.getvalue()


#: ``format=`` name -> encoder class
ENCODERS: dict[str, type[ShardEncoder]] = {"tar": TarEncoder, "tfrecord": TFRecordEncoder}
