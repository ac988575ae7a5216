"""``with_epoch``: a fixed number of items per rank and epoch, whatever the data and workers.

Training under DDP needs the same number of steps on every rank, and a learning-rate schedule
or a progress bar needs that number up front. ``with_epoch(n)`` makes each rank yield exactly
``n`` items per epoch: its DataLoader workers split the ``n`` between them (worker ``w`` of
``W`` yields ``n // W``, plus one for the first ``n % W`` workers), each cutting its stream
short or wrapping around to the beginning (reshuffled, as ``repeat`` does) to reach its part.
The count depends on neither the data nor the number of workers, so ``len(pipeline)`` is ``n``
and ``len(DataLoader(pipeline, batch_size=b))`` is the number of steps on every rank.
"""

from __future__ import annotations

from typing import Any

from .._checks import check_int
from ..errors import ConfigError
from .base import Stage
from .equalize import Equalizer
from .take import share

__all__ = ["EpochSizer"]


class EpochSizer(Equalizer):
    """Yields exactly ``n`` items per rank and epoch, split over the rank's DataLoader workers.

    Args:
        source: the input stage (after the sharding: each worker sees its own part of the data).
        n: items per rank per epoch (>= 1; 0 is a ``ConfigError``, not an empty epoch).

    A worker whose part of the data is empty raises :class:`~pipeflow.errors.EmptyShardError`
    (it has nothing to repeat), as ``equalize()`` does. Repeats are counted as ``padded`` in
    ``pipe.stats()``.
    """

    @classmethod
    def declared_length(cls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
        n = args[0] if args else kwargs.get("n")
        return int(n) if isinstance(n, int) else None

    def __init__(self, source: Stage[Any], n: int) -> None:
        check_int(n, "with_epoch(n)", low=0)
        if n == 0:
            # an epoch that yields nothing trains on nothing, and every epoch after it too; a
            # computed n (total // (ranks x batch)) comes out 0 when the data is smaller than
            # one step on every rank: said here, not found hours later as an idle job
            raise ConfigError("with_epoch(n) must be a positive int, got 0: every epoch would be "
                              "empty on every rank; if n was computed from the data's size, the "
                              "data holds fewer items than one per rank")
        super().__init__(source, per_shard=0, mode="pad")
        self._per_rank = n

    def target(self) -> int:
        ctx = self.context
        return share(self._per_rank, ctx.worker_id, ctx.num_workers)
