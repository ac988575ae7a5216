"""``pipeflow index``: list a prefix once, ahead of the job, into an index file.

The index (``docs/scale.md``) is what ``list_objects(url, manifest=...)`` reads instead of
listing the store: give the job the same URL, pattern and manifest location.
"""

from __future__ import annotations

import argparse
import sys
import time

from .._words import counted

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="the prefix to list (s3://bucket/prefix/ or a directory)")
    parser.add_argument("-o", "--output", required=True, metavar="PATH_OR_URL",
                        help="where to write the index: a local path or an s3:// URL")
    parser.add_argument("--pattern", default=None, help="glob on the part of each URL after the prefix")
    parser.add_argument("--backend", default=None, help="backend name (default: by URL scheme)")
    parser.add_argument("--threads", type=int, default=8, help="list requests in flight (default 8)")
    parser.add_argument("--force", action="store_true", help="replace an existing index")


def run(args: argparse.Namespace) -> int:
    from ..errors import PipeflowError
    from ..stages.listing import _manifest_backend, list_now, manifest_exists, publish

    try:
        be = _manifest_backend(args.output, args.url, args.backend, {})
        if manifest_exists(args.output, be) and not args.force:
            print(f"pipeflow index: {args.output} exists; pass --force to replace it", file=sys.stderr)
            return 2
        started = time.perf_counter()
        infos = list_now(args.url, pattern=args.pattern, backend=args.backend, threads=args.threads)
        listed = time.perf_counter() - started
        if not publish(args.output, be, args.url, args.pattern, infos, replace=args.force):
            print(f"pipeflow index: another writer published {args.output} first", file=sys.stderr)
            return 1
    except PipeflowError as exc:
        print(f"pipeflow index: {exc}", file=sys.stderr)
        return 2
    print(f"{counted(len(infos), 'object')} under {args.url} listed in {listed:.1f} s; "
          f"index written to {args.output}")
    return 0

