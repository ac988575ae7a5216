"""Small value types that flow between stages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, Any, NamedTuple

__all__ = ["ObjectInfo", "Opened", "Record", "describe_item"]


@dataclass(frozen=True)
class ObjectInfo:
    """An object found by a listing.

    Attributes:
        url: full URL (``s3://bucket/key``, ``file:///path`` or a bare local path).
        size: size in bytes, when known.
        etag: entity tag, when the store reports one.
        mtime: modification time (POSIX seconds), when known.
    """

    url: str
    size: int | None = None
    etag: str | None = None
    mtime: float | None = None

    def __str__(self) -> str:
        return self.url


class Opened(NamedTuple):
    """An object opened for streaming: its URL and a readable binary file object."""

    url: str
    stream: IO[bytes]


class Record(NamedTuple):
    """A named blob of bytes: an archive member, or a whole object read into memory.

    Attributes:
        name: the member path inside the archive, or the object URL.
        data: the content.
        url: the URL of the object (archive) the bytes came from.
    """

    name: str
    data: bytes
    url: str


def describe_item(item: Any, limit: int = 120) -> str:
    """A short description of an item for error messages: its sample key or URL if it has one."""
    if isinstance(item, dict):
        for key in ("__key__", "__url__", "url"):
            if key in item:
                return f"{key}={item[key]!r}"
    for attr in ("url", "key"):
        value = getattr(item, attr, None)
        if isinstance(value, str):
            return f"{attr}={value!r}"
    if isinstance(item, tuple) and item and isinstance(item[0], str):
        return repr(item[0])[:limit]
    text = repr(item)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text
