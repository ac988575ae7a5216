"""pipeflow: streaming training data from object storage and local disk into PyTorch.

Build a pipeline from a source (:func:`from_items`, :func:`list_objects`,
:func:`tfrecord_stream`) by chaining :class:`Pipeline` methods; iterate it or hand it to a
``DataLoader``. Every error pipeflow raises on purpose is importable from here and from
:mod:`pipeflow.errors`.

Names load on first use, so ``import pipeflow`` is quick and imports neither torch nor any
storage SDK (the ``pipeflow`` command starts without them); ``pipeflow.Pipeline`` imports torch,
a backend imports its SDK when a pipeline first uses it. Submodules: ``pipeflow.backends``,
``pipeflow.errors``, ``pipeflow.formats``, ``pipeflow.recipes``, ``pipeflow.testing``.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

# before any DataLoader forks its workers, so that "said once" flags are shared with them
from . import _once  # noqa: F401

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "RunContext": "run_context",
    "Stats": "stats",
    "ObjectInfo": "items",
    "Opened": "items",
    "Record": "items",
    "Pipeline": "pipeline",
    "MapDataset": "map_dataset",
    "upload": "sinks.upload",
    "from_items": "pipeline",
    "interleave": "pipeline",
    "list_objects": "pipeline",
    "mix": "pipeline",
    "tfrecord_stream": "pipeline",
    "Stage": "stages.base",
    "merge_states": "elastic",
    "RetryPolicy": "backends._retry",
    "ShardManifest": "sinks.manifest",
    **{name: "errors" for name in (
        "AccessDeniedError", "BackendError", "ClusterError", "ClusterUnreachableError",
        "CommandError", "ConfigError", "CorruptDataError",
        "DecodeError", "EmptyShardError", "EndpointUnreachableError", "IncompleteSampleError",
        "InvalidURLError", "MissingDependencyError", "MissingFieldError", "ObjectChangedError",
        "ObjectNotFoundError", "OptionError", "PipeflowError",
        "RetryExhaustedError", "StageContractError", "StageError", "UnknownBackendError",
        "WorkerCrashedError")},
}

_SUBMODULES = ("backends", "errors", "formats", "recipes", "testing")

__all__ = [
    "AccessDeniedError",
    "BackendError",
    "ClusterError",
    "ClusterUnreachableError",
    "CommandError",
    "ConfigError",
    "CorruptDataError",
    "DecodeError",
    "EmptyShardError",
    "EndpointUnreachableError",
    "IncompleteSampleError",
    "InvalidURLError",
    "MapDataset",
    "MissingDependencyError",
    "MissingFieldError",
    "ObjectChangedError",
    "ObjectInfo",
    "ObjectNotFoundError",
    "Opened",
    "OptionError",
    "PipeflowError",
    "Pipeline",
    "Record",
    "RetryExhaustedError",
    "RetryPolicy",
    "RunContext",
    "ShardManifest",
    "Stage",
    "StageContractError",
    "StageError",
    "Stats",
    "UnknownBackendError",
    "WorkerCrashedError",
    "backends",
    "errors",
    "formats",
    "from_items",
    "interleave",
    "list_objects",
    "merge_states",
    "mix",
    "recipes",
    "testing",
    "tfrecord_stream",
    "upload",
]

if _TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ loads on demand
    from . import backends, errors, formats, recipes, testing
    from .backends._retry import RetryPolicy
    from .elastic import merge_states
    from .errors import (
        AccessDeniedError,
        BackendError,
        ClusterError,
        ClusterUnreachableError,
        CommandError,
        ConfigError,
        CorruptDataError,
        DecodeError,
        EmptyShardError,
        EndpointUnreachableError,
        IncompleteSampleError,
        InvalidURLError,
        MissingDependencyError,
        MissingFieldError,
        ObjectChangedError,
        ObjectNotFoundError,
        OptionError,
        PipeflowError,
        RetryExhaustedError,
        StageContractError,
        StageError,
        UnknownBackendError,
        WorkerCrashedError,
    )
    from .items import ObjectInfo, Opened, Record
    from .map_dataset import MapDataset
    from .pipeline import Pipeline, from_items, interleave, list_objects, mix, tfrecord_stream
    from .run_context import RunContext
    from .sinks.manifest import ShardManifest
    from .sinks.upload import upload
    from .stages.base import Stage
    from .stats import Stats


def __getattr__(name: str) -> object:
    import importlib

    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])
