"""torchdata-iopath (article 001): ``IoPathFileOpener``: shuffle and cycle the shard URLs, open them with
iopath's S3 handler, ``load_from_tar``, group members in pairs, map to a dict, ``shuffle(10)``."""

from __future__ import annotations

from ..pipeline import Pipeline
from . import RecipeInfo
from ._common import torchdata_chain

INFO = RecipeInfo(
    name="torchdata-iopath", article="001", layout="wds", backend="iopath", reads=("s3",),
    description="shuffle+cycle shard URLs, iopath opener, untar, group pairs, map to dict, "
                "shuffle(10)",
)


def build(url: str, *, seed: int = 0, shuffle_buffer: int = 10, cycle: bool = True) -> Pipeline:
    """Args: ``url`` the prefix of the ``.tar`` shards; ``seed`` the shuffle seed (combined
    with the epoch); ``shuffle_buffer`` the sample shuffle buffer (10 in the article);
    ``cycle`` repeat the shard list forever (as in the article; stop by steps)."""
    return torchdata_chain(url, "iopath", seed=seed, shuffle_buffer=shuffle_buffer, cycle=cycle)
