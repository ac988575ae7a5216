"""wds-s3fs (article 001): tar shards opened as files with s3fs (``fs.open(url, 'rb')``)."""

from __future__ import annotations

from ..pipeline import Pipeline
from . import RecipeInfo
from ._common import webdataset_chain

INFO = RecipeInfo(
    name="wds-s3fs", article="001", layout="wds", backend="s3fs", reads=("s3",),
    description="tar shards opened with s3fs, shard shuffle, untar, group, shuffle(10)",
)


def build(url: str, *, seed: int = 0, shuffle_buffer: int = 10) -> Pipeline:
    """Args: ``url`` the prefix of the ``.tar`` shards; ``seed`` the shuffle seed (combined
    with the epoch); ``shuffle_buffer`` the sample shuffle buffer (10 in the article)."""
    return webdataset_chain(url, "s3fs", seed=seed, shuffle_buffer=shuffle_buffer)
