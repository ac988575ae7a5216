"""Small filesystem helpers shared by the stages, the local backend and the data generator."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket

__all__ = ["atomic_write", "create_temp", "pid_alive", "sweep_temps"]

#: directories already swept of dead processes' temporary files, per process (one listing each)
_swept: set[tuple[int, str, str]] = set()


def _host() -> str:
    return socket.gethostname().replace("-", "_").replace(os.sep, "_") or "host"


def create_temp(directory: str, prefix: str) -> tuple[int, str]:
    """Create a new temporary file in ``directory``: ``(fd, path)``, opened for writing.

    Unlike ``tempfile.mkstemp`` (whose files are 0600) the file gets the permissions of any file
    this process writes (0666 less the umask), since it is renamed into place as the published
    file. Its name, ``{prefix}{host}-{pid}-{random}``, says which process made it, so
    :func:`sweep_temps` can remove those of processes that died (SIGKILL) before renaming them.
    """
    sweep_temps(directory, prefix)
    name = f"{prefix}{_host()}-{os.getpid()}-{secrets.token_hex(8)}"
    path = os.path.join(directory, name)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), path


def sweep_temps(directory: str, prefix: str) -> list[str]:
    """Remove the temporary files :func:`create_temp` left in ``directory`` for processes of this
    host that no longer run; the removed paths. Runs once per process and directory (one
    listing), so writing N files into a directory costs one sweep, not N."""
    key = (os.getpid(), os.path.abspath(directory), prefix)
    if key in _swept:
        return []
    _swept.add(key)
    removed = []
    host = _host()
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            owner = _owner(entry.name, prefix)
            if owner is not None and owner[0] == host and not pid_alive(owner[1]):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    removed.append(entry.path)
    return removed


def _owner(name: str, prefix: str) -> tuple[str, int] | None:
    if not name.startswith(prefix):
        return None
    parts = name[len(prefix):].rsplit("-", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists on this host, someone else's live process included.

    The one liveness check behind every sweep of files and shared memory named after the
    process that made them (temporary files here, key tables, shared-memory segments, stats
    channels): a name whose process is gone belongs to nobody and may be removed."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def atomic_write(path: str, data: bytes, *, tmp_prefix: str = ".tmp-") -> None:
    """Write ``data`` to ``path`` so readers see the whole file or none of it.

    The bytes go to a temporary file in the same directory, which then replaces ``path``
    (``os.replace`` is atomic within a filesystem); the temporary file never outlives a failure,
    and one left by a killed process is removed by the next write into that directory. The file
    gets the usual permissions (0666 less the umask), not ``mkstemp``'s 0600.
    """
    fd, tmp = create_temp(os.path.dirname(path) or ".", tmp_prefix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
