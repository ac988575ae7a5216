"""tfrecord-pipe (article 003): SageMaker Pipe mode: every TFRecord file of the channel is
concatenated into one continuous stream (an OS pipe fed by a background thread, as SageMaker's
agent feeds the channel's FIFO), parsed record by record. One stream per channel, so only the
first rank/worker reads it; optional per-epoch shuffle of the file order (``ShuffleConfig``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._common import example_to_sample
from ._info import RecipeInfo
from ._pipe_mode import PipeModeChannel

if TYPE_CHECKING:  # torch loads when the recipe is built, not to list it
    from ..pipeline import Pipeline

INFO = RecipeInfo(
    name="tfrecord-pipe", article="003", layout="tfrecord", backend="boto3 -> pipe", reads=("s3",),
    description="one concatenated TFRecord stream of the whole channel through a pipe, as in "
                "Pipe mode, parsed record by record",
)


def build(url: str, *, shuffle: bool = False, seed: int = 0, backend: str = "boto3") -> Pipeline:
    """Args: ``url`` the channel's prefix; ``shuffle`` shuffle the file order every epoch;
    ``seed`` its seed; ``backend`` the backend feeding the pipe."""
    from ..graph import Node
    from ..pipeline import Pipeline

    kwargs = {"suffix": ".tfrecord", "backend": backend, "shuffle": shuffle, "seed": seed}
    source = Pipeline(Node(PipeModeChannel, (url,), kwargs, (), f"pipe_mode({url!r})"))
    return source.read_tfrecord().map(example_to_sample)
