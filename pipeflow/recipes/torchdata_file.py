"""torchdata-file (article 001): ``FileOpener`` on a mounted path (SageMaker Fast File Mode): the article
opens the local shard paths in order (no URL shuffle or cycle), ``load_from_tar``, pairs, map
to a dict, ``shuffle(10)``."""

from __future__ import annotations

from ..pipeline import Pipeline
from . import RecipeInfo
from ._common import torchdata_chain

INFO = RecipeInfo(
    name="torchdata-file", article="001", layout="wds", backend="local", reads=("local",),
    description="shard files on a mounted path in order, file opener, untar, group pairs, map to "
                "dict, shuffle(10)",
)


def build(url: str, *, seed: int = 0, shuffle_buffer: int = 10, cycle: bool = False) -> Pipeline:
    """Args: ``url`` the mounted directory of the ``.tar`` shards; ``seed`` the shuffle seed (combined
    with the epoch); ``shuffle_buffer`` the sample shuffle buffer (10 in the article);
    ``cycle`` repeat the shard list forever (the article's FFM variant does not)."""
    return torchdata_chain(url, "local", seed=seed, shuffle_buffer=shuffle_buffer, cycle=cycle,
                           shuffle_urls=False)
