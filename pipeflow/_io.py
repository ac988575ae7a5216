"""Byte-stream helpers shared by the formats and the backends."""

from __future__ import annotations

from typing import Any

__all__ = ["read_exact"]

#: largest single read request: bounds the temporary buffer a file object may allocate
MAX_READ = 1 << 26


def read_exact(stream: Any, n: int) -> bytes:
    """Read ``n`` bytes from ``stream``, looping over short reads.

    Returns fewer than ``n`` bytes only at the end of the stream (a caller that needs exactly
    ``n`` compares the length). A ``None`` from a non-blocking stream counts as the end.
    """
    data = stream.read(min(n, MAX_READ)) if n > 0 else b""
    if not data:
        return b""
    if len(data) == n:
        return bytes(data)
    parts = [data]
    got = len(data)
    while got < n:
        chunk = stream.read(min(n - got, MAX_READ))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)
