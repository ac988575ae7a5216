"""S4 with passes of any length: ``loader()`` (threads or processes) against ``DataLoader`` workers.

The quick S4 sizes hold 12 PNGs, so a case there is a series of 12-sample passes, and a
``DataLoader(num_workers=2)`` without persistent workers forks its workers again for every
pass: those rows measure the fork as much as the decode. Here the pass length is a parameter
(``--count``), so the same factories (:mod:`benchmarks.pipeflow_cases`) can be compared in
passes as long as a real epoch. The cases alternate inside each repeat, all in this process
tree (the pool of ``map(method="process")`` stays warm across passes, as it does across
epochs); CPU is the whole tree's, and the training process's share is reported apart (with
process workers it holds the hand-off of every input).

Each row also says how much CPU the rest of the machine used meanwhile (``others_cpu_pct``), and
how much ran at a positive nice (``niced_pct``: other people's niced jobs, and the benchmark's
own CPU too when it runs niced). On a shared machine that is what moves a
case's rate: with the kernel's autogroup scheduling every login session gets an equal share of
the cores whatever its processes' nice values, so colleagues' niced jobs take cores from the
benchmark, and a case that ran while they were busy got fewer. ``--compete N`` makes that
competition steady instead: N busy loops in a session of their own, at nice 19, for the whole
run, so every case meets the same.

    python -m benchmarks.s4_passes --layout single --count 400 --size 1024 --seconds 6 --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil

from benchmarks import pipeflow_cases

CASES = ("dataloader", "loader-process", "loader-thread")


def _cpu(proc: psutil.Process) -> tuple[float, float]:
    """(CPU seconds of the whole tree, reaped children included; of ``proc`` alone). Children in
    another session are not the case's work (the ``--compete`` loops) and are left out."""
    total = 0.0
    session = os.getsid(0)
    for p in [proc, *proc.children(recursive=True)]:
        try:
            if p.pid != proc.pid and os.getsid(p.pid) != session:
                continue
            t = p.cpu_times()
        except (psutil.Error, OSError):  # a DataLoader worker that just ended
            continue
        total += t.user + t.system + t.children_user + t.children_system
    own = proc.cpu_times()
    return total, own.user + own.system


#: the fields of /proc/stat's ``cpu`` line that count as busy (user, nice, system, irq,
#: softirq): idle, iowait and steal do not; guest time is already inside user and nice
_BUSY_FIELDS = (0, 1, 2, 5, 6)
_NICE_FIELD = 1


def machine_cpu(stat_line: str, ticks_per_s: float) -> tuple[float, float]:
    """(busy CPU seconds of the whole machine since boot, of them at a positive nice) from the
    ``cpu`` line of /proc/stat."""
    fields = [int(x) for x in stat_line.split()[1:]]
    return (sum(fields[i] for i in _BUSY_FIELDS if i < len(fields)) / ticks_per_s,
            fields[_NICE_FIELD] / ticks_per_s)


def _machine_now() -> tuple[float, float]:
    """:func:`machine_cpu` now; zeros where there is no /proc/stat (not Linux)."""
    try:
        with open("/proc/stat") as fh:
            line = fh.readline()
    except OSError:
        return 0.0, 0.0
    return machine_cpu(line, os.sysconf("SC_CLK_TCK"))


#: a competing busy loop: nice 19, and it ends by itself once the process that started it
#: (argv[1]) is gone, checking every ~100k iterations (milliseconds of CPU), so a benchmark
#: killed outright leaves no loop spinning under init
_LOOP = ("import os, sys\nos.nice(19)\nparent = int(sys.argv[1])\n"
         "while os.getppid() == parent:\n    for _ in range(100_000):\n        pass\n")


@contextlib.contextmanager
def competing(count: int) -> Iterator[list[int]]:
    """``count`` busy loops at nice 19 in a session of their own (their own autogroup, as a
    colleague's job is) while the block runs; stopped and reaped after it. Yields their pids.

    Each loop is recorded as soon as it starts, so a later start that fails still stops the
    earlier ones; a loop whose parent dies without reaching this ``finally`` ends by itself.
    """
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen([sys.executable, "-c", _LOOP, str(os.getpid())],
                                          start_new_session=True))
        yield [proc.pid for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """SIGTERM raises :class:`SystemExit` while the block runs, so ``finally`` blocks (the
    competing loops' stop) run on ``kill`` as they do on Ctrl-C; the old handler comes back."""
    def _exit(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def factory(case: str, layout: str, count: int, size: int) -> Callable[[], Any]:
    """The iterable of one case: S4's own factories, 2 workers, batches of 4."""
    if case == "dataloader":
        return lambda: pipeflow_cases.make_decode_dataloader(layout, count, size, 2)
    method = case.removeprefix("loader-")
    return lambda: pipeflow_cases.make_decode_loader(layout, count, size, 2, method=method)


def measure(make: Callable[[], Any], seconds: float) -> dict[str, float]:
    """Passes over ``make()``'s iterable until ``seconds`` have gone (the last pass finishes)."""
    iterable = make()
    me = psutil.Process()
    samples = passes = 0
    tree0, own0 = _cpu(me)
    busy0, niced0 = _machine_now()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        passes += 1
        samples += sum(len(batch) for batch in iterable)
    elapsed = time.perf_counter() - t0
    tree1, own1 = _cpu(me)
    busy1, niced1 = _machine_now()
    close = getattr(iterable, "close", None)
    if callable(close):
        close()
    return {"samples_per_s": samples / elapsed, "cpu_ms_per_sample": 1000 * (tree1 - tree0) / samples,
            "main_cpu_ms_per_sample": 1000 * (own1 - own0) / samples,
            "cpu_pct": 100 * (tree1 - tree0) / elapsed,
            "others_cpu_pct": 100 * (busy1 - busy0 - (tree1 - tree0)) / elapsed,
            "niced_pct": 100 * (niced1 - niced0) / elapsed, "passes": passes, "samples": samples,
            "load_1min": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--layout", default="single", choices=("single", "jpeg"))
    ap.add_argument("--count", type=int, default=400, help="samples a pass")
    ap.add_argument("--size", type=int, default=1024, help="image side in pixels")
    ap.add_argument("--seconds", type=float, default=6.0, help="per case and repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    ap.add_argument("--compete", type=int, default=0, metavar="N",
                    help="N busy loops at nice 19 in another session during the whole run")
    ap.add_argument("--out", help="write every row here as JSON")
    args = ap.parse_args(argv)
    with sigterm_exits(), competing(args.compete):
        rows = _run(args)
    _summary(rows, args.cases)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"args": vars(args), "rows": rows}, fh, indent=1)


def _run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for repeat in range(args.repeats):
        for case in args.cases:
            row = {"case": case, "repeat": repeat, "time": time.strftime("%H:%M:%S"),
                   **measure(factory(case, args.layout, args.count, args.size), args.seconds)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def _summary(rows: list[dict[str, Any]], cases: list[str]) -> None:
    for case in cases:
        mine = [r for r in rows if r["case"] == case]
        rates = [r["samples_per_s"] for r in mine]
        cpu = [r["cpu_ms_per_sample"] for r in mine]
        others = [r["others_cpu_pct"] for r in mine]
        print(f"{case:15s} median {statistics.median(rates):7.1f} samples/s "
              f"({', '.join(f'{x:.1f}' for x in rates)}), CPU {min(cpu):.2f}-{max(cpu):.2f} ms a sample, "
              f"the rest of the machine {', '.join(f'{x:.0f}' for x in others)} % CPU")


if __name__ == "__main__":
    main()
