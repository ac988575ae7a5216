"""torchdata-s3fileloader (article 001): ``S3FileLoader`` (the plug-in reborn as a DataPipe).
Its successor, the CRT client of s3torchconnector, opens the shuffled, cycled shard URLs; then
the same chain as torchdata-fsspec."""

from __future__ import annotations

from ..pipeline import Pipeline
from . import RecipeInfo
from ._common import torchdata_chain

INFO = RecipeInfo(
    name="torchdata-s3fileloader", article="001", layout="wds", backend="s3torchconnector", reads=("s3",),
    description="shuffle+cycle shard URLs, CRT client (S3FileLoader's successor), untar, group "
                "pairs, map to dict, shuffle(10)",
)


def build(url: str, *, seed: int = 0, shuffle_buffer: int = 10, cycle: bool = True) -> Pipeline:
    """Args: ``url`` the prefix of the ``.tar`` shards; ``seed`` the shuffle seed (combined
    with the epoch); ``shuffle_buffer`` the sample shuffle buffer (10 in the article);
    ``cycle`` repeat the shard list forever (as in the article; stop by steps)."""
    return torchdata_chain(url, "s3torchconnector", seed=seed, shuffle_buffer=shuffle_buffer, cycle=cycle)
