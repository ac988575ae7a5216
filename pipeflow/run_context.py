"""Where a pipeline runs: epoch, distributed rank and DataLoader worker (:class:`RunContext`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .errors import ConfigError
from .stats import Stats

__all__ = ["RunContext", "detect_rank"]


def detect_rank() -> tuple[int, int]:
    """Returns ``(rank, world_size)``.

    Taken from ``torch.distributed`` when it is initialised, else from the ``RANK`` and
    ``WORLD_SIZE`` environment variables that ``torchrun`` sets, else ``(0, 1)``.
    """
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:  # torch is a dependency, but keep this module importable without it
        pass
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"inconsistent RANK={rank} / WORLD_SIZE={world} in the environment")
    return rank, world


def _detect_worker() -> tuple[int, int]:
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return 0, 1
    info = get_worker_info()
    if info is None:
        return 0, 1
    return info.id, info.num_workers


def _in_worker() -> bool:
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return False
    return get_worker_info() is not None


@dataclass
class RunContext:
    """Facts shared by every stage of one built pipeline (one iterator)."""

    epoch: int = 0
    rank: int = 0
    world_size: int = 1
    worker_id: int = 0
    num_workers: int = 1
    stats: Stats = field(default_factory=Stats)
    #: set when a DataLoader worker's pass ends in KeyboardInterrupt: the process is ending, and
    #: stages stop their threads without waiting for them (see PipelineIterator.__next__)
    interrupted: bool = False
    #: set when the main process's iteration ends in KeyboardInterrupt (Ctrl-C, or SIGTERM on the
    #: CLI): stages wait for their threads at most ``STOP_GRACE_SECONDS``, then leave a thread
    #: stuck in a call that does not return (a hung read) behind, so the interrupt reaches the
    #: caller and the interpreter can exit
    stopping: bool = False

    @classmethod
    def detect(cls, epoch: int = 0, stats: Stats | None = None) -> RunContext:
        """The context of the calling process: rank and world size, DataLoader worker id and count."""
        rank, world = detect_rank()
        worker_id, num_workers = _detect_worker()
        return cls(epoch=epoch, rank=rank, world_size=world, worker_id=worker_id,
                   num_workers=num_workers, stats=stats or Stats())

    @property
    def shard_index(self) -> int:
        """This process's index among all ranks times DataLoader workers."""
        return self.rank * self.num_workers + self.worker_id

    @property
    def num_shards(self) -> int:
        """The number of shards the data is split into: ranks times DataLoader workers."""
        return self.world_size * self.num_workers

    @property
    def in_dataloader_worker(self) -> bool:
        """True inside a DataLoader worker process (also the only one of ``num_workers=1``,
        whose worker id and count look like no worker at all)."""
        return self.num_workers > 1 or _in_worker()
