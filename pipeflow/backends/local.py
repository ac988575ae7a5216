"""``local``: plain files and mounted paths (FUSE mounts such as Mountpoint or SageMaker FFM)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from pipeflow._checks import check_bool, is_int
from pipeflow._fs import create_temp
from pipeflow._io import read_exact
from pipeflow.backends.base import Backend, BackendOptions, local_path, scheme_of
from pipeflow.errors import AccessDeniedError, BackendError, ConfigError, ObjectNotFoundError
from pipeflow.items import ObjectInfo

log = logging.getLogger("pipeflow")

__all__ = ["LocalBackend", "LocalOptions"]

#: the temporary files of uploads in progress (``.upload-{host}-{pid}-{random}``)
_UPLOAD_PREFIX = ".upload-"


@dataclass(frozen=True)
class LocalOptions(BackendOptions):
    """Options of the local backend.

    Attributes:
        buffer_size: the buffer of opened files, in bytes (-1: Python's default).
        follow_symlinks: descend into symlinked directories when listing.
    """

    buffer_size: int = 1 << 20
    follow_symlinks: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not is_int(self.buffer_size) or (self.buffer_size < 1 and self.buffer_size != -1):
            raise ConfigError(f"buffer_size must be a positive int or -1, got {self.buffer_size!r}")
        check_bool(self.follow_symlinks, "local option follow_symlinks")


class LocalBackend(Backend):
    """Files on a local or mounted filesystem, addressed by path or ``file://`` URL.

    Listing follows S3's prefix semantics: a directory lists every file below it; any other
    path lists the files (recursively) whose path starts with it. URLs come back in the form
    they were asked for (bare paths or ``file://``), sorted.
    """

    name = "local"
    Options = LocalOptions
    options: LocalOptions

    def _error(self, exc: OSError, url: str, op: str) -> BackendError:
        if isinstance(exc, FileNotFoundError | NotADirectoryError):
            return ObjectNotFoundError("no such file or directory", url=url, backend=self.name, op=op)
        if isinstance(exc, PermissionError):
            return AccessDeniedError("permission denied", url=url, backend=self.name, op=op)
        if isinstance(exc, IsADirectoryError):
            return BackendError("is a directory, not an object", url=url, backend=self.name, op=op)
        return BackendError(f"{type(exc).__name__} (errno {exc.errno})", url=url, backend=self.name, op=op)

    def list(self, url: str) -> Iterator[ObjectInfo]:
        path = local_path(url, backend=self.name, op="list")
        as_file_url = scheme_of(url) == "file"
        if os.path.isdir(path):
            base, prefix = path, ""
        else:
            if os.path.isfile(path):
                yield self._info_of(path, as_file_url)
                return
            base, prefix = os.path.split(path)
            if base and not os.path.isdir(base):
                raise ObjectNotFoundError(_no_directory(url), url=url, backend=self.name, op="list")
        root = base or "."
        found: list[str] = []
        for dirpath, dirnames, filenames in os.walk(root, followlinks=self.options.follow_symlinks):
            rel_dir = os.path.relpath(dirpath, root)
            rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
            if prefix:
                # prune directories that cannot contain a match
                dirnames[:] = [d for d in dirnames if (rel_dir + d + "/").startswith(prefix)
                               or prefix.startswith(rel_dir + d + "/")]
            found.extend(rel_dir + f for f in filenames if (rel_dir + f).startswith(prefix))
        found.sort()  # by relative path with "/" separators: the order S3 lists keys in
        passed: list[str] = []
        for rel in found:
            full = os.path.join(base, *rel.split("/"))
            try:
                info, regular = self._listed(full, as_file_url)
            except ObjectNotFoundError:
                if os.path.islink(full):  # a link to nothing: said below
                    passed.append(f"{full} (a symbolic link to nothing)")
                continue  # deleted between the walk and the stat: not an object any more
            if regular:
                yield info
            else:
                passed.append(f"{full} (not a regular file)")
        if passed:
            # a FIFO, socket or device is no object: opening a FIFO waits for a writer for ever
            log.warning("listing %s passed over %d entr%s that hold%s no object: %s%s", url,
                        len(passed), "y" if len(passed) == 1 else "ies", "s" if len(passed) == 1 else "",
                        ", ".join(passed[:3]), ", ..." if len(passed) > 3 else "")

    def _listed(self, path: str, as_file_url: bool) -> tuple[ObjectInfo, bool]:
        """A listed path's info, and whether it is a regular file (a link followed)."""
        url = "file://" + os.path.abspath(path) if as_file_url else path
        try:
            st = os.stat(path)
        except OSError as exc:
            raise self._error(exc, url, "info") from exc
        return ObjectInfo(url=url, size=st.st_size, mtime=st.st_mtime), stat.S_ISREG(st.st_mode)

    def _info_of(self, path: str, as_file_url: bool) -> ObjectInfo:
        return self._listed(path, as_file_url)[0]

    def info(self, url: str) -> ObjectInfo:
        path = local_path(url, backend=self.name, op="info")
        if os.path.isdir(path):
            raise BackendError("is a directory, not an object", url=url, backend=self.name, op="info")
        info = self._info_of(path, False)
        return ObjectInfo(url=url, size=info.size, mtime=info.mtime)

    def open(self, url: str, *, start: int = 0) -> IO[bytes]:
        path = local_path(url, backend=self.name, op="open")
        try:
            fh = open(path, "rb", buffering=self.options.buffer_size)  # noqa: SIM115 - caller closes
        except OSError as exc:
            raise self._error(exc, url, "open") from exc
        if start:
            fh.seek(start)
        return fh

    def read(self, url: str, start: int | None = None, end: int | None = None) -> bytes:
        path = local_path(url, backend=self.name, op="read")
        lo = start or 0
        if lo < 0 or (end is not None and end < 0):
            raise ConfigError(f"read({url!r}): start/end must be non-negative (backend={self.name})")
        try:
            with open(path, "rb", buffering=0) as fh:
                if lo:
                    fh.seek(lo)
                if end is None:
                    return fh.read()
                return read_exact(fh, max(0, end - lo))
        except OSError as exc:
            raise self._error(exc, url, "read") from exc

    def upload_new(self, path: str, url: str) -> bool:
        """Publish ``path`` as ``url`` unless a file is there already (a hard link made with
        ``O_EXCL`` semantics): True when this call wrote it, False when another writer was first."""
        dest = local_path(url, backend=self.name, op="upload")
        directory = os.path.dirname(dest) or "."
        try:
            os.makedirs(directory, exist_ok=True)
            fd, tmp = create_temp(directory, _UPLOAD_PREFIX)  # umask applies; swept if killed
            try:
                with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
                os.link(tmp, dest)
            except FileExistsError:
                return False
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        except OSError as exc:
            raise self._error(exc, url, "upload") from exc
        return True

    def upload(self, path: str, url: str) -> None:
        """Publish the local file ``path`` as ``url`` atomically: readers of ``url`` see the
        previous file or the whole new one, never a part (a temporary file in the same
        directory is renamed over it)."""
        dest = local_path(url, backend=self.name, op="upload")
        directory = os.path.dirname(dest) or "."
        try:
            os.makedirs(directory, exist_ok=True)
            # the usual permissions (not mkstemp's 0600), and a name that lets the next upload
            # into this directory remove a temporary file left by a killed process
            fd, tmp = create_temp(directory, _UPLOAD_PREFIX)
            try:
                with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, dest)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            raise self._error(exc, url, "upload") from exc


def _no_directory(url: str) -> str:
    """A relative path that does not exist is often a bucket written without its scheme
    (``bucket/train/``): say how an S3 prefix is written."""
    if scheme_of(url) or os.path.isabs(url):
        return "no such directory"
    if url.startswith("~"):
        return f"no such directory ({local_path(url)})"
    if url.startswith(("./", "../")) or url in (".", ".."):  # written as a path: no bucket
        return f"no such directory (a local path, relative to {os.getcwd()})"
    return (f"no such directory (a local path, relative to {os.getcwd()}; an S3 prefix is "
            f"written 's3://{url}')")
