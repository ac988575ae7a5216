"""``pipeflow cache ls|clear``: the disk caches pipeflow keeps under the user's cache directory."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .._words import counted

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["ls", "clear"],
                        help="ls: list the caches and their sizes; clear: remove them")
    # default=[]: without it argparse lists this optional positional as required too
    parser.add_argument("which", nargs="*", metavar="URL_OR_DIR", default=[],
                        help="clear only the caches of these dataset URLs or directories")
    parser.add_argument("--root", default=None, metavar="DIR",
                        help="the cache root (default: $XDG_CACHE_HOME/pipeflow, ~/.cache/pipeflow)")


def run(args: argparse.Namespace) -> int:
    from .._usercache import cache_root, entries, human_bytes, remove

    root = args.root or cache_root()
    found = entries(root)
    if args.action == "ls":
        if args.which:
            print("pipeflow cache: ls takes no URL", file=sys.stderr)
            return 2
        print(f"# caches under {root}")
        for e in found:
            budget = f" of {human_bytes(e.max_bytes)}" if e.max_bytes else ""
            print(f"{human_bytes(e.nbytes):>10}{budget}  {counted(e.files, 'file'):>13}  {e.directory}  "
                  f"{e.url or '(unknown dataset)'}")
        total = sum(e.nbytes for e in found)
        print(f"# {counted(len(found), 'cache')}, {human_bytes(total)} in all")
        return 0
    named = {w: _named(found, w) for w in args.which}
    chosen = found if not args.which else list({e.directory: e for es in named.values() for e in es}.values())
    missing = [w for w, es in named.items() if not es]
    if missing:
        print(f"pipeflow cache: no cache for {', '.join(map(repr, missing))} under {root} "
              "(see `pipeflow cache ls`)", file=sys.stderr)
        return 2
    for e in chosen:
        remove(e)
        print(f"removed {e.directory} ({human_bytes(e.nbytes)}, {e.url or 'unknown dataset'})")
    print(f"# {counted(len(chosen), 'cache')} removed, {human_bytes(sum(e.nbytes for e in chosen))} freed")
    return 0


def _named(found: list[Any], which: str) -> list[Any]:
    """The caches ``which`` names: by dataset URL or directory, exactly, else with or without
    a trailing slash (a run given ``s3://bucket/jpeg/`` is cleared by ``s3://bucket/jpeg``)."""
    exact = [e for e in found if which in (e.url, e.directory)]
    bare = which.rstrip("/")
    if exact or not bare:
        return exact
    return [e for e in found if bare in ((e.url or "").rstrip("/"), e.directory.rstrip("/"))]
