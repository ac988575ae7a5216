"""``pipeflow bench``: pipeflow and the peers in one run, same data, same server, a delay proxy.

Writes ``results.json``, ``results.md`` (tables with the pipeflow/peer ratios) and three PNG
plots into ``--out``. The benchmark code lives in the repository's ``benchmarks/`` directory
(not in the wheel); run this from a clone.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "run"]

SCENARIOS = ("s1", "s2", "s3", "s4", "s5")
S2_GROUPS = ("sizes", "article-001", "decode")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_run_arguments(parser)
    _add_selection_arguments(parser)


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Where and how the whole run happens: size, output, server, latency."""
    parser.add_argument(
        "--quick", action="store_true", help="small data and short budgets: a few minutes on 2 cores"
    )
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # the smoke test
    parser.add_argument("--out", default="pipeflow-bench", help="output directory (default ./pipeflow-bench)")
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=20.0,
        metavar="T",
        help="delay the proxy adds before every response (default 20; S3 measures 15-30)",
    )
    parser.add_argument(
        "--server",
        default="moto",
        metavar="moto|s3rver|URL",
        help="'moto' (default: started on 127.0.0.1; copies the whole object on every ranged GET), "
        "'s3rver' (the npm package, installed once into ~/.cache/pipeflow/s3rver; needs Node.js "
        "and npm; serves ranges at their cost) or the http:// endpoint of a running S3-compatible "
        "server (credentials from the environment)",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, metavar="N", help="run each case N times in a row (default 1)"
    )
    parser.add_argument("--workdir", default=None, help="keep local data and caches here")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    """Which scenarios, groups, shard sizes and libraries run."""
    parser.add_argument(
        "--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS), help="run only these scenarios"
    )
    parser.add_argument(
        "--no-datapipes",
        action="store_true",
        help="skip the torchdata 0.9 DataPipes peer (it needs its own small venv)",
    )
    parser.add_argument(
        "--no-streaming-peers",
        action="store_true",
        help="skip the LitData and Mosaic Streaming peers of S2 (they need their own small venv)",
    )
    parser.add_argument(
        "--shard-mb",
        type=float,
        nargs="+",
        default=None,
        metavar="MB",
        help="S2 shard sizes (default: 4 16 64 256 in a full run, 4 16 with --quick)",
    )
    parser.add_argument(
        "--s2-groups",
        nargs="+",
        choices=S2_GROUPS,
        default=list(S2_GROUPS),
        help="S2 comparison groups to run: 'sizes' (JPEG tar shards at every --shard-mb), "
        "'article-001' (the article's PNG-pair shards, its code beside the recipes), 'decode' "
        "(photo-sized and ImageNet-sized JPEGs decoded to 224x224); default all",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        default=(),
        metavar="LIBRARY",
        help="run only the cases of these libraries, named as in the tables (e.g. 'pipeflow' "
        "'S3IterableDataset' 'webdataset pipe:s5cmd')",
    )


def _import_benchmarks() -> None:
    try:
        import benchmarks.scenarios  # noqa: F401

        return
    except ImportError:
        pass
    root = Path(__file__).resolve().parents[2]
    if (root / "benchmarks" / "scenarios.py").exists():
        sys.path.insert(0, str(root))
        return
    raise SystemExit(
        "pipeflow bench needs the benchmarks/ directory of a pipeflow clone "
        "(git clone ...; pip install -e '.[bench]')"
    )


class _BenchBar:
    """Scenarios done of those asked for, with the running count of cases and the name of the
    current one (how many cases a scenario has is known only once its data is generated)."""

    def __init__(self, names: tuple[str, ...], *, quiet: bool) -> None:
        from ._progress import progress_bar

        self._bar = progress_bar("bench", total=len(names), unit=" scenarios", quiet=quiet)
        self._scenario = ""
        self._cases = 0

    def scenario(self, name: str) -> None:
        if self._scenario:
            self._bar.update(1)
        self._scenario = name
        self._bar.set_description(f"bench {name}")

    def case(self, case: Any) -> None:
        self._cases += 1
        self._bar.set_description(f"bench {self._scenario}, case {self._cases}: {case.library} "
                                  f"({case.group})")

    def write(self, line: str) -> None:
        self._bar.write(line)

    def close(self) -> None:
        if self._scenario:
            self._bar.update(1)
        self._bar.close()


def run(args: argparse.Namespace) -> int:
    _import_benchmarks()
    from benchmarks import report, scenarios

    if args.latency_ms < 0:
        raise SystemExit("--latency-ms must be >= 0")
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    sizes = {"tiny": scenarios.TINY, "quick": scenarios.QUICK, "full": scenarios.FULL}[mode]
    if args.shard_mb:
        if any(mb <= 0 for mb in args.shard_mb):
            raise SystemExit("--shard-mb sizes must be > 0")
        sizes = dataclasses.replace(sizes, s2_shard_mb=tuple(args.shard_mb))
    if "sizes" not in args.s2_groups:
        sizes = dataclasses.replace(sizes, s2_shard_mb=())
    if "article-001" not in args.s2_groups:
        sizes = dataclasses.replace(sizes, s2_wds_mb=0)
    if "decode" not in args.s2_groups:
        sizes = dataclasses.replace(sizes, s2_decode_kinds=())
    cfg = scenarios.BenchConfig(
        out=Path(args.out),
        sizes=sizes,
        mode=mode,
        latency_ms=args.latency_ms,
        server=args.server,
        workdir=Path(args.workdir) if args.workdir else None,
        datapipes=not args.no_datapipes,
        streaming_peers=not args.no_streaming_peers,
        scenarios=tuple(args.scenarios),
        only=tuple(args.only),
        repeats=args.repeats,
    )
    bar = _BenchBar(cfg.scenarios, quiet=args.quiet)
    try:
        result = scenarios.run(cfg, log=bar.write, on_scenario=bar.scenario, on_case=bar.case)
    finally:
        bar.close()
    paths = report.write(result, cfg.out)
    failed = [r for r in result["rows"] if "error" in r]
    print(f"\nwrote {', '.join(str(p) for p in paths.values())}")
    if failed:
        print(f"{len(failed)} case(s) failed: " + ", ".join(f"{r['library']} ({r['group']})" for r in failed))
    return 1 if failed else 0
