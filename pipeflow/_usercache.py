"""Where pipeflow keeps disk caches it creates on its own (the ``mountpoint-cache`` recipe):
under the user's cache directory, one directory per dataset, each with a small description
beside it so ``pipeflow cache ls`` can say what it holds and ``pipeflow cache clear`` can
remove it. Imports nothing heavy: the ``pipeflow cache`` command uses it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass

from ._fs import atomic_write

__all__ = ["CacheEntry", "cache_root", "dataset_cache_dir", "entries", "human_bytes", "register",
           "remove", "usage"]

_DATASETS = "datasets"


def cache_root() -> str:
    """``$XDG_CACHE_HOME/pipeflow`` (``~/.cache/pipeflow`` when unset; ``~/Library/Caches`` on
    macOS, ``%LOCALAPPDATA%`` on Windows). A relative ``XDG_CACHE_HOME`` is ignored, as the
    XDG specification says."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        base = xdg
    elif sys.platform == "darwin":
        base = os.path.expanduser("~/Library/Caches")
    elif sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.path.expanduser("~/AppData/Local")
    else:
        base = os.path.expanduser("~/.cache")
    return os.path.join(base, "pipeflow")


def dataset_cache_dir(url: str, root: str | None = None) -> str:
    """The cache directory for the dataset at ``url``: ``<root>/datasets/<hash of url>``."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return os.path.join(root or cache_root(), _DATASETS, digest)


def usage(directory: str) -> tuple[int, int]:
    """``(bytes, files)`` under ``directory`` now (0, 0 when it does not exist)."""
    total = count = 0
    for folder, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
                count += 1
            except FileNotFoundError:  # evicted while we walked
                continue
    return total, count


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def register(directory: str, url: str, max_bytes: int) -> None:
    """Record what ``directory`` caches, beside it (``<directory>.json``), for ``cache ls``."""
    os.makedirs(directory, exist_ok=True)
    meta = json.dumps({"url": url, "max_bytes": max_bytes}).encode()
    atomic_write(directory.rstrip(os.sep) + ".json", meta)


@dataclass(frozen=True)
class CacheEntry:
    """One dataset cache: its directory, the URL it caches (None when unknown), its budget,
    and what it holds now."""

    directory: str
    url: str | None
    max_bytes: int | None
    nbytes: int
    files: int


def entries(root: str | None = None) -> list[CacheEntry]:
    """Every dataset cache under ``root`` (default :func:`cache_root`), sorted by directory."""
    base = os.path.join(root or cache_root(), _DATASETS)
    if not os.path.isdir(base):
        return []
    found = []
    for name in sorted(os.listdir(base)):
        path = os.path.join(base, name)
        if not os.path.isdir(path):
            continue
        meta: dict[str, object] = {}
        try:
            with open(path + ".json", encoding="utf-8") as fh:
                meta = json.load(fh)
        except (OSError, ValueError):  # made by hand (no readable .json beside it): still listed
            pass
        nbytes, files = usage(path)
        max_bytes = meta.get("max_bytes")
        found.append(CacheEntry(path, str(meta["url"]) if "url" in meta else None,
                                max_bytes if isinstance(max_bytes, int) else None, nbytes, files))
    return found


def remove(entry: CacheEntry) -> None:
    """Delete one dataset cache and its description."""
    shutil.rmtree(entry.directory, ignore_errors=True)
    try:
        os.unlink(entry.directory + ".json")
    except FileNotFoundError:
        pass
