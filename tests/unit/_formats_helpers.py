"""Builders for tar shards and TFRecord files used by the formats tests."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable
from typing import Any

from pipeflow.stages.base import Stage


class OneWay(io.RawIOBase):
    """A non-seekable stream that returns at most ``chunk`` bytes per read (like a socket)."""

    def __init__(self, data: bytes, chunk: int = 1000) -> None:
        self._data = memoryview(data)
        self._pos = 0
        self._chunk = chunk
        self.closed_by_reader = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = len(self._data)
        n = min(n, self._chunk)
        out = bytes(self._data[self._pos:self._pos + n])
        self._pos += len(out)
        return out

    def readinto(self, b: Any) -> int:
        out = self.read(len(b))
        b[: len(out)] = out
        return len(out)

    def close(self) -> None:
        self.closed_by_reader = True
        super().close()


def make_tar(members: Iterable[tuple[str, bytes]], *, fmt: int = tarfile.PAX_FORMAT,
             compression: str = "", extras: bool = False) -> bytes:
    """A tar (optionally ``gz``/``bz2``/``xz``) with the given regular members, in order.

    ``extras`` adds a directory, a symlink and a hard link in front, which readers must skip.
    """
    buf = io.BytesIO()
    mode = "w:" + compression if compression else "w"
    with tarfile.open(fileobj=buf, mode=mode, format=fmt) as tf:
        if extras:
            d = tarfile.TarInfo("somedir")
            d.type = tarfile.DIRTYPE
            tf.addfile(d)
            s = tarfile.TarInfo("somedir/link.txt")
            s.type = tarfile.SYMTYPE
            s.linkname = "../x.txt"
            tf.addfile(s)
            h = tarfile.TarInfo("hard.txt")
            h.type = tarfile.LNKTYPE
            h.linkname = "somedir/link.txt"
            tf.addfile(h)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def take(stage: Stage[Any], k: int) -> list[Any]:
    return [next(stage) for _ in range(k)]
