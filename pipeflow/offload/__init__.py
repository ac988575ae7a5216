"""Running a pipeline's prefix on a Ray cluster: :meth:`Pipeline.offload <pipeflow.Pipeline.offload>`.

Everything above the point the user names runs on cluster workers (Ray actors), each over its
own share; everything after it runs in the training process. See docs/offload.md.
"""

from ._options import OffloadOptions
from ._stage import RayOffloader
from ._worker import ShareWorker

__all__ = ["OffloadOptions", "RayOffloader", "ShareWorker"]
