"""What the stages that read objects (``open``, ``cache``) share: the URL of an input item, and
one backend per URL scheme created on first use."""

from __future__ import annotations

import dataclasses
import difflib
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..backends.base import Backend
from ..backends.registry import backend_class, backend_for_url, get_backend, known_backends
from ..errors import ConfigError, MissingDependencyError, OptionError
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


def _backend_option_names(names: Iterable[str], *, strict: bool = False) -> set[str]:
    """The option fields of these backends; one that cannot be imported here adds none (its
    missing SDK is reported when it is used, not while checking a spelling).

    With ``strict`` (a single backend the caller named) its missing SDK is raised now: its
    options are unknowable without it, and "no option 'endpoint'" would send the user after a
    spelling mistake they did not make.
    """
    found: set[str] = set()
    for name in names:
        try:
            found.update(f.name for f in dataclasses.fields(backend_class(name).Options))
        except MissingDependencyError:
            if strict:
                raise
        except (ImportError, ConfigError):
            continue
    return found


def check_backend_options(what: str, backend: str | None, options: Mapping[str, Any], *,
                          stage_options: Iterable[str] = ()) -> None:
    """Refuse an option that neither the stage nor the backend has, naming the nearest valid one.

    Options left over after the stage's own go to the backend, so a misspelled stage option
    (``wokers=4``) lands here; it is reported as a misspelling rather than as a backend option.
    With no backend named, any backend's options count as known (the caller then asks for the
    name); with one named, only its options do.

    Raises:
        OptionError: an option no candidate has, with a suggestion when one is close.
        MissingDependencyError: the named backend's SDK is not installed.
    """
    if backend is not None:
        valid = _backend_option_names([backend], strict=True)
    else:
        valid = _backend_option_names(known_backends())
    own = list(stage_options)
    for key in options:
        if key in valid:
            continue
        close = difflib.get_close_matches(key, [*own, *sorted(valid)], n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if backend is None:
            others = "no backend has it either (backend options follow a backend name)"
        else:
            others = f"the {backend!r} backend's options: {', '.join(sorted(valid)) or 'none'}"
        raise OptionError(f"{what}() has no option {key!r}{hint}; its own options: "
                          f"{', '.join(own) or 'none'}; {others}")


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
        stage_options: the stage's own option names, suggested when an option is misspelled.
    """

    def __init__(self, backend: str | Backend | None, options: Mapping[str, Any], *, what: str,
                 options_need_backend: bool = True,
                 choose: Callable[[str], str] = backend_for_url, stage_options: Iterable[str] = ()) -> None:
        self.spec = backend
        self.choose = choose
        self.options = dict(options)
        self._lock = threading.Lock()
        self._by_name: dict[str, Backend] = {}
        if self.options and not isinstance(backend, Backend):
            check_backend_options(what, backend, self.options, stage_options=stage_options)
        if backend is not None:
            self._by_name[""] = get_backend(backend, **self.options)  # validates name and options
        elif self.options and options_need_backend:
            first = next(iter(self.options))
            raise ConfigError(f"{what}(): {first!r} is a backend option and needs an explicit backend "
                              f"name, e.g. {what}(\"obstore\", {first}=...)")

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
