"""Small filesystem helpers shared by the stages and the data generator."""

from __future__ import annotations

import contextlib
import os
import tempfile

__all__ = ["atomic_write"]


def atomic_write(path: str, data: bytes, *, tmp_prefix: str = ".tmp-") -> None:
    """Write ``data`` to ``path`` so readers see the whole file or none of it.

    The bytes go to a temporary file in the same directory, which then replaces ``path``
    (``os.replace`` is atomic within a filesystem); the temporary file never outlives a failure.
    """
    fd, tmp = tempfile.mkstemp(prefix=tmp_prefix, dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
