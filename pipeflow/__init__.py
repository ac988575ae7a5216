"""pipeflow: streaming training data from object storage and local disk into PyTorch."""

from __future__ import annotations

from . import errors
from .context import RunContext, Stats
from .errors import (
    BackendError,
    ConfigError,
    ObjectNotFoundError,
    PipeflowError,
    StageError,
)
from .items import ObjectInfo, Opened, Record
from .pipeline import Pipeline, from_items, interleave, mix
from .stages.base import Stage

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "ConfigError",
    "ObjectInfo",
    "ObjectNotFoundError",
    "Opened",
    "PipeflowError",
    "Pipeline",
    "Record",
    "RunContext",
    "Stage",
    "StageError",
    "Stats",
    "errors",
    "from_items",
    "interleave",
    "mix",
]
