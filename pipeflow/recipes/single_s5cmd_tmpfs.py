"""single-s5cmd-tmpfs (article 000): single-s5cmd downloading into tmpfs (``/dev/shm``) instead
of local disk, the article's variant that skips the disk."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._info import RecipeInfo
from .single_s5cmd import with_download_dir

if TYPE_CHECKING:  # torch loads when the recipe is built, not to list it
    from ..pipeline import Pipeline

INFO = RecipeInfo(
    name="single-s5cmd-tmpfs", article="000", layout="single", backend="s5cmd", reads=("s3",),
    description="single-s5cmd with the 1000-sample downloads going to tmpfs (/dev/shm)",
)


def build(url: str, *, samples_per_call: int = 1000, to: str = "/dev/shm") -> Pipeline:
    """Args: ``url`` the prefix; ``samples_per_call`` samples per ``s5cmd run``; ``to`` a tmpfs
    directory."""
    return with_download_dir(url, samples_per_call, to)
