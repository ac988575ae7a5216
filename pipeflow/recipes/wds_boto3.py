"""wds-boto3 (article 001): tar shards pulled whole into memory with boto3 ``download_fileobj`` (the article's
overridden ``url_opener``), then expanded."""

from __future__ import annotations

from ..backends import get_backend
from ..pipeline import Pipeline
from . import RecipeInfo
from ._common import webdataset_chain

INFO = RecipeInfo(
    name="wds-boto3", article="001", layout="wds", backend="boto3", reads=("s3",),
    description="tar shards pulled into memory with boto3 download_fileobj, shard shuffle, untar,"
                " group, shuffle(10)",
)


def build(url: str, *, seed: int = 0, shuffle_buffer: int = 10) -> Pipeline:
    """Args: ``url`` the prefix of the ``.tar`` shards; ``seed`` the shuffle seed (combined
    with the epoch); ``shuffle_buffer`` the sample shuffle buffer (10 in the article)."""
    backend = get_backend("boto3", method="download_fileobj")
    return webdataset_chain(url, backend, seed=seed, shuffle_buffer=shuffle_buffer)
