"""Optional SDKs: whether one is installed, and importing one with the install line as the error.

Backends import their SDK on first use, so a missing SDK would otherwise surface as a bare
``ModuleNotFoundError`` from deep inside a request; these helpers turn it into
:class:`~pipeflow.errors.MissingDependencyError`, whose message is the line to run.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from ..errors import MissingDependencyError

__all__ = ["installed", "require"]


def installed(package: str) -> bool:
    """Whether ``package`` can be found (without importing it)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a parent package missing, or a finder refusing it
        return False


def require(module: str, *, extra: str) -> ModuleType:
    """Import ``module``; if it (or its top package) is missing, the typed error with the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = (exc.name or module).split(".")[0]
        raise MissingDependencyError(missing, extra) from exc
