"""s3connector-shards (article 002): the S3 Connector for PyTorch's iterable dataset reading tar
shards sequentially: one GET per shard, samples in shard order."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._common import ALL, JPEG_FIELDS, PREPROCESS_BATCH, list_with_suffix, preprocess_002, to_sample
from ._info import RecipeInfo

if TYPE_CHECKING:  # torch loads when the recipe is built, not to list it
    from ..pipeline import Pipeline

INFO = RecipeInfo(
    name="s3connector-shards", article="002", layout="jpeg-shards", backend="s3torchconnector",
    reads=("s3",), batch_size=PREPROCESS_BATCH,
    description="sequential reads of JPEG tar shards with the CRT client, one GET per shard; "
                "optional decode+resize 224+batch 128",
)


def build(url: str, *, seed: int = 0, shuffle_shards: bool = True, preprocess: bool = False) -> Pipeline:
    """Args: ``url`` the prefix of the ``.tar`` shards; ``seed`` the shard shuffle seed;
    ``shuffle_shards`` shuffle the shard order every epoch (samples stay sequential inside a
    shard); ``preprocess`` decode, resize to 224x224 and batch 128."""
    pipeline = list_with_suffix(url, ".tar", backend="s3torchconnector")
    if shuffle_shards:
        pipeline = pipeline.shuffle(ALL, seed=seed)
    pipeline = (pipeline.shard_by_rank()
                .open(backend="s3torchconnector")
                .untar()
                .group_pairs(required=JPEG_FIELDS)
                .map(to_sample(JPEG_FIELDS)))
    return preprocess_002(pipeline, enabled=preprocess)
