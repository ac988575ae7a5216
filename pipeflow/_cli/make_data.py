"""``pipeflow make-data LAYOUT URL``: write the articles' synthetic datasets."""

from __future__ import annotations

import argparse
import sys

from .._words import counted
from ._args import positive_float, positive_int

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..testing.datagen import LAYOUTS

    layouts = "; ".join(f"{name}: {info.description}" for name, info in LAYOUTS.items())
    parser.epilog = f"layouts: {layouts}"
    parser.add_argument("layout", choices=list(LAYOUTS), help="the storage layout to write")
    parser.add_argument("url", help="a local directory or s3://bucket/prefix "
                        "(S3 endpoint from AWS_ENDPOINT_URL)")
    parser.add_argument("--count", type=int, default=1000, help="number of samples (default 1000)")
    parser.add_argument("--image-size", type=positive_int, default=None, metavar="PX",
                        help="image width and height (default: 1024 for PNG layouts, 360 for JPEG "
                             "layouts, about 115 KB a JPEG)")
    parser.add_argument("--seed", type=int, default=0, help="content seed (default 0)")
    parser.add_argument("--shard-mb", type=positive_float, default=100.0, metavar="MB",
                        help="target size of a tar shard or TFRecord file in MB (default 100)")
    parser.add_argument("--create-bucket", action="store_true",
                        help="create the S3 bucket if it does not exist")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from ..errors import ObjectNotFoundError, PipeflowError
    from ..testing.datagen import generate

    try:
        result = generate(args.layout, args.url, count=args.count, image_size=args.image_size,
                          seed=args.seed, shard_mb=args.shard_mb, progress=not args.quiet,
                          create_bucket=args.create_bucket)
    except ObjectNotFoundError as exc:
        hint = "; pass --create-bucket to create it" if exc.op == "head_bucket" else ""
        print(f"pipeflow make-data: {exc}{hint}", file=sys.stderr)
        return 2
    except PipeflowError as exc:
        print(f"pipeflow make-data: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {counted(result.count, 'sample')} ({result.image_size}px) as "
          f"{counted(len(result.objects), 'object')}, "
          f"{result.nbytes / 1e6:.1f} MB, to {result.url}")
    return 0
