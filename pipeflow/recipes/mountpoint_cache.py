"""mountpoint-cache (article 002): Mountpoint with its local data cache: the first epoch reads
every object and keeps a copy on local disk (LRU beyond ``max_bytes``); later epochs are served
from the cache and send no GET. Give it the mounted directory, or an ``s3://`` prefix to read
misses straight from S3 (the cache then stands in for Mountpoint)."""

from __future__ import annotations

from ..pipeline import Pipeline
from ._common import PREPROCESS_BATCH, default_cache_dir, random_access_chain
from ._info import RecipeInfo

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
    the temporary directory); ``max_bytes`` the cache budget (default 10 GiB)."""
    backend = "local" if not url.startswith("s3://") else None
    cache = (cache_dir or default_cache_dir(url), max_bytes)
    return random_access_chain(url, backend, seed=seed, workers=workers, preprocess=preprocess,
                               cache=cache)
