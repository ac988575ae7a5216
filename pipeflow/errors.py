"""The pipeflow exception hierarchy.

Every error pipeflow raises on purpose derives from :class:`PipeflowError`. Where a builtin
category fits, the class also derives from it (``ConfigError`` is a ``ValueError``,
``ObjectNotFoundError`` a ``FileNotFoundError``) so ordinary ``except`` clauses keep working.
All classes pickle, so they cross process boundaries (DataLoader and process workers) intact.
"""

from __future__ import annotations

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
    "MissingDependencyError",
    "MissingFieldError",
    "ObjectChangedError",
    "ObjectNotFoundError",
    "OptionError",
    "PipeflowError",
    "RetryExhaustedError",
    "StageContractError",
    "StageError",
    "UnknownBackendError",
    "WorkerCrashedError",
]


class PipeflowError(Exception):
    """Root of every error pipeflow raises deliberately."""


class ConfigError(PipeflowError, ValueError):
    """An option has the wrong type or value, or stages are combined in an invalid way."""


class OptionError(ConfigError, TypeError):
    """A stage or backend got an option it does not have (a misspelling, usually); the message
    suggests the nearest valid name and lists them all."""


class StageContractError(PipeflowError, TypeError):
    """A :class:`~pipeflow.stages.base.Stage` subclass bypassed the base class's lifecycle (did
    not call ``super().__init__()`` or ``super().reset()``), which would otherwise restart the
    stage on every item and never end."""


#: The distribution name on the package index. The import name stays ``pipeflow``; the index's
#: ``pipeflow`` is an unrelated project, so no install line may name it.
DISTRIBUTION = "pipeflow-data"


def install_line(extra: str) -> str:
    """The ``pip install`` line for one extra: from the index, and from a source checkout (the
    only route until the distribution is published)."""
    return f"pip install '{DISTRIBUTION}[{extra}]' (from a source checkout: pip install -e '.[{extra}]')"


class MissingDependencyError(PipeflowError, ImportError):
    """An optional dependency is not installed; the message is the ``pip install`` line.

    ``extra`` names pipeflow's extra for the package; a package no extra provides (the
    filesystem an fsspec protocol needs, such as ``gcsfs``) gives its own ``install`` line.
    """

    def __init__(self, package: str, extra: str, install: str | None = None) -> None:
        self.package = package
        self.extra = extra
        self.install = install
        super().__init__(f"{package} is required for this feature: {install or install_line(extra)}")

    def __reduce__(self):  # keep pickling working despite the custom __init__
        return (type(self), (self.package, self.extra, self.install))


class BackendError(PipeflowError):
    """A storage operation failed.

    Attributes:
        url: the object or prefix the operation was about.
        backend: the backend name (``"boto3"``, ``"local"``, ...).
        op: the operation (``"open"``, ``"list"``, ``"read"``, ...).
    """

    def __init__(self, message: str, *, url: str = "", backend: str = "", op: str = "") -> None:
        self.message = message
        self.url = url
        self.backend = backend
        self.op = op
        where = ", ".join(
            part for part in (f"url={url!r}" if url else "", f"backend={backend}" if backend else "",
                              f"op={op}" if op else "") if part
        )
        super().__init__(f"{message} ({where})" if where else message)

    def __reduce__(self):
        return (_rebuild_backend_error, (type(self), self.message, self.url, self.backend, self.op))


def _rebuild_backend_error(cls, message, url, backend, op):
    return cls(message, url=url, backend=backend, op=op)


class ObjectNotFoundError(BackendError, FileNotFoundError):
    """The object or prefix does not exist."""


class AccessDeniedError(BackendError, PermissionError):
    """The credentials in use may not perform the operation."""


class InvalidURLError(BackendError, ConfigError):
    """The URL cannot be parsed or has a scheme no backend handles."""


class UnknownBackendError(ConfigError):
    """No backend is registered under the requested name."""


class RetryExhaustedError(BackendError):
    """A transient failure persisted past the retry budget."""


class EndpointUnreachableError(BackendError, ConnectionError):
    """The endpoint has never answered in this process: it refuses connections, or its host
    name does not resolve. Raised within seconds (``RetryPolicy.first_contact``), not after the
    whole retry budget: that is a wrong endpoint or a server not started, not an outage."""


class ObjectChangedError(BackendError):
    """The object was replaced while it was being read: its ETag changed between two requests
    for parts of it, so the bytes read so far and the rest would mix two versions."""


class StageError(PipeflowError):
    """A stage failed on a particular item or sample.

    Attributes:
        stage: the stage's name as shown by ``Pipeline.explain()``.
        key: the sample key, URL or item description the failure is about.
    """

    def __init__(self, message: str, *, stage: str = "", key: str = "") -> None:
        self.message = message
        self.stage = stage
        self.key = key
        where = ", ".join(p for p in (f"stage={stage}" if stage else "", f"key={key!r}" if key else "") if p)
        super().__init__(f"{message} ({where})" if where else message)

    def __reduce__(self):
        return (_rebuild_stage_error, (type(self), self.message, self.stage, self.key))


def _rebuild_stage_error(cls, message, stage, key):
    return cls(message, stage=stage, key=key)


class CorruptDataError(StageError):
    """An archive or record stream is truncated or malformed."""


class DecodeError(StageError):
    """A field could not be decoded."""


class IncompleteSampleError(StageError):
    """A grouped sample lacks a required field or repeats one."""


class MissingFieldError(IncompleteSampleError):
    """A sample dict lacks a field a stage asked for by name (``to_tuple``, ``rename``,
    ``map_dict``).

    Attributes:
        field: the field asked for (``"jpg;png"`` for alternatives).
        fields: the fields the sample has.
    """

    def __init__(self, message: str, *, stage: str = "", key: str = "", field: str = "",
                 fields: tuple[str, ...] = ()) -> None:
        self.field = field
        self.fields = tuple(fields)
        super().__init__(message, stage=stage, key=key)

    def __reduce__(self):
        return (_rebuild_missing_field, (self.message, self.stage, self.key, self.field, self.fields))


def _rebuild_missing_field(message, stage, key, field, fields):
    return MissingFieldError(message, stage=stage, key=key, field=field, fields=fields)


class WorkerCrashedError(PipeflowError, RuntimeError):
    """A worker process died without reporting an error (killed, out of memory, segfault)."""


class CommandError(BackendError):
    """An external command (the ``pipe`` backend, ``pipe:`` URLs) exited with a non-zero status.

    Attributes:
        command: the command line, shell-quoted for display (it was never run by a shell).
        returncode: the exit status (negative: killed by that signal).
        stderr: the last part of what the command wrote to stderr.
    """

    def __init__(self, message: str, *, url: str = "", backend: str = "", op: str = "",
                 command: str = "", returncode: int | None = None, stderr: str = "") -> None:
        self.command = command
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(message, url=url, backend=backend, op=op)

    def __reduce__(self):
        return (_rebuild_command_error, (type(self), self.message, self.url, self.backend, self.op,
                                         self.command, self.returncode, self.stderr))


def _rebuild_command_error(cls, message, url, backend, op, command, returncode, stderr):
    return cls(message, url=url, backend=backend, op=op, command=command, returncode=returncode,
               stderr=stderr)


class EmptyShardError(ConfigError):
    """A rank x DataLoader worker shard received no items, so it cannot yield its equal share."""


class ClusterError(PipeflowError):
    """The compute cluster an offloaded pipeline runs on (:meth:`Pipeline.offload`) failed:
    it refused the connection, or a cluster worker kept dying after its restarts.

    Attributes:
        address: the cluster's address as given (empty: the cluster of this process).
    """

    def __init__(self, message: str, *, address: str = "") -> None:
        self.message = message
        self.address = address
        super().__init__(message)

    def __reduce__(self):
        return (_rebuild_cluster_error, (type(self), self.message, self.address))


def _rebuild_cluster_error(cls, message, address):
    return cls(message, address=address)


class ClusterUnreachableError(ClusterError, ConnectionError):
    """Nothing answers at the cluster's address (checked within seconds, before any wait)."""
