"""``pipeflow cache ls|clear``: the disk caches pipeflow keeps under the user's cache directory."""

from __future__ import annotations

import argparse
import sys

from .._words import counted

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["ls", "clear"],
                        help="ls: list the caches and their sizes; clear: remove them")
    parser.add_argument("which", nargs="*", metavar="URL_OR_DIR",
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
    chosen = found if not args.which else [e for e in found if e.url in args.which
                                           or e.directory in args.which]
    missing = [w for w in args.which if all(w not in (e.url, e.directory) for e in found)]
    if missing:
        print(f"pipeflow cache: no cache for {', '.join(map(repr, missing))} under {root} "
              "(see `pipeflow cache ls`)", file=sys.stderr)
        return 2
    for e in chosen:
        remove(e)
        print(f"removed {e.directory} ({human_bytes(e.nbytes)}, {e.url or 'unknown dataset'})")
    print(f"# {counted(len(chosen), 'cache')} removed, {human_bytes(sum(e.nbytes for e in chosen))} freed")
    return 0
