"""Joining the Ray cluster an offloaded pipeline runs on.

Ray is optional: it is imported here, on first use, with the install line as the error when it is
missing. An address that does not answer is a :class:`~pipeflow.errors.ClusterUnreachableError`
naming it within ``connect_timeout`` seconds; Ray's own client would otherwise retry for much
longer before it fails.
"""

from __future__ import annotations

import os
import socket
from types import ModuleType

from ..backends._optional import require
from ..errors import ClusterError, ClusterUnreachableError

__all__ = ["connect", "ray_module"]

#: Ray settings pipeflow applies when it starts or joins a cluster, unless the user set them:
#: no usage reports (no network beyond the cluster)
_QUIET = {"RAY_USAGE_STATS_ENABLED": "0"}


def ray_module() -> ModuleType:
    """``ray``, or :class:`~pipeflow.errors.MissingDependencyError` with the ``ray`` extra's line."""
    for name, value in _QUIET.items():
        os.environ.setdefault(name, value)
    return require("ray", extra="ray")


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``HOST:PORT`` address; None for Ray's other forms (``auto``,
    ``ray://``), which Ray resolves itself."""
    if "://" in address or ":" not in address:
        return None
    host, _, port = address.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return None


def check_reachable(address: str, timeout: float) -> None:
    """Raise :class:`ClusterUnreachableError` when nothing accepts a connection at ``address``."""
    target = _host_port(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout):
            pass
    except OSError as exc:
        raise ClusterUnreachableError(
            f"no Ray cluster answers at {address} (waited up to {timeout:g}s: {exc}); start one "
            f"with `ray start --head --port={target[1]}` there, or check the address",
            address=address) from exc


def connect(address: str | None, timeout: float) -> ModuleType:
    """Ray, connected: the connection this process has, else ``address`` (checked first), else
    Ray's default. Returns the ``ray`` module."""
    ray = ray_module()
    if ray.is_initialized():
        return ray
    if address is not None:
        check_reachable(address, timeout)
    # a cluster of our own (no address anywhere) starts without the dashboard; joining an
    # existing one, Ray refuses settings of the cluster itself
    local = address is None and not os.environ.get("RAY_ADDRESS")
    extra = {"include_dashboard": False} if local else {}
    try:
        ray.init(address=address, log_to_driver=False, **extra)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterError(f"could not join the Ray cluster at {address or 'the default address'}: "
                           f"{exc}", address=address or "") from exc
    return ray
