"""s3connector-map (article 002): the S3 Connector for PyTorch's map-style dataset: random access
to single ~115 KB JPEG objects, a new permutation every epoch, many GETs in flight."""

from __future__ import annotations

from ..pipeline import Pipeline
from . import RecipeInfo
from ._common import PREPROCESS_BATCH, random_access_chain

INFO = RecipeInfo(
    name="s3connector-map", article="002", layout="jpeg", backend="s3torchconnector", reads=("s3",),
    batch_size=PREPROCESS_BATCH,
    description="random access to single JPEG objects with the CRT client, shuffled every epoch, "
                "16 GETs in flight; optional decode+resize 224+batch 128",
)


def build(url: str, *, seed: int = 0, workers: int = 16, preprocess: bool = False) -> Pipeline:
    """Args: ``url`` the prefix of ``{key}.jpg``/``{key}.cls``; ``seed`` the permutation seed;
    ``workers`` requests in flight per DataLoader worker; ``preprocess`` decode, resize to
    224x224 and batch 128 (then use ``DataLoader(batch_size=None)``)."""
    return random_access_chain(url, "s3torchconnector", seed=seed, workers=workers, preprocess=preprocess)
