"""Large results of process workers travel through shared memory, not through the pipe.

A worker writes every ``numpy.ndarray`` or ``torch.Tensor`` of at least :data:`MIN_BYTES` in
its result (at the top level or inside dicts, lists and tuples) into a fresh POSIX shared
memory file and sends only a small handle. The owner maps the file, unlinks it at once and
wraps the mapping as the array or tensor: one copy in the worker, none in the owner, and
after the unlink the memory belongs to the result alone (freed with it).

Segments are named ``pipeflow-<owner pid>-<pool>-<worker pid>-<n>``, so whoever cleans up
knows what is whose: a pool removes what its workers wrote and nobody received (a crash,
results cancelled at close) when it shuts down; a worker whose owner died removes the owner's
segments before it exits; and every new pool removes segments of owners that no longer exist.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
from typing import Any

__all__ = ["MIN_BYTES", "SHM_DIR", "restore", "run_task", "sweep", "sweep_owner"]

#: results smaller than this are cheaper to pickle than to map
MIN_BYTES = 64 * 1024
#: where POSIX shared memory lives (Linux); without it results are pickled as usual
SHM_DIR = "/dev/shm"
_PREFIX = "pipeflow-"
_DEPTH = 3

_worker_prefix: str | None = None
_counter = itertools.count()


class _Handle:
    """What crosses the pipe instead of a large array: the segment and how to view it."""

    __slots__ = ("dtype", "kind", "name", "nbytes", "shape")

    def __init__(self, name: str, kind: str, dtype: str, shape: tuple[int, ...], nbytes: int) -> None:
        self.name, self.kind, self.dtype, self.shape, self.nbytes = name, kind, dtype, shape, nbytes

    def __reduce__(self) -> Any:
        return (_Handle, (self.name, self.kind, self.dtype, self.shape, self.nbytes))


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def pool_prefix(pool_id: int) -> str:
    return f"{_PREFIX}{os.getpid()}-{pool_id}-"


def set_worker_prefix(prefix: str) -> None:
    global _worker_prefix
    _worker_prefix = prefix or None


# ---- worker side ----------------------------------------------------------------------------
def run_task(fn: Any, *args: Any) -> Any:
    """What a process worker runs: ``fn(*args)`` with its large arrays moved to shared memory."""
    result = fn(*args)
    if _worker_prefix is None:
        return result
    return _export(result, _DEPTH)


def _export(value: Any, depth: int) -> Any:
    kind = _kind(value)
    if kind is not None:
        return _write(value, kind)
    if depth <= 0:
        return value
    if type(value) is dict:
        return {k: _export(v, depth - 1) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_export(v, depth - 1) for v in value)
    return value


def _kind(value: Any) -> str | None:
    import sys

    np = sys.modules.get("numpy")
    if np is not None and type(value) is np.ndarray:
        if value.nbytes >= MIN_BYTES and value.dtype.kind in "biufc" and not value.dtype.hasobject:
            return "numpy"
        return None
    torch = sys.modules.get("torch")
    if (torch is not None and type(value) is torch.Tensor and value.device.type == "cpu"
            and not value.requires_grad and value.layout == torch.strided
            and value.nbytes >= MIN_BYTES and value.dtype not in (torch.bfloat16,)
            and not value.dtype.is_complex):
        return "torch"
    return None


def _write(value: Any, kind: str) -> Any:
    import numpy as np

    array = value.numpy() if kind == "torch" else value
    name = f"{_worker_prefix}{os.getpid()}-{next(_counter)}"
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, array.nbytes)
        with mmap.mmap(fd, array.nbytes) as mm:
            np.copyto(np.frombuffer(mm, dtype=array.dtype).reshape(array.shape), array)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)
    return _Handle(name, kind, array.dtype.str, tuple(array.shape), array.nbytes)


# ---- owner side -----------------------------------------------------------------------------
def restore(value: Any, depth: int = _DEPTH) -> Any:
    """Replace handles in a worker's result by arrays/tensors over the (unlinked) segments."""
    if type(value) is _Handle:
        return _read(value)
    if depth <= 0:
        return value
    if type(value) is dict:
        return {k: restore(v, depth - 1) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(restore(v, depth - 1) for v in value)
    return value


def discard(value: Any, depth: int = _DEPTH) -> None:
    """Remove the segments of a result nobody will read (cancelled, or its stage closed)."""
    if type(value) is _Handle:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHM_DIR, value.name))
    elif depth > 0 and type(value) is dict:
        for v in value.values():
            discard(v, depth - 1)
    elif depth > 0 and type(value) in (list, tuple):
        for v in value:
            discard(v, depth - 1)


def _read(handle: _Handle) -> Any:
    import numpy as np

    path = os.path.join(SHM_DIR, handle.name)
    fd = os.open(path, os.O_RDWR)
    try:
        os.unlink(path)  # from here on the mapping is the only reference: freed with the result
        try:
            buf: Any = mmap.mmap(fd, handle.nbytes)
        except OSError:  # out of mappings (vm.max_map_count, many results held): a private copy
            buf = _read_all(fd, handle.nbytes)
    finally:
        os.close(fd)
    array = np.frombuffer(buf, dtype=np.dtype(handle.dtype)).reshape(handle.shape)
    if handle.kind == "torch":
        import torch

        return torch.from_numpy(array)
    return array


def _read_all(fd: int, nbytes: int) -> bytearray:
    buf = bytearray(nbytes)
    view, got = memoryview(buf), 0
    while got < nbytes:
        n = os.readv(fd, [view[got:]])
        if n == 0:
            raise OSError(f"shared-memory segment shorter than {nbytes} bytes")
        got += n
    return buf


def sweep(prefix: str) -> None:
    """Remove every segment whose name starts with ``prefix`` (a pool's or an owner's)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(SHM_DIR):
            if name.startswith(prefix):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(SHM_DIR, name))


def sweep_owner(owner_pid: int) -> None:
    sweep(f"{_PREFIX}{owner_pid}-")


def sweep_dead_owners() -> None:
    """Remove segments left by owners that were killed before any worker could clean up."""
    with contextlib.suppress(OSError):
        for name in os.listdir(SHM_DIR):
            if not name.startswith(_PREFIX):
                continue
            pid = name[len(_PREFIX):].split("-", 1)[0]
            if pid.isdigit() and not pid_alive(int(pid)):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(SHM_DIR, name))


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists (someone else's live process included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
