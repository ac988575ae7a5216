"""mountpoint-cache (article 002): Mountpoint with its local data cache: the first epoch reads
every object and keeps a copy on local disk (LRU beyond ``max_bytes``); later epochs are served
from the cache and send no GET. Give it the mounted directory, or an ``s3://`` prefix to read
misses straight from S3 (the cache then stands in for Mountpoint).

The cache stays on disk after the run, so a second run starts warm: by default under the user's
cache directory (``$XDG_CACHE_HOME/pipeflow/datasets/``, one directory per dataset URL). Where it
is and how much it holds is printed when the pipeline is built; ``pipeflow cache ls`` lists the
caches and ``pipeflow cache clear`` removes them."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from .._usercache import human_bytes, register, usage
from .._words import counted
from ._common import PREPROCESS_BATCH, default_cache_dir, random_access_chain
from ._info import RecipeInfo

if TYPE_CHECKING:  # torch loads when the recipe is built, not to list it
    from ..pipeline import Pipeline

INFO = RecipeInfo(
    name="mountpoint-cache", article="002", layout="jpeg", backend="local or boto3 + disk cache",
    reads=("local", "s3"), batch_size=PREPROCESS_BATCH,
    description="mountpoint with a local LRU disk cache shared by the workers: epochs after the "
                "first issue no GETs; optional decode+resize 224+batch 128",
)


def build(url: str, *, seed: int = 0, workers: int = 16, preprocess: bool = False,
          cache_dir: str | None = None, max_bytes: int = 10 * 2**30) -> Pipeline:
    """Args: ``url`` the mounted directory or an ``s3://`` prefix; ``seed`` the permutation
    seed; ``workers`` reads in flight per DataLoader worker; ``preprocess`` decode, resize to
    224x224 and batch 128; ``cache_dir`` the cache directory (default: one per dataset under
    ``$XDG_CACHE_HOME/pipeflow/datasets``, kept between runs); ``max_bytes`` the cache budget
    (default 10 GiB)."""
    backend = "local" if not url.startswith("s3://") else None
    directory = cache_dir or default_cache_dir(url)
    pipeline = random_access_chain(url, backend, seed=seed, workers=workers, preprocess=preprocess,
                                   cache=(directory, max_bytes))
    if cache_dir is None:
        register(directory, url, max_bytes)
    nbytes, files = usage(directory)
    # a cache that outlives the run is a surprise unless it is announced
    print(f"mountpoint-cache: caching {url} in {directory}: {human_bytes(nbytes)} in "
          f"{counted(files, 'file')} now, budget {human_bytes(max_bytes)}; kept after the run "
          "(`pipeflow cache ls`, `pipeflow cache clear`)", file=sys.stderr)
    return pipeline
