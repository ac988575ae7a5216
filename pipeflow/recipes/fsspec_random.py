"""fsspec-random (article 002): the fsspec-based data loader (TorchData DataPipes on fsspec):
random access to single JPEG objects through s3fs."""

from __future__ import annotations

from ..pipeline import Pipeline
from . import RecipeInfo
from ._common import PREPROCESS_BATCH, random_access_chain

INFO = RecipeInfo(
    name="fsspec-random", article="002", layout="jpeg", backend="fsspec", reads=("s3",),
    batch_size=PREPROCESS_BATCH,
    description="random access to single JPEG objects through fsspec (s3fs), shuffled every "
                "epoch; optional decode+resize 224+batch 128",
)


def build(url: str, *, seed: int = 0, workers: int = 16, preprocess: bool = False) -> Pipeline:
    """Args: ``url`` the prefix of ``{key}.jpg``/``{key}.cls``; ``seed`` the permutation seed;
    ``workers`` requests in flight per DataLoader worker; ``preprocess`` decode, resize to
    224x224 and batch 128."""
    return random_access_chain(url, "fsspec", seed=seed, workers=workers, preprocess=preprocess)
