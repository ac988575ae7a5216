"""``upload``: copy a local folder into a bucket (or another directory), in parallel.

Every regular file under the folder becomes one object named by its path relative to the
folder (``/`` separated) under the destination URL. Files are published through the backend's
``upload`` (for ``s3://`` ``obstore`` when installed, as ``open()`` chooses, else ``boto3``;
``local`` for paths): each object appears whole or not at all. ``workers`` threads upload at
once; at most ``4 * workers`` files are queued, so memory does not grow with the number of
files beyond their list of names.

Cost: one walk of the folder and its ``N`` names in memory; with ``skip_unchanged`` also one
listing of the destination (``N`` entries, ``ceil(N / 1000)`` LIST requests on S3), never a
HEAD per file.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from .._checks import check_bool, check_int
from ..backends.base import Backend, local_path
from ..errors import ConfigError, ObjectNotFoundError
from ..items import ObjectInfo
from .shards import Uploader

__all__ = ["UploadResult", "upload"]

#: ``progress(files done, files in all, bytes sent)``, called after every file
UploadProgress = Callable[[int, int, int], None]


@dataclass(frozen=True)
class UploadResult:
    """What :func:`upload` did: files uploaded and skipped (unchanged), bytes sent, seconds."""

    url: str
    uploaded: int
    skipped: int
    bytes: int
    seconds: float


@dataclass(frozen=True)
class _File:
    path: str
    relative: str
    size: int
    mtime: float


def _store(url: str, backend: str | Backend | None, options: dict[str, Any]) -> Backend:
    from ..backends.registry import get_backend, preferred_backend_for_url

    if backend is None:
        # as open() chooses: for s3://, obstore when installed and safe in this process
        # (measured faster for many small files, see docs/cli.md), else boto3
        backend = preferred_backend_for_url(url)
    store = get_backend(backend, url=url, **options)
    if not isinstance(store, Uploader):
        raise ConfigError(f"backend {store.name!r} cannot write objects; upload() needs a backend "
                          "with upload(): 'boto3' (s3://), 'obstore' or 'local'")
    return store


def _walk(directory: str) -> list[_File]:
    """Every regular file under ``directory``, sorted by relative path so runs and listings
    line up. Symbolic links are followed, to files and to directories (a linked directory is
    copied under its own name too), except a link to a directory's own ancestor, which would
    never end."""
    directory = os.path.normpath(directory)
    found: list[_File] = []
    identity: dict[str, tuple[int, int]] = {}
    for root, dirs, names in os.walk(directory, followlinks=True):
        st = os.stat(root)
        identity[root] = (st.st_dev, st.st_ino)
        if _is_cycle(root, directory, identity):
            dirs[:] = []
            continue
        dirs.sort()
        for name in names:
            path = os.path.join(root, name)
            try:
                info = os.stat(path)
            except OSError as exc:
                raise ObjectNotFoundError(f"cannot read {path}: {exc.strerror}", url=path,
                                          backend="local", op="upload") from exc
            if not stat.S_ISREG(info.st_mode):
                continue  # sockets, fifos, devices: not files to copy
            relative = os.path.relpath(path, directory).replace(os.sep, "/")
            found.append(_File(path, relative, info.st_size, info.st_mtime))
    found.sort(key=lambda f: f.relative)
    return found


def _is_cycle(root: str, top: str, identity: dict[str, tuple[int, int]]) -> bool:
    """Whether ``root`` is the same directory as one of its ancestors (up to ``top``)."""
    here, parent = identity[root], os.path.dirname(root)
    while root != top and len(parent) >= len(top):
        if identity.get(parent) == here:
            return True
        root, parent = parent, os.path.dirname(parent)
    return False


def _join(url: str, relative: str) -> str:
    return f"{url.rstrip('/')}/{relative}" if url.rstrip("/") else relative


def _existing(store: Backend, url: str) -> dict[str, ObjectInfo]:
    """The destination's objects by relative name (empty when the prefix has none yet)."""
    base = url.rstrip("/") + "/"
    try:
        return {info.url[len(base):]: info for info in store.list(base) if info.url.startswith(base)}
    except ObjectNotFoundError:
        if store.name == "local":  # a directory not made yet; a missing bucket is an error
            return {}
        raise


def _unchanged(file: _File, there: ObjectInfo | None) -> bool:
    """Same size, and the copy is not older than the file (``aws s3 sync``'s rule)."""
    if there is None or there.size != file.size:
        return False
    return there.mtime is None or there.mtime + 1.0 >= file.mtime


def upload(directory: str, url: str, *, backend: str | Backend | None = None, workers: int = 16,
           skip_unchanged: bool = False, progress: UploadProgress | None = None,
           backend_options: dict[str, Any] | None = None) -> UploadResult:
    """Copy every file under ``directory`` to ``url/<relative path>``, ``workers`` at a time.

    Args:
        directory: the local folder: a path (``~`` is the home directory) or a ``file://`` URL.
        url: ``s3://bucket/prefix`` or a local directory.
        backend: a backend with ``upload``: ``"obstore"`` (the default for ``s3://`` when
            installed), ``"boto3"`` or ``"local"``; or a ready one.
        workers: files uploaded at once (threads).
        skip_unchanged: list the destination once and skip files whose object has the same
            size and is not older than the file.
        progress: called after every file with (files done, files in all, bytes sent).
        backend_options: options of the backend (``endpoint_url=...``).

    Returns:
        an :class:`UploadResult`.

    Raises:
        ObjectNotFoundError: ``directory`` does not exist or holds no regular file, the
            bucket does not exist, or a file cannot be read (a dangling symbolic link, a file
            removed meanwhile).
        ConfigError: ``directory`` is not a directory, or a bad option.
        InvalidURLError: ``directory`` is a URL of another store (``s3://...``).
        BackendError: an upload failed (its typed subclass); files not yet started are not
            uploaded, so a rerun with ``skip_unchanged=True`` continues.
    """
    check_int(workers, "upload(workers=...)", low=1)
    check_bool(skip_unchanged, "upload(skip_unchanged=...)")
    # "~/images" or file:///data/images, read as the local backend reads a path
    directory = local_path(directory, backend="local", op="upload")
    if not os.path.exists(directory):
        raise ObjectNotFoundError("no such directory", url=directory, backend="local", op="upload")
    if not os.path.isdir(directory):
        raise ConfigError(f"upload() copies a directory; {directory!r} is not one")
    started = time.perf_counter()
    store = _store(url, backend, dict(backend_options or {}))
    files = _walk(directory)
    if not files:  # a wrong folder, usually: said, as listing an empty prefix is
        raise ObjectNotFoundError("no files to upload: the directory holds no regular file",
                                  url=directory, backend="local", op="upload")
    there = _existing(store, url) if skip_unchanged else {}
    todo = [f for f in files if not _unchanged(f, there.get(f.relative))] if skip_unchanged else files
    sent = _send(store, url, todo, workers, progress, len(files) - len(todo))
    return UploadResult(url=url, uploaded=len(todo), skipped=len(files) - len(todo), bytes=sent,
                        seconds=time.perf_counter() - started)


def _send(store: Backend, url: str, files: list[_File], workers: int,
          progress: UploadProgress | None, skipped: int) -> int:
    """Upload ``files`` on ``workers`` threads, at most ``4 * workers`` queued; the first
    failure cancels what has not started and is raised."""
    total = len(files) + skipped
    done, sent = skipped, 0
    lock = threading.Lock()
    put = store.upload  # type: ignore[attr-defined]

    def one(file: _File) -> None:
        nonlocal done, sent
        try:
            put(file.path, _join(url, file.relative))
        except Exception as exc:
            if not os.path.exists(file.path):  # removed since the walk: name the file, not the object
                raise ObjectNotFoundError("the file was removed during the upload", url=file.path,
                                          backend="local", op="upload") from exc
            raise
        with lock:
            done += 1
            sent += file.size
            if progress is not None:
                progress(done, total, sent)

    with ThreadPoolExecutor(workers, thread_name_prefix="pipeflow-upload") as pool:
        pending: set[Future[None]] = set()
        try:
            for file in files:
                if len(pending) >= 4 * workers:
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                    _raise_first(finished)
                pending.add(pool.submit(one, file))
            while pending:  # the rest, stopping at the first failure
                finished, pending = wait(pending, return_when=FIRST_EXCEPTION)
                _raise_first(finished)
        except BaseException:
            for future in pending:
                future.cancel()
            raise
    return sent


def _raise_first(finished: set[Future[None]]) -> None:
    for future in finished:
        exc = future.exception()
        if exc is not None:
            raise exc
