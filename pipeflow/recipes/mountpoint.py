"""mountpoint (article 002): JPEG files under a Mountpoint for Amazon S3 mount, read as local
files in a random order (metadata cached, no data cache)."""

from __future__ import annotations

from ..pipeline import Pipeline
from . import RecipeInfo
from ._common import PREPROCESS_BATCH, random_access_chain

INFO = RecipeInfo(
    name="mountpoint", article="002", layout="jpeg", backend="local", reads=("local",),
    batch_size=PREPROCESS_BATCH,
    description="JPEG files under a mounted path read in a random order, 16 reads in flight; "
                "optional decode+resize 224+batch 128",
)


def build(url: str, *, seed: int = 0, workers: int = 16, preprocess: bool = False) -> Pipeline:
    """Args: ``url`` the mounted directory; ``seed`` the permutation seed; ``workers`` reads in
    flight per DataLoader worker; ``preprocess`` decode, resize to 224x224 and batch 128."""
    return random_access_chain(url, "local", seed=seed, workers=workers, preprocess=preprocess)
