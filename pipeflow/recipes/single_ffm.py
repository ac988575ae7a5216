"""single-ffm (article 000): the single-sample files read with ``open()`` under a mounted path
(SageMaker Fast File Mode or Mountpoint), as the article's ``FFMSingleSampleDataset`` does."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._common import companions, list_with_suffix, to_sample
from ._info import RecipeInfo

if TYPE_CHECKING:  # torch loads when the recipe is built, not to list it
    from ..pipeline import Pipeline

FIELDS = ("image", "label")

INFO = RecipeInfo(
    name="single-ffm", article="000", layout="single", backend="local", reads=("local",),
    description="the {key}.image/{key}.label files under a mounted path, read with open() in "
                "index order",
)


def build(url: str, *, workers: int = 0) -> Pipeline:
    """Args: ``url`` the mounted directory; ``workers`` reads in flight per DataLoader worker."""
    return (list_with_suffix(url, ".image", backend="local")
            .shard_by_rank()
            .map(companions(FIELDS)).unbatch()
            .open(backend="local", read=True, workers=workers)
            .group_pairs(required=FIELDS)
            .map(to_sample(FIELDS)))
