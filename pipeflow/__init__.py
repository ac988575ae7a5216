"""pipeflow: streaming training data from object storage and local disk into PyTorch.

Build a pipeline from a source (:func:`from_items`, :func:`list_objects`,
:func:`tfrecord_stream`) by chaining :class:`Pipeline` methods; iterate it or hand it to a
``DataLoader``. Submodules load on first use: ``pipeflow.recipes``, ``pipeflow.testing``,
``pipeflow.formats``, ``pipeflow.backends``.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import errors
from .errors import (
    BackendError,
    ConfigError,
    CorruptDataError,
    DecodeError,
    IncompleteSampleError,
    MissingDependencyError,
    ObjectNotFoundError,
    PipeflowError,
    StageError,
)
from .items import ObjectInfo, Opened, Record
from .pipeline import Pipeline, from_items, interleave, list_objects, mix, tfrecord_stream
from .run_context import RunContext
from .stages.base import Stage
from .stats import Stats

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "ConfigError",
    "CorruptDataError",
    "DecodeError",
    "IncompleteSampleError",
    "MissingDependencyError",
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
    "list_objects",
    "mix",
    "tfrecord_stream",
]

_LAZY_SUBMODULES = ("backends", "formats", "recipes", "testing")


def __getattr__(name: str) -> Any:
    # pf.recipes.load(...) works without importing every recipe at `import pipeflow`
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
