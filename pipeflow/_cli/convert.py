"""``pipeflow convert SRC DST``: turn a prefix of one-object-per-field samples into shards.

``SRC`` holds objects such as ``000001.jpg`` and ``000001.cls`` (a sample is the objects that
share a key, as ``group_pairs()`` groups them); ``DST`` receives tar or TFRecord shards and a
``manifest.json`` through :meth:`pipeflow.Pipeline.write_shards`. Sample keys are made relative
to ``SRC``. Rerunning after an interruption continues where the first run stopped.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", help="a local directory or s3://bucket/prefix of single-sample objects")
    parser.add_argument("dst", help="where the shards go (a local directory or s3://bucket/prefix)")
    parser.add_argument("--format", choices=["tar", "tfrecord"], default="tar",
                        help="shard format (default tar, WebDataset layout)")
    parser.add_argument("--max-size", type=float, default=256.0, metavar="MB",
                        help="largest shard in MB (10**6 bytes; default 256)")
    parser.add_argument("--max-count", type=int, default=None, metavar="N",
                        help="at most N samples a shard")
    parser.add_argument("--name", default="shard-{index:06d}",
                        help="shard name template (default shard-{index:06d})")
    parser.add_argument("--workers", type=int, default=8,
                        help="parallel downloads, and uploads of finished shards (default 8)")
    parser.add_argument("--backend", default=None,
                        help="backend for reading SRC (default: by URL scheme)")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over instead of continuing an interrupted conversion")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


class _Bar:
    """tqdm when it is installed, else a plain line on stderr (redrawn at most twice a second)."""

    def __init__(self, desc: str, enabled: bool) -> None:
        self.enabled = enabled
        self.desc = desc
        self.samples = 0
        self.nbytes = 0
        self._start = self._last = time.perf_counter()
        self._tqdm: Any = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._tqdm = tqdm(desc=desc, unit=" samples", file=sys.stderr)

    def __call__(self, samples: int, nbytes: int) -> None:
        step, self.samples, self.nbytes = samples - self.samples, samples, nbytes
        if not self.enabled:
            return
        if self._tqdm is not None:
            self._tqdm.update(step)
            return
        now = time.perf_counter()
        if now - self._last >= 0.5:
            self._last = now
            print(f"{self.desc}: {self._line(now)}", file=sys.stderr, flush=True)

    def _line(self, now: float) -> str:
        rate = self.samples / max(now - self._start, 1e-9)
        return f"{self.samples} samples, {self.nbytes / 1e6:.1f} MB, {rate:.1f} samples/s"

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        elif self.enabled:
            print(f"{self.desc}: {self._line(time.perf_counter())}", file=sys.stderr, flush=True)


def _relative_key(src: str) -> Any:
    base = src.rstrip("/") + "/"

    def relative(sample: dict[str, Any]) -> dict[str, Any]:
        key = sample["__key__"]
        return {**sample, "__key__": key[len(base):] if key.startswith(base) else key}
    return relative


def run(args: argparse.Namespace) -> int:
    import pipeflow as pf

    from ..errors import PipeflowError
    from ..stages.listing import list_now

    try:
        objects = list_now(args.src, backend=args.backend)
        pipe = (pf.from_items(objects)
                .open(args.backend, read=True, workers=args.workers)
                .group_pairs()
                .map(_relative_key(args.src)))
        bar = _Bar(f"{args.src} -> {args.dst}", not args.quiet)
        try:
            manifest = pipe.write_shards(args.dst, format=args.format,
                                         max_size=max(1, int(args.max_size * 1e6)),
                                         max_count=args.max_count, name=args.name,
                                         workers=args.workers, overwrite=args.overwrite,
                                         progress=bar)
        finally:
            bar.close()
    except PipeflowError as exc:
        print(f"pipeflow convert: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {manifest.samples} samples from {len(objects)} objects as "
          f"{len(manifest.shards)} {args.format} shards, {manifest.size / 1e6:.1f} MB, to "
          f"{args.dst} (manifest: {args.dst.rstrip('/')}/manifest.json)")
    return 0
