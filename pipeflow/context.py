"""Where a pipeline runs: epoch, distributed rank, DataLoader worker, and run statistics."""

from __future__ import annotations

import os
import threading
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["RunContext", "Stats", "detect_rank"]


class Stats:
    """Thread-safe counters keyed by ``(stage name, counter name)``.

    Stages count what they skip (``on_error="skip"``), retry or drop so nothing is lost silently;
    ``Pipeline.stats()`` returns a snapshot after (or during) an epoch.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()

    def incr(self, stage: str, counter: str, n: int = 1) -> None:
        with self._lock:
            self._counts[(stage, counter)] += n

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Returns ``{stage: {counter: value}}``."""
        out: dict[str, dict[str, int]] = {}
        with self._lock:
            for (stage, counter), value in sorted(self._counts.items()):
                out.setdefault(stage, {})[counter] = value
        return out


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
        from .errors import ConfigError

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


@dataclass
class RunContext:
    """Facts shared by every stage of one built pipeline (one iterator)."""

    epoch: int = 0
    rank: int = 0
    world_size: int = 1
    worker_id: int = 0
    num_workers: int = 1
    stats: Stats = field(default_factory=Stats)

    @classmethod
    def detect(cls, epoch: int = 0, stats: Stats | None = None) -> RunContext:
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
        return self.world_size * self.num_workers

    @property
    def in_dataloader_worker(self) -> bool:
        return self.num_workers > 1 or _detect_worker() != (0, 1)
