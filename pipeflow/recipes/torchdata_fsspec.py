"""torchdata-fsspec (article 001): ``FSSpecFileOpener``: the same chain as torchdata-iopath with an fsspec
(s3fs) opener."""

from __future__ import annotations

from ..pipeline import Pipeline
from . import RecipeInfo
from ._common import torchdata_chain

INFO = RecipeInfo(
    name="torchdata-fsspec", article="001", layout="wds", backend="fsspec", reads=("s3",),
    description="shuffle+cycle shard URLs, fsspec opener, untar, group pairs, map to dict, "
                "shuffle(10)",
)


def build(url: str, *, seed: int = 0, shuffle_buffer: int = 10, cycle: bool = True) -> Pipeline:
    """Args: ``url`` the prefix of the ``.tar`` shards; ``seed`` the shuffle seed (combined
    with the epoch); ``shuffle_buffer`` the sample shuffle buffer (10 in the article);
    ``cycle`` repeat the shard list forever (as in the article; stop by steps)."""
    return torchdata_chain(url, "fsspec", seed=seed, shuffle_buffer=shuffle_buffer, cycle=cycle)
