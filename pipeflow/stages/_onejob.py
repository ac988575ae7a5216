"""Doing a thing once per job: rank 0 does it, every other rank receives the result.

Under ``torchrun`` every rank runs the same script, so a listing written in it would run once
per rank: ``ranks x ceil(N / 1000)`` requests. With a process group initialised (``gloo`` or
``nccl``), :func:`on_lead` runs the work on rank 0 only and broadcasts its result, or the error
it raised, to the others, which therefore wait for it (a barrier). Without a process group each
process is its own job.

A result that is a :class:`KeyTable` (a large listing, an index read from the store) is sent and
held once per node: its bytes go from rank 0 to the node leaders only (the ranks whose
``LOCAL_RANK`` is 0, in a process group of their own), each leader writes its node's file named
by the checksum (:meth:`KeyTable.on_node`) while the other ranks wait, and those map that file
(:meth:`KeyTable.at_node`), told only the checksum.

Cost: one broadcast of a small header to every rank per call, plus the table's bytes (30-90
bytes a key) to each node once: ``N x nodes`` bytes, not ``N x ranks``. Finding the leaders is
an all-gather of one integer a rank and one ``new_group``, once per process group. When some
rank has no ``LOCAL_RANK``, the bytes go to every rank and each writes or maps the node's file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from ..keytable import KeyTable

__all__ = ["job_rank", "on_lead", "received_bytes"]

T = TypeVar("T")


def job_rank() -> tuple[int, int]:
    """``(rank, world size)`` of the initialised default process group, else ``(0, 1)``."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a dependency
        return 0, 1
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def on_lead(work: Callable[[], T]) -> T:
    """``work()`` on rank 0; its result (or exception) on every rank. Every rank must call it."""
    rank, world = job_rank()
    if world == 1:
        return work()
    import torch.distributed as dist

    leaders = _node_leaders()
    box: list[Any] = [None]
    table: _TableBytes | None = None
    if rank == 0:
        try:
            box[0] = ("ok", _packed(work()))
        except Exception as exc:  # handed to the other ranks, then raised here too
            box[0] = ("error", exc)
        if box[0][0] == "ok" and isinstance(box[0][1], _TableBytes) and leaders is not None:
            table = box[0][1]
            box[0] = ("table", _TableName(KeyTable.digest_of(table)))
    dist.broadcast_object_list(box, src=0)
    kind, value = box[0]
    if kind == "error":
        raise value
    if kind == "table":
        assert leaders is not None
        return _on_nodes(leaders, table, value)  # type: ignore[return-value]
    return _unpacked(value)


class _TableBytes(bytes):
    """The content of a :class:`KeyTable` file, sent instead of its path (ranks may be on other
    nodes, and the file belongs to rank 0's process)."""


class _TableName(str):
    """The checksum of a table sent to one rank a node, which the other ranks map."""


#: the group of one rank a node (``LOCAL_RANK`` 0) and its members, for the default process
#: group it was made in (held, so that a later default group is never mistaken for it)
_leaders: dict[str, tuple[Any, tuple[Any, list[int]] | None]] = {}


def _node_leaders() -> tuple[Any, list[int]] | None:
    """The process group of the ranks with ``LOCAL_RANK`` 0 and those ranks, made once per default
    group (every rank takes part: an all-gather of one integer a rank, then ``new_group``); None
    when some rank has no ``LOCAL_RANK``, or rank 0 is not a local rank 0."""
    import torch.distributed as dist

    world = dist.group.WORLD
    cached = _leaders.get("world")
    if cached is None or cached[0] is not world:
        local = os.environ.get("LOCAL_RANK", "")
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, int(local) if local.isdigit() else -1)
        members = [r for r, lr in enumerate(every) if lr == 0]
        found = None if -1 in every or not members or members[0] != 0 else (
            dist.new_group(ranks=members), members)
        cached = _leaders["world"] = (world, found)
    return cached[1]


def _on_nodes(leaders: tuple[Any, list[int]], data: _TableBytes | None, digest: str) -> KeyTable:
    """Rank 0's table on every rank, its bytes sent to one rank a node: that rank writes the
    node's file (:meth:`KeyTable.on_node`) while the others wait, then they map it."""
    import torch.distributed as dist

    group, members = leaders
    table: KeyTable | None = None
    try:
        if dist.get_rank() in members:
            box: list[Any] = [data]
            dist.broadcast_object_list(box, src=0, group=group)
            global _received
            _received += len(box[0]) if dist.get_rank() != 0 else 0
            table = KeyTable.on_node(box[0])
    finally:
        dist.barrier()  # every rank passes it once, whether the first ones succeeded or raised
    return table if table is not None else KeyTable.at_node(digest)


#: bytes of tables this process received from rank 0 (what one listing costs the network here)
_received = 0


def received_bytes() -> int:
    """Bytes of key tables this process has received from rank 0 so far."""
    return _received


def _packed(value: Any) -> Any:
    if isinstance(value, KeyTable):
        import io

        buf = io.BytesIO()
        value.save(buf)
        # rank 0's own file goes with ``value`` now: rank 0 too maps its node's shared file
        return _TableBytes(buf.getvalue())
    return value


def _unpacked(value: Any) -> Any:
    if isinstance(value, _TableBytes):
        global _received
        _received += len(value) if job_rank()[0] != 0 else 0
        return _on_node(value)
    return value


def _on_node(data: bytes) -> KeyTable:
    """The node's one table of ``data``: the local rank 0 writes it first (the other local ranks
    wait at a barrier, then find it written); without ``LOCAL_RANK`` every rank is first and the
    file is still written once (:meth:`KeyTable.on_node` links it in place atomically)."""
    import torch.distributed as dist

    first = os.environ.get("LOCAL_RANK", "0") == "0"
    try:
        if first:
            return KeyTable.on_node(data)
    finally:
        dist.barrier()  # every rank passes it once, whether the first ones succeeded or raised
    return KeyTable.on_node(data)
