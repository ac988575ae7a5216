"""tfrecord-ffm (article 003): TFRecord files read from a SageMaker Fast File Mode mount, the
file list shuffled per epoch with a recorded seed and sharded across ranks and workers. To
change the data mix during training, build one pipeline per source and combine them with
``pipeflow.mix(pipelines, weights=f(epoch, step))``."""

from __future__ import annotations

from ..pipeline import Pipeline
from . import RecipeInfo
from ._common import tfrecord_files_chain

INFO = RecipeInfo(
    name="tfrecord-ffm", article="003", layout="tfrecord", backend="local", reads=("local",),
    description="TFRecord files under a mounted path, per-epoch seeded file shuffle, sharded by "
                "rank and worker, streamed record by record",
)


def build(url: str, *, seed: int = 0, shuffle_files: bool = True) -> Pipeline:
    """Args: ``url`` the mounted directory; ``seed`` the file shuffle seed (combined with the
    epoch); ``shuffle_files`` shuffle the file list every epoch."""
    return tfrecord_files_chain(url, "local", seed=seed, shuffle_files=shuffle_files)
