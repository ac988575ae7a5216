"""single-s5cmd (article 000): the article's ``S5cmdSampler``: the sample list is cut into
chunks of 1000 samples; each chunk is downloaded to local disk by one ``s5cmd run`` while the
previous chunk is consumed (double buffering), and every file is deleted once read."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._common import companions, list_with_suffix, to_sample
from ._info import RecipeInfo

if TYPE_CHECKING:  # torch loads when the recipe is built, not to list it
    from ..pipeline import Pipeline

FIELDS = ("image", "label")

INFO = RecipeInfo(
    name="single-s5cmd", article="000", layout="single", backend="s5cmd", reads=("s3",),
    description="s5cmd run downloads 1000 samples per call to local disk, double-buffered, "
                "files deleted after read",
)


def build(url: str, *, samples_per_call: int = 1000, to: str | None = None) -> Pipeline:
    """Args: ``url`` the prefix; ``samples_per_call`` samples per ``s5cmd run``; ``to`` the
    directory that holds the downloads (default: the system temporary directory, on disk)."""
    return with_download_dir(url, samples_per_call, to)


def with_download_dir(url: str, samples_per_call: int, to: str | None) -> Pipeline:
    """The recipe with downloads under ``to`` (shared with single-s5cmd-tmpfs)."""
    return (list_with_suffix(url, ".image")
            .shard_by_rank()
            .map(companions(FIELDS))              # one item per sample: (7.image, 7.label)
            # one s5cmd run per 1000 samples; the next batch downloads while this one is read;
            # each file is deleted as soon as it is read
            .fetch_batch("s5cmd", batch_size=samples_per_call, to=to, delete=True)
            .unbatch()
            .group_pairs(required=FIELDS)
            .map(to_sample(FIELDS)))
