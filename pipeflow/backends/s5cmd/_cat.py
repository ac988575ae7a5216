"""Streaming an object through ``s5cmd cat``, with a bound on how long it may stall."""

from __future__ import annotations

import io
import select
from collections.abc import Mapping, Sequence
from typing import IO

from .._subprocess import ErrorFactory, ProcessStream

__all__ = ["open_cat"]

_BUFFER = 1 << 16


class _CatStream(ProcessStream):
    """``s5cmd cat``'s stdout, with a limit on how long a read may wait for the next byte.

    s5cmd has no read timeout of its own; a stalled server would block a read forever.
    """

    def __init__(self, argv: Sequence[str], *, on_error: ErrorFactory, env: Mapping[str, str],
                 stall_timeout: float | None) -> None:
        super().__init__(argv, on_error=on_error, env=env)
        self._stall_timeout = stall_timeout

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if self._stall_timeout is not None and not self.closed:
            # the pipe is unbuffered on our side: readable means data or end of file
            ready, _, _ = select.select([self._stdout], [], [], self._stall_timeout)
            if not ready:
                raise TimeoutError(f"s5cmd cat sent no data for {self._stall_timeout:g} s")
        return super().readinto(buffer)


def open_cat(argv: Sequence[str], *, on_error: ErrorFactory, env: Mapping[str, str], start: int,
             stall_timeout: float | None) -> IO[bytes]:
    """Start ``s5cmd cat`` and discard its first ``start`` bytes (it cannot read a range).

    Waits for the first byte (or the exit status), so a failing command raises here.
    """
    raw = _CatStream(argv, on_error=on_error, env=env, stall_timeout=stall_timeout)
    stream = io.BufferedReader(raw, _BUFFER)
    try:
        stream.peek(1)
        remaining = start
        while remaining > 0:
            skipped = len(stream.read(min(remaining, _BUFFER)))
            if not skipped:
                break  # ended early: the caller sees a short body and resumes
            remaining -= skipped
    except BaseException:
        _close_quietly(stream)
        raise
    return stream


def _close_quietly(stream: IO[bytes]) -> None:
    try:
        stream.close()
    except Exception:  # the child failed too; the error being raised says more
        pass
