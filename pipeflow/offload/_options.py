"""The options of :meth:`Pipeline.offload <pipeflow.Pipeline.offload>`, checked where the
pipeline is written."""

from __future__ import annotations

from dataclasses import dataclass

from .._checks import check_int
from ..errors import ConfigError

__all__ = ["OffloadOptions"]


@dataclass(frozen=True)
class OffloadOptions:
    """How the prefix of an offloaded pipeline runs on the cluster.

    Attributes:
        workers: cluster workers (Ray actors) per training rank. Worker ``a`` of rank ``r``
            reads the share a DataLoader worker ``a`` of rank ``r`` would read, so the split,
            the global order and a saved position mean the same as with ``num_workers=workers``.
        inflight: items each worker may have computed ahead of the training process; the
            bound per rank is ``workers * inflight`` items in the object store (backpressure).
        address: the cluster to join (``"HOST:PORT"`` of a ``ray start --head``); None uses
            the Ray connection this process already has, else Ray's own default
            (``RAY_ADDRESS``, else a local cluster started for this process).
        cpus: CPUs each worker reserves on the cluster (Ray's ``num_cpus``).
        restarts: how many times one worker may die in an epoch and be replaced (its share
            continues from the last item the training process received) before the epoch
            fails with :class:`~pipeflow.errors.WorkerCrashedError`.
        connect_timeout: seconds to wait for ``address`` to answer before
            :class:`~pipeflow.errors.ClusterUnreachableError`.
        start_timeout: seconds a worker may wait for the cluster to place it (free CPUs)
            before :class:`~pipeflow.errors.ClusterError`, rather than wait forever.
    """

    workers: int = 2
    inflight: int = 2
    address: str | None = None
    cpus: float = 1.0
    restarts: int = 3
    connect_timeout: float = 5.0
    start_timeout: float = 60.0

    def __post_init__(self) -> None:
        check_int(self.workers, "offload(workers=...)", low=1)
        check_int(self.inflight, "offload(inflight=...)", low=1)
        check_int(self.restarts, "offload(restarts=...)", low=0)
        if self.address is not None and (not isinstance(self.address, str) or not self.address.strip()):
            raise ConfigError(f"offload(address=...) must be 'HOST:PORT' or None, got {self.address!r}")
        for name in ("cpus", "connect_timeout", "start_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"offload({name}=...) must be a positive number, got {value!r}")

    def shown(self) -> dict[str, object]:
        """The options explain() shows: the ones that differ from the defaults, and ``workers``."""
        defaults = OffloadOptions()
        shown: dict[str, object] = {"workers": self.workers}
        for name in ("inflight", "address", "cpus", "restarts"):
            if getattr(self, name) != getattr(defaults, name):
                shown[name] = getattr(self, name)
        return shown
