"""What the stages that read objects (``open``, ``cache``) share: the URL of an input item, and
one backend per URL scheme created on first use."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..backends.base import Backend
from ..backends.registry import backend_for_url, get_backend
from ..errors import ConfigError
from ..items import ObjectInfo

__all__ = ["BackendsByScheme", "url_of"]


def url_of(item: Any, what: str) -> str:
    """The URL of an input item: a string, an :class:`~pipeflow.items.ObjectInfo` or a path."""
    if isinstance(item, str):
        return item
    if isinstance(item, ObjectInfo):
        return item.url
    fspath = getattr(item, "__fspath__", None)
    if fspath is not None:
        return str(fspath())
    raise ConfigError(f"{what}() needs URL strings or ObjectInfo items, got {type(item).__name__}")


class BackendsByScheme:
    """The backend for each URL: the one given, else one per scheme's default, made once.

    Thread-safe (the workers of one stage share it) and picklable (backends pickle without
    their clients, which are created again lazily in the receiving process).

    Args:
        backend: a name, a ready backend, or None to choose by URL scheme.
        options: backend options.
        what: the method name for errors.
        options_need_backend: refuse options without an explicit backend (``open``).
        choose: the default backend's name for a URL (asked per URL, so a process may choose
            differently from its parent).
    """

    def __init__(self, backend: str | Backend | None, options: Mapping[str, Any], *, what: str,
                 options_need_backend: bool = True,
                 choose: Callable[[str], str] = backend_for_url) -> None:
        self.spec = backend
        self.choose = choose
        self.options = dict(options)
        self._lock = threading.Lock()
        self._by_name: dict[str, Backend] = {}
        if backend is not None:
            self._by_name[""] = get_backend(backend, **self.options)  # validates name and options
        elif self.options and options_need_backend:
            raise ConfigError(f"{what}(): backend options need an explicit backend= name")

    def for_url(self, url: str) -> Backend:
        fixed = self._by_name.get("")
        if fixed is not None:
            return fixed
        name = self.choose(url)
        backend = self._by_name.get(name)
        if backend is None:
            with self._lock:
                backend = self._by_name.get(name)
                if backend is None:
                    backend = self._by_name[name] = get_backend(name, **self.options)
        return backend

    def close(self) -> None:
        for backend in list(self._by_name.values()):
            backend.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec, "options": self.options, "_by_name": dict(self._by_name),
                "choose": self.choose}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
