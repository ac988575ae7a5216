"""What recording the statistics costs: the chains of ``benchmarks.overhead`` with this tree's
``pipeflow`` against a copy of it with recording removed, in alternated fresh processes.

The copy is this tree's package with two hooks cut out, nothing else changed:

* a stage's ``__next__`` keeps only the lazy restart and the call (no countdown, no sampled
  timing, no exclusive-time bookkeeping: what a stage would be without ``stats()``);
* a thread worker's task is the function itself (no task sampled for the workers' busy time).

Each side runs in a fresh interpreter (``--rounds`` of them, the sides alternated, the first side
alternating from round to round), each interpreter ``--runs`` times per chain after a warm-up;
a round's figure is the median of its runs. The report gives each side's median items per
second of CPU time (``time.process_time``) and of wall time, the change, and the median of the
paired changes (round by round) with how many rounds were slower with recording.

    python -m benchmarks.recording_cost --rounds 12
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: (file in the package, text to find, what it becomes): the two recording hooks cut out
CUTS = (
    ("stages/base.py",
     "    def __next__(self) -> T:\n        try:\n            left = self._left\n",
     "    def __next__(self) -> T:\n        if self._needs_reset:\n            self._restart_lazily()\n"
     "        return self.next()\n        try:\n            left = self._left\n"),
    ("_meter.py",
     '        """What to submit to a thread worker for one item: ``fn``, or ``fn`` timed."""\n',
     '        """What to submit to a thread worker for one item: ``fn``, or ``fn`` timed."""\n'
     "        return fn  # recording removed\n"),
)
CHAINS = {"inline": 100_000, "threads": 25_000}


class CutFailed(RuntimeError):
    """The package's recording hooks are no longer where this benchmark cuts them out."""


def build_copy(directory: str) -> str:
    """A copy of this tree's ``pipeflow`` with recording removed, under ``directory``; returns
    the directory to put first on ``sys.path``."""
    target = os.path.join(directory, "pipeflow")
    shutil.copytree(os.path.join(ROOT, "pipeflow"), target,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name, old, new in CUTS:
        path = os.path.join(target, name)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if text.count(old) != 1:
            raise CutFailed(f"pipeflow/{name}: the recording hook this benchmark removes was not "
                            f"found once (found {text.count(old)} times); update CUTS")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace(old, new))
    return directory


# ---- child side ---------------------------------------------------------------------------------
def child_main(runs: int, first_on_path: str | None) -> None:
    if first_on_path:  # ahead of the working directory, which ``-m`` puts first
        sys.path.insert(0, first_on_path)
    from benchmarks import overhead

    makers = {"inline": overhead._pipeflow_inline, "threads": overhead._pipeflow_parallel}
    result: dict[str, Any] = {"pipeflow": os.path.dirname(overhead.pf.__file__)}
    for chain, items in CHAINS.items():
        make = makers[chain]
        for _ in make(2_000):  # warm: the pools, the first calls
            pass
        figures = []
        for _ in range(runs):
            cpu0, t0 = time.process_time(), time.perf_counter()
            count = sum(1 for _ in make(items))
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
            if count != items:
                raise AssertionError(f"{chain}: {count} items, expected {items}")
            figures.append((items / cpu, items / wall))
        result[chain] = {"cpu": statistics.median(f[0] for f in figures),
                         "wall": statistics.median(f[1] for f in figures)}
    print("RESULT " + json.dumps(result), flush=True)


# ---- parent side --------------------------------------------------------------------------------
def run_side(first_on_path: str | None, runs: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.recording_cost", "--child", str(runs)]
    if first_on_path:
        command += ["--first-on-path", first_on_path]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"a round's process failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    return result


def summary(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per chain and clock: each side's median, the change and the paired change."""
    rows = []
    for chain in CHAINS:
        for clock in ("cpu", "wall"):
            base = [r["without"][chain][clock] for r in rounds]
            this = [r["with"][chain][clock] for r in rounds]
            paired = [t / b - 1 for t, b in zip(this, base)]
            rows.append({"chain": chain, "clock": clock,
                         "without_items_per_s": statistics.median(base),
                         "with_items_per_s": statistics.median(this),
                         "change": statistics.median(this) / statistics.median(base) - 1,
                         "paired_change": statistics.median(paired),
                         "slower_rounds": sum(p < 0 for p in paired), "rounds": len(paired)})
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12, help="fresh processes per side")
    parser.add_argument("--runs", type=int, default=4, help="runs of each chain per process")
    parser.add_argument("--out", help="write the rounds and the summary here (JSON)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--first-on-path", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        child_main(args.child, args.first_on_path)
        return
    rounds = []
    with tempfile.TemporaryDirectory(prefix="pipeflow-norecording-") as scratch:
        without = build_copy(scratch)
        for i in range(args.rounds):
            order = [("without", without), ("with", None)]
            if i % 2:
                order.reverse()
            entry: dict[str, Any] = {"round": i + 1, "load": os.getloadavg()[0]}
            for side, path in order:
                entry[side] = run_side(path, args.runs)
            if not entry["without"]["pipeflow"].startswith(scratch):
                raise RuntimeError(f"the copy without recording was not imported: {entry['without']}")
            rounds.append(entry)
            print(f"[{i + 1}] load {entry['load']:.1f}  " + "  ".join(
                f"{chain} {entry['with'][chain]['cpu'] / entry['without'][chain]['cpu'] - 1:+.1%}"
                for chain in CHAINS), flush=True)
    rows = summary(rounds)
    print("\nitems/s, medians of the rounds; change: with recording against without")
    print(f"{'chain':<9} {'clock':<5} {'without':>10} {'with':>10} {'change':>8} {'paired':>8}"
          "  slower rounds")
    for r in rows:
        print(f"{r['chain']:<9} {r['clock']:<5} {r['without_items_per_s']:>10,.0f} "
              f"{r['with_items_per_s']:>10,.0f} {r['change']:>+8.1%} {r['paired_change']:>+8.1%}"
              f"  {r['slower_rounds']} of {r['rounds']}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"rounds": rounds, "summary": rows}, f, indent=1)


if __name__ == "__main__":
    main()
