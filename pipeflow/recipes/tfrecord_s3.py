"""tfrecord-s3 (article 003): TFRecord files streamed directly from S3 (one streaming GET per
file), with the same per-epoch seeded file shuffle and sharding as tfrecord-ffm."""

from __future__ import annotations

from ..pipeline import Pipeline
from . import RecipeInfo
from ._common import tfrecord_files_chain

INFO = RecipeInfo(
    name="tfrecord-s3", article="003", layout="tfrecord", backend="boto3", reads=("s3",),
    description="TFRecord files streamed directly from S3, per-epoch seeded file shuffle, sharded "
                "by rank and worker",
)


def build(url: str, *, seed: int = 0, shuffle_files: bool = True, backend: str = "boto3") -> Pipeline:
    """Args: ``url`` the prefix of the ``.tfrecord`` files; ``seed`` the file shuffle seed;
    ``shuffle_files`` shuffle the file list every epoch; ``backend`` the S3 backend."""
    return tfrecord_files_chain(url, backend, seed=seed, shuffle_files=shuffle_files)
