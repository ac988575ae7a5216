"""Large results of process workers travel through shared memory, not through the pipe.

A worker writes every ``numpy.ndarray`` or ``torch.Tensor`` of at least :data:`MIN_BYTES` in
its result (at the top level or inside dicts, lists and tuples) into POSIX shared memory and
sends only a small handle; the owner hands out arrays or tensors that view the memory: one
copy in the worker, none in the owner.

The memory is reused. A fresh tmpfs page costs a fault in the writer, a fault in the reader
and its allocation and freeing: about 5 us a page here, 0.2 ms for a 150 KB result and
2.8 ms for 2.4 MB, ten to twenty times the copy itself. So the owner keeps *slots*: named
segments it creates once the size of results is known, lends one to each task it submits
(:class:`Slots`), and takes back when every array viewing it has been garbage collected (a
finalizer on the object the views hang from). The worker keeps its mapping of each slot, so
from the second use on a result costs a copy into pages mapped on both sides. Lending goes
with the task through the pipe, so a slot is never written while something views it. A
result with no slot (the first ones, a result larger than its slot, every slot in use) goes
into a fresh segment that the owner unlinks as soon as it maps it: after the unlink the
memory belongs to the result alone.

Segments are named ``pipeflow-<owner pid>-<pool>-<worker pid>-<n>`` (fresh) and
``pipeflow-<owner pid>-<pool>-s<n>`` (slots), so whoever cleans up
knows what is whose: a pool removes what its workers wrote and nobody received (a crash,
results cancelled at close) when it shuts down; a worker whose owner died removes the owner's
segments before it exits; and every new pool removes segments of owners that no longer exist.
A slot stays named while its pool lives (workers open it by name) and goes with the pool.

Large inputs take the same way back: a task whose item is a ``bytes`` value of at least
:data:`MIN_BYTES` (or a dict with such values, as a sample dict is) has them written into the
slot lent for its result (:func:`pack_input`), and the worker copies them out before it calls the
function (:func:`run_with_input`): two copies instead of a pickle, a pipe write and read and an
unpickle of several megabytes, and the owner's feeder thread no longer pushes them through the
pipe 64 KiB at a time. The slot is free for the result once its input is copied out.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import itertools
import mmap
import os
import threading
import weakref
from typing import Any

from .._fs import pid_alive

__all__ = ["MIN_BYTES", "SHM_DIR", "Slots", "input_bytes", "pack_input", "restore", "run_task",
           "run_with_input", "sweep", "sweep_owner"]

#: results smaller than this are cheaper to pickle than to map
MIN_BYTES = 64 * 1024
#: where POSIX shared memory lives (Linux); without it results are pickled as usual
SHM_DIR = "/dev/shm"
_PREFIX = "pipeflow-"
_DEPTH = 3
#: arrays inside a slot start at multiples of this (cache lines; SIMD loads)
_ALIGN = 64
#: at most this many slots per pool, and at most SLOT_BYTES of them
MAX_SLOTS = 64
SLOT_BYTES = 256 << 20
#: slot mappings a worker keeps open (the owner retires slots that became too small)
_WORKER_MAPPINGS = 2 * MAX_SLOTS

_worker_prefix: str | None = None
_counter = itertools.count()
#: worker side: the slots this worker mapped, and the owner's generation of slots they belong to
_mappings: collections.OrderedDict[str, mmap.mmap] = collections.OrderedDict()
_generation = [0]


class _Handle:
    """What crosses the pipe instead of a large array: the segment and how to view it.

    ``offset`` is None for a fresh segment of its own, the array's place in a slot otherwise.
    """

    __slots__ = ("dtype", "kind", "lease", "name", "nbytes", "offset", "shape")

    def __init__(self, name: str, kind: str, dtype: str, shape: tuple[int, ...], nbytes: int,
                 offset: int | None = None) -> None:
        self.name, self.kind, self.dtype, self.shape, self.nbytes = name, kind, dtype, shape, nbytes
        self.offset = offset
        self.lease: _Lease | None = None  # owner side: what gives the slot back

    def __reduce__(self) -> Any:
        return (_Handle, (self.name, self.kind, self.dtype, self.shape, self.nbytes, self.offset))


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def pool_prefix(pool_id: int) -> str:
    return f"{_PREFIX}{os.getpid()}-{pool_id}-"


def set_worker_prefix(prefix: str) -> None:
    global _worker_prefix
    _worker_prefix = prefix or None
    while _mappings:  # slots of another pool
        _mappings.popitem()[1].close()


# ---- worker side ----------------------------------------------------------------------------
def run_task(fn: Any, *args: Any) -> Any:
    """What a process worker runs: ``fn(*args)`` with its large arrays moved to shared memory."""
    result = fn(*args)
    if _worker_prefix is None:
        return result
    return _export(result, _DEPTH, None)


def run_in_slot(slot: tuple[str, int, int] | None, fn: Any, *args: Any) -> Any:
    """:func:`run_task` with a slot ``(name, capacity, generation)`` lent by the owner for the
    result's large arrays; they go to fresh segments when they do not fit."""
    result = fn(*args)
    if _worker_prefix is None:
        return result
    if slot is not None:
        name, capacity, generation = slot
        place = _SlotWriter(name, capacity)
        _export(result, _DEPTH, place)  # a dry run: sizes and offsets only
        if place.offset <= capacity:
            try:
                place.offset, place.buffer = 0, _worker_mapping(name, capacity, generation)
            except OSError:  # the slot is gone (its pool is shutting down): a fresh segment
                return _export(result, _DEPTH, None)
            return _export(result, _DEPTH, place)
    return _export(result, _DEPTH, None)


class _Input:
    """What crosses the pipe instead of a large ``bytes`` input: its place in the task's slot."""

    __slots__ = ("nbytes", "offset")

    def __init__(self, offset: int, nbytes: int) -> None:
        self.offset, self.nbytes = offset, nbytes

    def __reduce__(self) -> Any:
        return (_Input, (self.offset, self.nbytes))


def run_with_input(slot: tuple[str, int, int], fn: Any, packed: Any) -> Any:
    """:func:`run_in_slot` for an item whose large ``bytes`` were written into ``slot`` by
    :func:`pack_input`: copied out here (the function gets real ``bytes``), then the slot
    takes the result."""
    name, capacity, generation = slot
    mapping = _worker_mapping(name, capacity, generation)
    return run_in_slot(slot, fn, _unpacked(packed, mapping))


def _unpacked(packed: Any, mapping: mmap.mmap) -> Any:
    if type(packed) is _Input:
        return mapping[packed.offset:packed.offset + packed.nbytes]
    if type(packed) is dict:
        return {k: _unpacked(v, mapping) for k, v in packed.items()}
    return packed


class _SlotWriter:
    """Where the next array of a result goes in its slot (``buffer`` None: only measure)."""

    __slots__ = ("buffer", "capacity", "name", "offset")

    def __init__(self, name: str, capacity: int) -> None:
        self.name, self.capacity, self.offset = name, capacity, 0
        self.buffer: mmap.mmap | None = None

    def put(self, value: Any, kind: str) -> Any:
        import numpy as np

        array = value.numpy() if kind == "torch" else value
        start = self.offset
        self.offset = -(-(start + array.nbytes) // _ALIGN) * _ALIGN
        if self.buffer is None:
            return None
        target = np.frombuffer(self.buffer, dtype=array.dtype, count=array.size, offset=start)
        np.copyto(target.reshape(array.shape), array)
        return _Handle(self.name, kind, array.dtype.str, tuple(array.shape), array.nbytes, start)


def _worker_mapping(name: str, capacity: int, generation: int) -> mmap.mmap:
    """This worker's mapping of slot ``name``, kept for the next results it carries. A new
    generation means the owner unlinked slots: mappings of those would hold their memory."""
    if generation != _generation[0]:
        _generation[0] = generation
        while _mappings:
            _mappings.popitem()[1].close()
    mm = _mappings.get(name)
    if mm is not None:
        _mappings.move_to_end(name)
        return mm
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    try:
        mm = mmap.mmap(fd, capacity)
    finally:
        os.close(fd)
    _mappings[name] = mm
    while len(_mappings) > _WORKER_MAPPINGS:
        _mappings.popitem(last=False)[1].close()
    return mm


def _export(value: Any, depth: int, place: _SlotWriter | None) -> Any:
    kind = _kind(value)
    if kind is not None:
        return _write(value, kind) if place is None else place.put(value, kind)
    if depth <= 0:
        return value
    if type(value) is dict:
        return {k: _export(v, depth - 1, place) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_export(v, depth - 1, place) for v in value)
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
class _Slot:
    __slots__ = ("capacity", "mapping", "name")

    def __init__(self, name: str, capacity: int, mapping: mmap.mmap) -> None:
        self.name, self.capacity, self.mapping = name, capacity, mapping


class _Lease:
    """One result's hold on its slot: the slot goes back when the last array viewing it is
    garbage collected."""

    __slots__ = ("__weakref__", "left", "lock", "slot", "slots")

    def __init__(self, slots: Slots, slot: _Slot, views: int) -> None:
        self.slots, self.slot, self.left, self.lock = slots, slot, views, threading.Lock()

    def dropped(self) -> None:
        with self.lock:
            self.left -= 1
            last = self.left == 0
        if last:
            self.slots.give_back(self.slot)


class Slots:
    """The reusable segments of one pool, lent one per task (see the module's docstring).

    Results first go to fresh segments; :meth:`observe` learns their size, and from then on
    :meth:`lend` creates slots a little larger than the largest result seen (up to
    :data:`MAX_SLOTS` and :data:`SLOT_BYTES`) and lends free ones. A slot smaller than what
    results need is retired when it comes back. Every retirement starts a new generation, told
    to the workers with the next slot lent, so they unmap what was retired.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._lock = threading.Lock()
        self._by_name: dict[str, _Slot] = {}
        self._free: list[_Slot] = []
        self._back: collections.deque[_Slot] = collections.deque()  # given back, lock-free
        self._want = 0  # bytes a result needs in a slot (0: not known yet)
        self._bytes = 0
        self._ids = itertools.count()
        self.generation = 0
        self.closed = False

    def observe(self, nbytes: int) -> None:
        """A result needed ``nbytes`` of shared memory (rounded to the alignment)."""
        if nbytes > self._want:
            self._want = nbytes

    def lend(self) -> tuple[str, int, int] | None:
        """``(name, capacity, generation)`` of a slot for the next task, or None (fresh
        segments)."""
        want = self._want
        if not want or self.closed:
            return None
        with self._lock:
            while self._back:
                self._return(self._back.popleft())
            while self._free:
                slot = self._free.pop()
                if slot.capacity >= want:
                    return slot.name, slot.capacity, self.generation
                self._retire(slot)
            fresh = self._create(want)
            return None if fresh is None else (fresh.name, fresh.capacity, self.generation)

    def _create(self, want: int) -> _Slot | None:
        capacity = -(-(want + want // 8) // mmap.PAGESIZE) * mmap.PAGESIZE  # room to grow a little
        if len(self._by_name) >= MAX_SLOTS or self._bytes + capacity > SLOT_BYTES:
            return None
        name = f"{self.prefix}s{next(self._ids)}"
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            return None
        try:
            os.ftruncate(fd, capacity)
            mapping = mmap.mmap(fd, capacity)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            return None
        os.close(fd)
        slot = _Slot(name, capacity, mapping)
        self._by_name[name] = slot
        self._bytes += capacity
        return slot

    def give_back(self, slot: _Slot | str | None) -> None:
        """The slot lent for a task is free again (any thread; also from finalizers)."""
        if isinstance(slot, str):
            slot = self._by_name.get(slot)
        if slot is not None:
            self._back.append(slot)

    def _return(self, slot: _Slot) -> None:
        if self._by_name.get(slot.name) is slot:
            self._free.append(slot)

    def _retire(self, slot: _Slot) -> None:
        self._by_name.pop(slot.name, None)
        self._bytes -= slot.capacity
        self.generation += 1
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHM_DIR, slot.name))

    def mapping(self, name: str) -> mmap.mmap:
        """The owner's mapping of slot ``name`` (lent, so nobody views it)."""
        return self._by_name[name].mapping

    def lease(self, name: str, views: int) -> _Lease | None:
        slot = self._by_name.get(name)
        return None if slot is None else _Lease(self, slot, views)

    def reset(self, *, close: bool = False) -> None:
        """Unlink every slot (the pool goes idle, or away): nothing of the pool stays in
        ``/dev/shm``; arrays still viewing a slot keep its memory until collected."""
        with self._lock:
            self.closed = self.closed or close
            for slot in list(self._by_name.values()):
                self._retire(slot)
            self._free.clear()
            self._back.clear()


def _large_bytes(value: Any) -> bool:
    return type(value) is bytes and len(value) >= MIN_BYTES


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def input_bytes(item: Any) -> int:
    """Slot bytes the large ``bytes`` of ``item`` need (0: nothing worth placing): the item
    itself, or the values of a dict (a sample), one level deep."""
    if _large_bytes(item):
        return _aligned(len(item))
    if type(item) is dict:
        return sum(_aligned(len(v)) for v in item.values() if _large_bytes(v))
    return 0


def pack_input(item: Any, slots: Slots, lent: tuple[str, int, int]) -> Any:
    """``item`` with its large ``bytes`` written into the lent slot and replaced by their
    places (for :func:`run_with_input`); the caller checked that they fit."""
    mapping = slots.mapping(lent[0])
    offset = [0]

    def place(value: bytes) -> _Input:
        start = offset[0]
        mapping[start:start + len(value)] = value
        offset[0] = start + _aligned(len(value))
        return _Input(start, len(value))

    if _large_bytes(item):
        return place(item)
    return {k: place(v) if _large_bytes(v) else v for k, v in item.items()}


def restore(value: Any, slots: Slots | None = None, lent: str | None = None) -> Any:
    """Replace handles in a worker's result by arrays/tensors over the segments (fresh ones
    are unlinked); ``lent`` is the slot lent for the task, given back unless the result
    views it."""
    handles: list[_Handle] = []
    _handles(value, _DEPTH, handles)
    in_slot = [h for h in handles if h.offset is not None]
    if slots is not None:
        slots.observe(sum(-(-h.nbytes // _ALIGN) * _ALIGN for h in handles))
        lease = slots.lease(in_slot[0].name, len(in_slot)) if in_slot else None
        for h in in_slot:
            h.lease = lease
        if lent is not None and not in_slot:
            slots.give_back(lent)
    return _restored(value, _DEPTH) if handles else value


def _handles(value: Any, depth: int, out: list[_Handle]) -> None:
    if type(value) is _Handle:
        out.append(value)
    elif depth > 0 and type(value) is dict:
        for v in value.values():
            _handles(v, depth - 1, out)
    elif depth > 0 and type(value) in (list, tuple):
        for v in value:
            _handles(v, depth - 1, out)


def _restored(value: Any, depth: int) -> Any:
    if type(value) is _Handle:
        return _read(value)
    if depth <= 0:
        return value
    if type(value) is dict:
        return {k: _restored(v, depth - 1) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_restored(v, depth - 1) for v in value)
    return value


def discard(value: Any, slots: Slots | None = None, lent: str | None = None) -> None:
    """Remove the segments of a result nobody will read (cancelled, or its stage closed) and
    give back the slot lent for it."""
    handles: list[_Handle] = []
    _handles(value, _DEPTH, handles)
    for h in handles:
        if h.offset is None:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(SHM_DIR, h.name))
    if slots is not None:
        slots.give_back(lent)


def _read(handle: _Handle) -> Any:
    import numpy as np

    if handle.offset is not None:
        return _view(handle)
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


def _view(handle: _Handle) -> Any:
    """The array of ``handle`` viewing its slot; the slot goes back once every view is gone."""
    import numpy as np

    lease, offset = handle.lease, handle.offset
    if lease is None or offset is None:
        raise OSError(f"shared-memory slot {handle.name} is not this pool's")
    # the views hang from a ctypes object (numpy does not collapse the chain past it, unlike
    # an ndarray base), so its finalizer runs exactly when the last view is collected
    anchor = (ctypes.c_char * max(handle.nbytes, 1)).from_buffer(lease.slot.mapping, offset)
    weakref.finalize(anchor, lease.dropped)
    # numpy's stubs list no ctypes array among buffers, though it exports the buffer protocol
    array = np.frombuffer(anchor, dtype=np.dtype(handle.dtype),  # type: ignore[call-overload]
                          count=-1 if handle.nbytes else 0)
    array = array.reshape(handle.shape)
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

