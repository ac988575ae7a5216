"""single-s5cmd (article 000): the article's ``S5cmdSampler``: the sample list is cut into
chunks of 1000 samples; each chunk is downloaded to local disk by one ``s5cmd run`` while the
previous chunk is consumed (double buffering), and every file is deleted once read."""

from __future__ import annotations

import os
import tempfile

from ..pipeline import Pipeline
from . import RecipeInfo
from ._common import companions, list_with_suffix, to_sample

FIELDS = ("image", "label")

INFO = RecipeInfo(
    name="single-s5cmd", article="000", layout="single", backend="s5cmd", reads=("s3",),
    description="s5cmd run downloads 1000 samples per call to local disk, double-buffered, "
                "files deleted after read",
)


def build(url: str, *, samples_per_call: int = 1000, to: str | None = None) -> Pipeline:
    """Args: ``url`` the prefix; ``samples_per_call`` samples per ``s5cmd run``; ``to`` the
    download directory (default: a directory under the system temporary directory)."""
    to = to or os.path.join(tempfile.gettempdir(), "pipeflow-s5cmd")
    return with_download_dir(url, samples_per_call, to)


def with_download_dir(url: str, samples_per_call: int, to: str) -> Pipeline:
    """The recipe with downloads under ``to`` (shared with single-s5cmd-tmpfs)."""
    return (list_with_suffix(url, ".image")
            .shard_by_rank()
            .map(companions(FIELDS)).unbatch()
            # one s5cmd call per 1000 samples (2000 files); the next call runs while this
            # chunk is read; files are removed as soon as they are read
            .fetch_batch("s5cmd", batch_size=samples_per_call * len(FIELDS), to=to)
            .group_pairs(required=FIELDS)
            .map(to_sample(FIELDS)))
