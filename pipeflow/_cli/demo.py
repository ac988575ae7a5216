"""``pipeflow demo``: start a local S3 server, generate a small dataset in every layout, run every
recipe for a fixed number of steps, and compare them in one table and one bar chart.

Each recipe runs in its own forked process with a time limit, so one failing or hanging recipe
is reported in its row and never stops the demo, and CPU use is measured per recipe (the S3
server's own CPU is not counted).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

from .._words import counted
from ..errors import install_line
from ._args import non_negative_int, positive_float, positive_int
from ._errors import error_text

__all__ = ["DemoRow", "add_arguments", "run", "run_demo"]

BUCKET = "pipeflow-demo"
#: seconds a recipe's process has to end by itself after Ctrl-C (its loop's grace is 1 s)
_CHILD_GRACE_S = 2.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, help="directory for the table, JSON and PNG chart "
                        "(default: the user cache directory, ~/.cache/pipeflow/demo on Linux, so "
                        "nothing lands in the working tree)")
    parser.add_argument("--count", type=positive_int, default=400, help="samples per dataset (default 400)")
    parser.add_argument("--image-size", type=positive_int, default=64, metavar="PX",
                        help="image width and height (default 64; the articles use 1024)")
    parser.add_argument("--shards", type=positive_int, default=8,
                        help="tar/TFRecord files per dataset (default 8)")
    parser.add_argument("--steps", type=positive_int, default=60, help="steps per recipe (default 60)")
    parser.add_argument("--batch-size", type=positive_int, default=4,
                        help="DataLoader batch size (default 4)")
    parser.add_argument("--num-workers", type=non_negative_int, default=2,
                        help="DataLoader workers (default 2)")
    parser.add_argument("--report-every", type=positive_int, default=10, metavar="N",
                        help="steps per timed interval (default 10)")
    parser.add_argument("--timeout", type=positive_float, default=120.0, help="seconds allowed per recipe")
    parser.add_argument("--preprocess", action="store_true",
                        help="run the 002 recipes with decode + resize 224 + batch 128")
    parser.add_argument("--recipes", nargs="*", default=None, metavar="NAME",
                        help="run only these recipes (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="data seed (default 0)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


@dataclass
class DemoRow:
    """One recipe's result in the comparison."""

    recipe: str
    article: str
    layout: str
    backend: str
    status: str = "ok"
    steps: int = 0
    samples: int = 0
    seconds: float = 0.0
    samples_per_s: float = 0.0
    cpu_percent: float | None = None
    first_batch_s: float = 0.0
    mean_interval_s: float | None = None
    var_interval_s: float | None = None


def _shard_mb(layout: str, count: int, image_size: int, shards: int, seed: int) -> float:
    from ..testing.datagen import sample_fields

    one = sum(len(v) for v in sample_fields(layout, 0, image_size=image_size, seed=seed).values())
    return max(one * count / max(shards, 1) / 1e6, 1e-6) * 0.999


def _generate(server: Any, data_dir: str, args: argparse.Namespace,
              layouts: set[str]) -> dict[str, dict[str, str]]:
    """Write each layout to a local directory (the 'mounted path') and upload it to the bucket."""
    from ..testing.datagen import generate

    where: dict[str, dict[str, str]] = {}
    for layout in sorted(layouts):
        local = os.path.join(data_dir, layout)
        shutil.rmtree(local, ignore_errors=True)
        shard_mb = _shard_mb(layout, args.count, args.image_size, args.shards, args.seed)
        generate(layout, local, count=args.count, image_size=args.image_size, seed=args.seed,
                 shard_mb=shard_mb, progress=not args.quiet)
        t0 = time.perf_counter()
        server.put_dir(BUCKET, local, prefix=f"{layout}/")
        print(f"  uploaded {layout} to s3://{BUCKET}/{layout}/ in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
        where[layout] = {"local": local, "s3": f"s3://{BUCKET}/{layout}/"}
    return where


def _child(name: str, url: str, options: dict[str, Any], batch_size: int | None, args: dict[str, Any],
           out: Any) -> None:
    try:
        from .. import recipes
        from ._measure import measure
        from ._progress import messages_above

        pipeline = recipes.load(name, url=url, **options)
        bar = _StepsBar(name, args["steps"], batch_size, quiet=args["quiet"])
        try:
            with messages_above(bar.bar):  # a DataLoader worker's warning on a line of its own
                result = measure(pipeline, batch_size=batch_size, num_workers=args["num_workers"],
                                 epochs=10_000, steps=args["steps"], report_every=args["report_every"],
                                 on_batch=bar.update)
        finally:
            bar.close()
        out.put(("ok", {"steps": result.steps, "samples": result.samples, "seconds": result.seconds,
                        "samples_per_s": result.samples_per_s, "cpu_percent": result.cpu_percent,
                        "first_batch_s": result.first_batch_s, "mean_interval_s": result.mean,
                        "var_interval_s": result.variance}))
    except BaseException as exc:  # reported in the table, never raised through the demo
        last = f"{type(exc).__name__}: {error_text(exc)}"
        out.put(("error", last))


class _StepsBar:
    """One recipe's bar in samples: the total is its steps times the batch size, learnt from
    the first batch when the recipe batches itself."""

    def __init__(self, name: str, steps: int, batch_size: int | None, *, quiet: bool) -> None:
        from ._progress import progress_bar

        self._steps = steps
        self.bar = progress_bar(name, total=steps * batch_size if batch_size else None, quiet=quiet)

    def update(self, samples: int) -> None:
        if self.bar.total is None and samples:
            self.bar.total = self._steps * samples
            self.bar.refresh()
        self.bar.update(samples)

    def close(self) -> None:
        self.bar.close()


def _run_one(info: Any, url: str, args: argparse.Namespace) -> DemoRow:
    row = DemoRow(info.name, info.article, info.layout, info.backend)
    options: dict[str, Any] = {}
    if args.preprocess and "preprocess" in info.options:
        options["preprocess"] = True
    if "cache_dir" in info.options:
        options["cache_dir"] = os.path.join(args.out, "cache", info.name)
    batch_size = None if info.yields_batches(options) else args.batch_size
    ctx = mp.get_context("fork") if sys.platform.startswith("linux") else mp.get_context("spawn")
    queue = ctx.Queue()
    child_args = {"num_workers": args.num_workers, "steps": args.steps, "report_every": args.report_every,
                  "quiet": args.quiet}
    proc = ctx.Process(target=_child, args=(info.name, url, options, batch_size, child_args, queue),
                       name=f"pipeflow-demo-{info.name}")
    proc.start()
    try:
        status, payload = queue.get(timeout=args.timeout)
    except Exception:  # queue.Empty: the recipe took too long or its process died
        status, payload = "error", ("timed out" if proc.is_alive() else f"exit code {proc.exitcode}")
    except BaseException:  # Ctrl-C, or SIGTERM taken as Ctrl-C
        _interrupt_child(proc)
        raise
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    if status == "ok":
        for key, value in payload.items():
            setattr(row, key, value)
    else:
        row.status = str(payload)[:200]
    return row


def _interrupt_child(proc: Any) -> None:
    """Stop the recipe's process the way Ctrl-C does: its loop ends at its next batch and shuts
    its DataLoader workers down. A terminal's Ctrl-C reached it already (the whole foreground
    group gets it), and it ends within its loop's grace; a SIGTERM sent to the demo alone did
    not, and a process killed outright would leave the workers it was forking behind."""
    proc.join(timeout=_CHILD_GRACE_S)
    if proc.is_alive():
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGINT)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_rows(rows: list[DemoRow]) -> str:
    """The comparison table, fastest first."""
    from .recipes import format_table

    table = [[r.recipe, r.article, r.backend, _fmt(r.samples_per_s if r.status == "ok" else None, ".1f"),
              _fmt(r.cpu_percent, ".0f"), _fmt(r.first_batch_s if r.status == "ok" else None, ".2f"),
              str(r.samples), r.status] for r in rows]
    return format_table(table, ["recipe", "article", "backend", "samples/s", "CPU %", "first batch s",
                                "samples", "status"])


def _chart(rows: list[DemoRow], path: str, title: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no chart ({install_line('plots')})", file=sys.stderr)
        return None
    ok = [r for r in rows if r.status == "ok"][::-1]
    fig, ax = plt.subplots(figsize=(9, 0.35 * max(len(ok), 1) + 1.5))
    colors = {"000": "#4C72B0", "001": "#55A868", "002": "#C44E52", "003": "#8172B2"}
    bars = ax.barh([r.recipe for r in ok], [r.samples_per_s for r in ok],
                   color=[colors.get(r.article, "#888888") for r in ok])
    for bar, r in zip(bars, ok):
        cpu = "" if r.cpu_percent is None else f"  CPU {r.cpu_percent:.0f}%"
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {r.samples_per_s:.0f}{cpu}",
                va="center", fontsize=8)
    ax.set_xlabel("samples / s")
    ax.set_title(title, fontsize=10)
    ax.margins(x=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run_demo(args: argparse.Namespace) -> list[DemoRow]:
    """Run the demo; returns the rows sorted by throughput (also written under ``args.out``)."""
    from .. import recipes
    from ..testing import local_s3

    infos = recipes.list()
    if args.recipes:
        unknown = [n for n in args.recipes if n not in recipes.names()]
        if unknown:
            recipes.get(unknown[0])  # raises UnknownRecipeError with suggestions
        infos = [i for i in infos if i.name in args.recipes]
    if getattr(args, "out", None) is None:
        from .._usercache import cache_root

        args.out = os.path.join(cache_root(), "demo")
    os.makedirs(args.out, exist_ok=True)
    data_dir = tempfile.mkdtemp(prefix="pipeflow-demo-data-")
    rows: list[DemoRow] = []
    try:
        with local_s3(buckets=[BUCKET]) as server:
            print(f"local S3 server at {server.endpoint}; generating {counted(args.count, 'sample')} of "
                  f"{args.image_size}px per layout", file=sys.stderr)
            where = _generate(server, data_dir, args, {i.layout for i in infos})
            for info in infos:
                kind = "s3" if "s3" in info.reads else "local"
                url = where[info.layout][kind]
                print(f"running {info.name} on {url} ...", file=sys.stderr, flush=True)
                row = _run_one(info, url, args)
                print(f"  {row.status}: {row.samples_per_s:.1f} samples/s", file=sys.stderr, flush=True)
                rows.append(row)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
        shutil.rmtree(os.path.join(args.out, "cache"), ignore_errors=True)
    rows.sort(key=lambda r: (r.status != "ok", -r.samples_per_s))
    title = (f"pipeflow demo: {counted(args.steps, 'step')} x batch {args.batch_size}, "
             f"{counted(args.num_workers, 'worker')}, "
             f"{args.image_size}px, local moto S3, {os.cpu_count()} cores")
    table = format_rows(rows)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"settings": {k: v for k, v in vars(args).items() if k != "func"},
                   "rows": [asdict(r) for r in rows]}, f, indent=2, default=str)
    with open(os.path.join(args.out, "results.txt"), "w") as f:
        f.write(title + "\n\n" + table + "\n")
    chart = _chart(rows, os.path.join(args.out, "demo.png"), title)
    print()
    print(title)
    print(table)
    print(f"\nwrote {os.path.join(args.out, 'results.txt')}, results.json"
          + (f" and {chart}" if chart else ""))
    return rows


def run(args: argparse.Namespace) -> int:
    from ..errors import PipeflowError

    try:
        rows = run_demo(args)
    except PipeflowError as exc:
        print(f"pipeflow demo: {error_text(exc)}", file=sys.stderr)
        return 2
    return 0 if any(r.status == "ok" for r in rows) else 1
