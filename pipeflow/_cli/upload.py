"""``pipeflow upload DIR URL``: copy a local folder into a bucket, many files at once.

Each file becomes the object ``URL/<path relative to DIR>``. A progress bar is drawn on a
terminal only; one summary line is printed at the end either way.
"""

from __future__ import annotations

import argparse
import sys

from .._words import counted

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="the local folder to copy")
    parser.add_argument("url", help="s3://bucket/prefix (S3 endpoint from AWS_ENDPOINT_URL) or a "
                        "local directory")
    parser.add_argument("--workers", type=int, default=16, help="files uploaded at once (default 16)")
    parser.add_argument("--skip-unchanged", action="store_true",
                        help="list the destination once and skip files whose object has the same "
                             "size and is not older (a rerun continues an interrupted copy)")
    parser.add_argument("--backend", default=None,
                        help="backend with uploads: obstore (default for s3:// when installed), "
                             "boto3 or local")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from ..errors import PipeflowError
    from ..sinks.upload import upload
    from ._progress import progress_bar

    bar = progress_bar(f"{args.directory} -> {args.url}", unit=" files", quiet=args.quiet)

    shown = [0]

    def progress(done: int, total: int, nbytes: int) -> None:
        if bar.total != total:
            bar.total = total
        bar.update(done - shown[0])
        shown[0] = done

    try:
        result = upload(args.directory, args.url, backend=args.backend, workers=args.workers,
                        skip_unchanged=args.skip_unchanged, progress=progress)
    except PipeflowError as exc:
        print(f"pipeflow upload: {exc}", file=sys.stderr)
        return 2
    finally:
        bar.close()
    rate = result.uploaded / max(result.seconds, 1e-9)
    skipped = f", {result.skipped} unchanged skipped" if args.skip_unchanged else ""
    print(f"uploaded {counted(result.uploaded, 'file')} ({result.bytes / 1e6:.1f} MB) to {result.url} in "
          f"{result.seconds:.1f} s ({rate:.0f} files/s){skipped}")
    return 0
