"""``pipeflow run RECIPE --url URL``: the articles' empty training loop over one recipe."""

from __future__ import annotations

import argparse
import ast
import sys
from typing import Any

from .._words import counted
from ._args import non_negative_int, positive_int

__all__ = ["add_arguments", "parse_options", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="a recipe name (see `pipeflow recipes`)")
    parser.add_argument("--url", required=True,
                        help="the dataset: s3://bucket/prefix, or a directory for mounted-path recipes")
    parser.add_argument("--batch-size", type=positive_int, default=4,
                        help="DataLoader batch size (default 4)")
    parser.add_argument("--num-workers", type=non_negative_int, default=0,
                        help="DataLoader workers (default 0)")
    parser.add_argument("--epochs", type=positive_int, default=1, help="passes over the data (default 1)")
    parser.add_argument("--steps", type=positive_int, default=None, help="stop after this many steps")
    parser.add_argument("--report-every", type=positive_int, default=100, metavar="N",
                        help="print the time of every N steps (default 100, as in the articles)")
    parser.add_argument("--preprocess", action="store_true",
                        help="002 recipes: decode, resize to 224x224 and batch 128 in the pipeline")
    parser.add_argument("--profile", nargs="?", const="pipeflow-profile.png", default=None, metavar="PNG",
                        help="print per-stage statistics with the bottleneck and advice, and draw "
                             "them into PNG (default pipeflow-profile.png; needs the plots extra)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe option, e.g. -o seed=3 (Python literals are parsed)")


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """``["seed=3", "backend=boto3"]`` -> ``{"seed": 3, "backend": "boto3"}``."""
    from ..errors import ConfigError

    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"options are KEY=VALUE, got {pair!r}")
        try:
            options[key.strip().replace("-", "_")] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            options[key.strip().replace("-", "_")] = text
    return options


def run(args: argparse.Namespace) -> int:
    from .. import recipes
    from ..errors import PipeflowError
    from ._errors import error_text
    from ._measure import measure
    from ._progress import messages_above, progress_bar

    try:
        options = parse_options(args.option)
        if args.preprocess:
            options["preprocess"] = True
        info = recipes.get(args.recipe)
        pipeline = recipes.load(args.recipe, url=args.url, **options)
    except PipeflowError as exc:
        print(f"pipeflow run: {error_text(exc)}", file=sys.stderr)
        return 2
    if {**info.options, **options}.get("cycle") and args.steps is None:
        print(f"pipeflow run: {args.recipe} cycles over its shards forever, as in the article; "
              "pass --steps N or -o cycle=False", file=sys.stderr)
        return 2
    batch_size = None if info.yields_batches(options) else args.batch_size

    # with --steps the samples to come are known (the data may end sooner): the bar has an ETA
    total = args.steps * batch_size if args.steps and batch_size else None
    bar = progress_bar(f"run {args.recipe}", total=total, quiet=args.quiet)

    def report(step: int, seconds: float) -> None:
        bar.write(f"Iteration {step} Time {seconds:.4f}")  # above the bar, not through it
    try:
        with messages_above(bar):  # a DataLoader worker's warning on a line of its own
            result = measure(pipeline, batch_size=batch_size, num_workers=args.num_workers,
                             epochs=args.epochs, steps=args.steps, report_every=args.report_every,
                             on_report=report, on_batch=bar.update)
    except PipeflowError as exc:  # bad data or storage: one line (the stage in its note), no traceback
        print(f"pipeflow run: {error_text(exc)}", file=sys.stderr)
        return 2
    finally:
        bar.close()
    mean = "n/a (needs 2 intervals)" if result.mean is None else f"{result.mean:.4f}"
    var = "n/a (needs 3 intervals)" if result.variance is None else f"{result.variance:.6f}"
    cpu = "n/a (pip install psutil)" if result.cpu_percent is None else f"{result.cpu_percent:.1f}%"
    print(f"mean {mean} variance {var}  (seconds per {counted(args.report_every, 'step')}, "
          "first interval excluded)")
    print(f"{counted(result.steps, 'step')}, {counted(result.samples, 'sample')} in {result.seconds:.2f} s: "
          f"{result.samples_per_s:.1f} samples/s, first batch after {result.first_batch_s:.2f} s, "
          f"average CPU {cpu}")
    if args.profile:
        return _profile(pipeline, args.profile)
    return 0


def _profile(pipeline: Any, png: str) -> int:
    from ..errors import MissingDependencyError
    from ._profile import plot_stats

    stats_of = getattr(pipeline, "stats", None)
    if stats_of is None:
        print("pipeflow run: --profile needs a recipe built from a pipeflow pipeline", file=sys.stderr)
        return 2
    stats = stats_of()
    print(stats)
    try:
        plot_stats(stats, png)
    except MissingDependencyError as exc:
        print(f"pipeflow run: cannot draw {png}: {exc}", file=sys.stderr)
        return 0
    print(f"profile drawn in {png}")
    return 0
