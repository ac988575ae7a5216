"""Storage backends: one contract, a lazy registry, one module per SDK.

``import pipeflow.backends`` imports no SDK; a backend's module (and its SDK) is imported the
first time the backend is requested by name or URL scheme.
"""

from __future__ import annotations

from ._retry import RetryPolicy
from .base import Backend, BackendOptions, S3Location, parse_s3_url, scheme_of
from .batch import BatchDownloader, BatchHandle, ThreadPoolBatch
from .registry import (
    BackendSpec,
    backend_class,
    backend_for_url,
    backend_specs,
    get_backend,
    known_backends,
    register_backend,
    unregister_backend,
)

__all__ = [
    "Backend",
    "BackendOptions",
    "BackendSpec",
    "BatchDownloader",
    "BatchHandle",
    "RetryPolicy",
    "S3Location",
    "ThreadPoolBatch",
    "backend_class",
    "backend_for_url",
    "backend_specs",
    "get_backend",
    "known_backends",
    "parse_s3_url",
    "register_backend",
    "scheme_of",
    "unregister_backend",
]
