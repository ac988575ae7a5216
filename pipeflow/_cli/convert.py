"""``pipeflow convert SRC DST``: turn a prefix of one-object-per-field samples into shards.

``SRC`` holds objects such as ``000001.jpg`` and ``000001.cls`` (a sample is the objects that
share a key, as ``group_pairs()`` groups them); ``DST`` receives tar or TFRecord shards and a
``manifest.json`` through :meth:`pipeflow.Pipeline.write_shards`. Sample keys are made relative
to ``SRC``. Rerunning after an interruption continues where the first run stopped.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .._words import counted
from ._args import positive_float

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", help="a local directory or s3://bucket/prefix of single-sample objects")
    parser.add_argument("dst", help="where the shards go (a local directory or s3://bucket/prefix)")
    parser.add_argument("--format", choices=["tar", "tfrecord"], default="tar",
                        help="shard format (default tar, WebDataset layout)")
    parser.add_argument("--max-size", type=positive_float, default=256.0, metavar="MB",
                        help="largest shard in MB (10**6 bytes; default 256)")
    parser.add_argument("--max-count", type=int, default=None, metavar="N",
                        help="at most N samples a shard")
    parser.add_argument("--name", default="shard-{index:06d}",
                        help="shard name template (default shard-{index:06d})")
    parser.add_argument("--workers", type=int, default=8,
                        help="parallel downloads, and uploads of finished shards (default 8)")
    parser.add_argument("--pattern", default=None, metavar="GLOB",
                        help="convert only the objects whose name after SRC matches (e.g. '*.jpg' "
                             "'*.cls'); default: every object under SRC")
    parser.add_argument("--backend", default=None,
                        help="backend for reading SRC (default: by URL scheme)")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over instead of continuing an interrupted conversion")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _relative_key(src: str) -> Any:
    base = src.rstrip("/") + "/"

    def relative(sample: dict[str, Any]) -> dict[str, Any]:
        key = sample["__key__"]
        return {**sample, "__key__": key[len(base):] if key.startswith(base) else key}
    return relative


def run(args: argparse.Namespace) -> int:
    from ..errors import PipeflowError

    shape = {"format": args.format, "max_size": max(1, int(args.max_size * 1e6)),
             "max_count": args.max_count, "name": args.name}
    try:
        previous = _previous(args, shape)
        if previous is not None and previous.complete:
            print(f"nothing to do: {args.dst} already holds this conversion, complete "
                  f"({counted(previous.samples, 'sample')} in "
                  f"{counted(len(previous.shards), args.format + ' shard')}, "
                  f"{previous.size / 1e6:.1f} MB); --overwrite converts again")
            return 0
        if previous is not None and previous.shards:
            print(f"continuing an interrupted conversion: {counted(len(previous.shards), 'shard')} "
                  f"({counted(previous.samples, 'sample')}) already in {args.dst}", flush=True)
        objects, manifest = _convert(args, shape, previous)
    except PipeflowError as exc:
        print(f"pipeflow convert: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {counted(manifest.samples, 'sample')} from {counted(len(objects), 'object')} as "
          f"{counted(len(manifest.shards), args.format + ' shard')}, {manifest.size / 1e6:.1f} MB, to "
          f"{args.dst} (manifest: {args.dst.rstrip('/')}/manifest.json)")
    return 0


def _previous(args: argparse.Namespace, shape: dict[str, Any]) -> Any:
    """The manifest of an earlier run into DST with these options; one read, nothing listed."""
    if args.overwrite:
        return None
    from ..sinks.shards import previous_manifest

    return previous_manifest(args.dst, **shape, overwrite_hint="--overwrite to start over")


def _convert(args: argparse.Namespace, shape: dict[str, Any], previous: Any) -> tuple[list[Any], Any]:
    import pipeflow as pf

    from ..stages.group import count_samples
    from ..stages.listing import list_now
    from ._progress import progress_bar

    objects = list_now(args.src, pattern=args.pattern, backend=args.backend)
    pipe = (pf.from_items(objects)
            .open(args.backend, read=True, workers=args.workers)
            .group_pairs()
            .map(_relative_key(args.src)))
    # the samples to come, for the bar's ETA: those group_pairs() makes of the listing, less,
    # in a conversion that continues, those of the shards before the one it resumes at (no
    # total if that leaves none: the source shrank since)
    total = count_samples(o.url for o in objects) - (previous.samples_before_resume if previous else 0)
    bar = progress_bar(f"{args.src} -> {args.dst}", total=total if total > 0 else None, quiet=args.quiet,
                       lines_every=10.0)
    written = 0

    def progress(samples: int, nbytes: int) -> None:
        nonlocal written
        bar.update(samples - written)
        written = samples

    try:
        manifest = pipe.write_shards(args.dst, **shape, workers=args.workers, overwrite=args.overwrite,
                                     progress=progress)
    finally:
        bar.close()
    return objects, manifest

