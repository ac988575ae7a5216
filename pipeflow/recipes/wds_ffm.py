"""wds-ffm (article 001): tar shards under a mounted path (SageMaker Fast File Mode), read as local files."""

from __future__ import annotations

from ..pipeline import Pipeline
from . import RecipeInfo
from ._common import webdataset_chain

INFO = RecipeInfo(
    name="wds-ffm", article="001", layout="wds", backend="local", reads=("local",),
    description="tar shards under a mounted path, shard shuffle, untar, group, shuffle(10)",
)


def build(url: str, *, seed: int = 0, shuffle_buffer: int = 10) -> Pipeline:
    """Args: ``url`` the mounted directory of the ``.tar`` shards; ``seed`` the shuffle seed (combined
    with the epoch); ``shuffle_buffer`` the sample shuffle buffer (10 in the article)."""
    return webdataset_chain(url, "local", seed=seed, shuffle_buffer=shuffle_buffer)
