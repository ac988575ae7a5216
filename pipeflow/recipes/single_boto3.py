"""single-boto3 (article 000): one object per field, each pulled into memory with boto3, as the
article's ``BotoSingleSampleDataset`` does with ``download_fileobj`` (a HEAD and a GET each)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..backends import get_backend
from ._common import companions, list_with_suffix, to_sample
from ._info import RecipeInfo

if TYPE_CHECKING:  # torch loads when the recipe is built, not to list it
    from ..pipeline import Pipeline

FIELDS = ("image", "label")

INFO = RecipeInfo(
    name="single-boto3", article="000", layout="single", backend="boto3", reads=("s3",),
    description="per-sample {key}.image/{key}.label objects, each downloaded into memory with "
                "boto3 download_fileobj, in index order",
)


def build(url: str, *, method: str = "download_fileobj", workers: int = 0) -> Pipeline:
    """Args: ``url`` the prefix of the objects; ``method`` the boto3 call; ``workers`` reads in
    flight per DataLoader worker (0: one at a time, as in the article)."""
    backend = get_backend("boto3", method=method)
    return (list_with_suffix(url, ".image", backend=backend)
            .shard_by_rank()                      # whole samples per rank / DataLoader worker
            .map(companions(FIELDS)).unbatch()    # 7.image -> 7.image, 7.label
            .open(backend=backend, read=True, workers=workers)
            .group_pairs(required=FIELDS)
            .map(to_sample(FIELDS)))
