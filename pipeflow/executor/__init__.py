"""pipeflow's executor: worker pools with bounded in-flight work and clean shutdown."""

from .pool import WorkerPool, make_pool

__all__ = ["WorkerPool", "make_pool"]
