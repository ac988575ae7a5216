"""wds-s3-plugin (article 001): the retired Amazon S3 PyTorch plug-in's
``S3IterableDataset(urls, shuffle_urls=True)``, consecutive members paired into samples. The CRT
client of s3torchconnector replaces the plug-in. The article adds no sample shuffle buffer."""

from __future__ import annotations

from ..pipeline import Pipeline
from . import RecipeInfo
from ._common import webdataset_chain

INFO = RecipeInfo(
    name="wds-s3-plugin", article="001", layout="wds", backend="s3torchconnector", reads=("s3",),
    description="tar shards streamed by the CRT client (s3torchconnector, the plug-in's "
                "successor), shuffled URLs, untar, pairs",
)


def build(url: str, *, seed: int = 0, shuffle_buffer: int = 0) -> Pipeline:
    """Args: ``url`` the prefix of the ``.tar`` shards; ``seed`` the shuffle seed (combined
    with the epoch); ``shuffle_buffer`` the sample shuffle buffer (0: none, as in the article)."""
    return webdataset_chain(url, "s3torchconnector", seed=seed, shuffle_buffer=shuffle_buffer)
