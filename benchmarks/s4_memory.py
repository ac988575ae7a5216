"""S4's memory taken apart: PSS of every process of ``loader()`` (2 threads or 2 processes) and of
``DataLoader(num_workers=2)``, anonymous and file-backed apart, on S4's own pipelines.

PSS counts a page shared by N processes as 1/N in each, so the sum over a process tree is the
memory the tree holds. File-backed pages (torch's libraries) are also shared with every other
process on the machine that maps the same files, so their share moves with what else runs;
anonymous pages are shared only within the tree (a fork's pages until written), which makes the
anonymous sum the figure to compare. Each case runs in a fresh interpreter, which reads its own
tree's ``/proc/PID/smaps_rollup`` after the imports, after building the pipeline (S4's data in
memory) and every half second while iterating; the largest running total is reported.

    python -m benchmarks.s4_memory --layout jpeg --count 3000 --size 360 --repeats 3
    python -m benchmarks.s4_memory --layout single --count 800 --size 1024 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = ("loader-thread", "loader-process", "dataloader")
FIELDS = ("Pss", "Pss_Anon", "Pss_File", "Pss_Shmem", "Private_Dirty")


def rollup(pid: int) -> dict[str, int] | None:
    """``smaps_rollup`` of ``pid`` in kB (None once it is gone)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3 and parts[-1] == "kB":
                    out[parts[0].rstrip(":")] = int(parts[1])
    except OSError:
        return None
    return out


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids += [int(x) for x in fh.read().split()]
    except OSError:
        pass
    return [pid] + [p for kid in kids for p in tree(kid)]


def snapshot(label: str) -> dict[str, Any]:
    """Every process of this one's tree: its PSS parts, in MB."""
    procs = []
    for pid in tree(os.getpid()):
        numbers = rollup(pid)
        if numbers is not None:
            procs.append({k: numbers.get(k, 0) / 1024 for k in FIELDS})
    totals = {k: round(sum(p[k] for p in procs), 1) for k in FIELDS}
    return {"label": label, "processes": len(procs), **totals,
            "private_dirty_each": [round(p["Private_Dirty"], 1) for p in procs]}


def _build(case: str, layout: str, count: int, size: int) -> Any:
    from benchmarks import pipeflow_cases as cases

    if case == "dataloader":
        return cases.make_decode_dataloader(layout, count, size, 2)
    return cases.make_decode_loader(layout, count, size, 2, method=case.split("-")[1])


def child_main(case: str, layout: str, count: int, size: int) -> None:
    import benchmarks.pipeflow_cases  # noqa: F401 - the imports belong to the first snapshot

    snaps = [snapshot("imported")]
    batches = _build(case, layout, count, size)
    snaps.append(snapshot("built"))
    best: dict[str, Any] | None = None
    last = 0.0
    for _ in batches:
        if time.monotonic() - last > 0.5:
            last = time.monotonic()
            snap = snapshot("running")
            if best is None or snap["Pss"] > best["Pss"]:
                best = snap
    if best is not None:
        snaps.append(best)
    print("RESULT " + json.dumps(snaps), flush=True)


def run_one(case: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "benchmarks.s4_memory", "--child", case, "--layout", args.layout,
           "--count", str(args.count), "--size", str(args.size)]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"{case} failed: {out.stderr[-2000:]}")
    snaps: list[dict[str, Any]] = json.loads(lines[-1][7:])
    return snaps


def _print(repeat: int, case: str, snap: dict[str, Any]) -> None:
    print(f"[{repeat}] {case:<15} {snap['label']:<9} PSS {snap['Pss']:6.1f} MB: anonymous "
          f"{snap['Pss_Anon']:6.1f}, file {snap['Pss_File']:5.1f}, shmem {snap['Pss_Shmem']:4.1f} "
          f"({snap['processes']} processes; private dirty {snap['private_dirty_each']})", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    p.add_argument("--layout", default="jpeg", choices=("jpeg", "single"))
    p.add_argument("--count", type=int, default=3000, help="samples held in memory")
    p.add_argument("--size", type=int, default=360, help="image side in pixels")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    p.add_argument("--json", help="write every snapshot here")
    args = p.parse_args(argv)
    if args.child:
        child_main(args.child, args.layout, args.count, args.size)
        return
    rows = []
    for r in range(args.repeats):
        for case in args.cases:
            for snap in run_one(case, args):
                rows.append({"case": case, "repeat": r, **snap})
                _print(r, case, snap)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
