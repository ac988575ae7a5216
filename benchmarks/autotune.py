"""Autotune grid: hand-tuned concurrency vs ``"auto"``, measured in the same run.

    python -m benchmarks.autotune [--quick] [--repeats N] [--only TEXT] [--out DIR]
    python -m benchmarks.autotune --baseline DIR [--pairs N] [--quick] [--only TEXT] [--out DIR]

Three workloads, each a grid of explicit worker / in-flight / prefetch values and one
configuration with no concurrency knob set (options whose default is ``"auto"`` are left out;
where the default is not ``"auto"``, the row passes ``"auto"`` and says so: S4's ``map`` stays
inline by default, since running a user's function on threads is not safe for every function):

* S1: many small objects, ``open(read=True)`` over the local moto server behind the delay
  proxy at T=0 and T=20 ms, two DataLoader workers (as the main benchmark's S1);
* S2: tar shards of ImageNet-sized JPEGs, ``decode("torch", resize=224)``, two DataLoader
  workers;
* S4: a JPEG decode in ``map`` over data in memory, on threads and on processes;
* S1 throttled: S1 at T=20 ms with the proxy answering a share of GETs with ``503 SlowDown``
  whatever the rate (retried by the backend), the case where a tuner that halves on every
  retry stays low;
* S1 rate-limited: S1 at T=20 ms with the proxy answering GETs beyond a rate with ``503
  SlowDown``, as a store limiting a prefix's request rate: more in flight only adds refusals.

``--control`` adds to each group a second copy of one explicit row (the one that was fastest
most often in earlier runs: ``open(workers=64)`` in S1, ``open(workers=2)`` rate-limited,
``decode(workers=1), prefetch(2)`` in S2, ``map(workers=2)`` in S4), scored as the auto row is:
control/best is what a fixed configuration as good as the best gets from the same noisy
measurement, the floor of what auto/best can show on the machine.

Every case runs in a fresh process (:mod:`benchmarks.harness`) for the same time on one long
pass, so a tuner's climb is paid inside the measurement. With ``--repeats`` the whole grid
runs again (interleaved, so load changes hit every row alike, and each group's rows rotated by
one place per repeat, so no row is always the last of its group); the table shows the median
per row, and auto/best per repeat gives the spread.

``--baseline DIR`` measures a change to the tuner: it runs only each group's auto row, with this
tree's ``pipeflow`` and with the one of the checkout ``DIR`` (``git worktree add --detach DIR
main``; the benchmark code is this tree's on both sides), in ``--pairs`` interleaved pairs, the
side run first alternating from pair to pair, and shows this/baseline per pair and the median.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pipeflow as pf
from benchmarks import photos
from benchmarks.harness import Case, run_case
from benchmarks.pipeflow_cases import _companions, _decode_shape, _in_memory, _sample, _strip, cpu_count
from benchmarks.scenarios import BUCKET, PNG_FIELDS, _client, _generate, _make_bucket, _server, machine

#: the marker of the row with no knob set
AUTO = "auto"
#: the suffix of a control row's label (``--control``): a copy of an explicit row
CONTROL = " (control)"
LOADER_WORKERS = 2


def _default_is_auto(method: Callable[..., Any], option: str) -> bool:
    return inspect.signature(method).parameters[option].default == AUTO


def _knob(method: Callable[..., Any], option: str, value: Any) -> dict[str, Any]:
    """The keyword to pass: nothing for the auto row when ``"auto"`` is already the default,
    nor when the value is None (the default, whatever it is)."""
    if value is None or (value == AUTO and _default_is_auto(method, option)):
        return {}
    return {option: value}


class _Reported:
    """Iterates ``loader`` and, at the end, writes what the pipeline's stages chose."""

    def __init__(self, pipe: pf.Pipeline, loader: Any, report: str | None) -> None:
        self.pipe, self.loader, self.report = pipe, loader, report

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self.loader
        finally:
            if self.report:
                stats = self.pipe.stats()
                # per process: DataLoader workers' numbers are summed in stats()
                n = stats.processes
                chosen = {label: {k: round(stats[label][k] / n, 1) for k in _REPORTED if k in stats[label]}
                          for label in stats if "inflight" in stats[label]}
                Path(self.report).write_text(json.dumps(chosen))


#: what the auto row reports per stage (per process): its choice, and the store's push-backs
_REPORTED = ("workers", "inflight", "backoffs", "steady_errors", "steps_up", "probes", "followed", "settle_s")


def _loaded(pipe: pf.Pipeline, workers: int, report: str | None) -> _Reported:
    from benchmarks.peers import _common

    if not workers:
        batched = pipe.batch(4)
        return _Reported(batched, batched, report)
    return _Reported(pipe, _common.loader(pipe, workers=workers, batch_size=4), report)


# ---- the factories the child processes call -------------------------------------------------
def make_s1(prefix: str, count: int, repeat: int, open_workers: Any, max_inflight: Any = None,
            report: str | None = None) -> _Reported:
    fields = tuple(PNG_FIELDS)
    base = prefix.rstrip("/")
    first = [f"{base}/{i:06d}.{fields[0]}" for i in range(count)] * repeat
    options = _knob(pf.Pipeline.open, "workers", open_workers)
    if max_inflight is not None:
        options["max_inflight"] = max_inflight
    pipe = (pf.from_items(first).shard_by_rank().map(functools.partial(_companions, fields)).unbatch()
            .open(read=True, **options).group_pairs().map(functools.partial(_sample, fields)))
    return _loaded(pipe, LOADER_WORKERS, report)


def _decode_224(sample: dict[str, Any]) -> tuple[int, ...]:
    return tuple(sample["jpg"].shape)


def make_s2(shards: list[str], repeat: int, decode_workers: Any, prefetch: Any,
            report: str | None = None) -> _Reported:
    pipe = pf.from_items(shards * repeat).shard_by_rank().open().untar().group_pairs().map(_strip)
    pipe = pipe.prefetch(**_knob(pf.Pipeline.prefetch, "size", prefetch))
    pipe = pipe.decode("torch", resize=(224, 224), **_knob(pf.Pipeline.decode, "workers", decode_workers))
    return _loaded(pipe.map(_decode_224), LOADER_WORKERS, report)


def make_s4(count: int, workers: Any, method: str, report: str | None = None) -> _Reported:
    blobs = _in_memory("jpeg", count, 360)
    knob = _knob(pf.Pipeline.map, "workers", workers)
    pipe = pf.from_items(blobs).map(_decode_shape, method=method, **knob)
    # the fork server (which imports torch once) starts before the measurement: on a loaded
    # machine its start-up would otherwise fill a short case, whatever the concurrency
    for _ in pipe.take(16):
        pass
    return _loaded(pipe, 0, report)


# ---- the grid ------------------------------------------------------------------------------
@dataclass
class Grid:
    group: str
    factory: str
    common: dict[str, Any]
    #: row label -> the factory's knob arguments; the auto row is labelled AUTO
    rows: dict[str, dict[str, Any]]
    proxy: Any = None
    results: dict[str, list[float]] = field(default_factory=dict)
    #: what the auto row's stages chose, per repeat (per process)
    chosen: list[dict[str, Any]] = field(default_factory=list)


def _auto_label(grid: Grid) -> str:
    knobs = grid.rows[AUTO]
    methods = {"open_workers": (pf.Pipeline.open, "workers"),
               "decode_workers": (pf.Pipeline.decode, "workers"),
               "prefetch": (pf.Pipeline.prefetch, "size"), "workers": (pf.Pipeline.map, "workers")}
    passed = [f"{methods[k][1]}='auto'" for k, v in knobs.items()
              if v == AUTO and k in methods and not _default_is_auto(*methods[k])]
    return "auto (no knob set)" if not passed else f"auto ({', '.join(passed)})"


#: the share of GETs the throttling proxy answers with 503 SlowDown
THROTTLED = 0.1
#: GETs per second the rate-limiting proxy lets through (for the whole job: two DataLoader
#: workers); beyond, 503 SlowDown. Below what S1 at T=20 ms reaches unthrottled
RATE_LIMIT = 100.0


def _s1_rows(quick: bool) -> dict[str, dict[str, Any]]:
    inflight = (4, 16, 64) if quick else (2, 4, 8, 16, 32, 64)
    rows: dict[str, dict[str, Any]] = {f"open(workers={w})": {"open_workers": w} for w in inflight}
    if not quick:
        rows["open(workers=16, max_inflight=64)"] = {"open_workers": 16, "max_inflight": 64}
    rows[AUTO] = {"open_workers": AUTO}
    return rows


def with_control(rows: dict[str, dict[str, Any]], label: str) -> dict[str, dict[str, Any]]:
    """``rows`` and a second copy of row ``label``, the control (see the module doc)."""
    return {**rows, label + CONTROL: dict(rows[label])}


def _controlled(grids: list[Grid], quick: bool) -> list[Grid]:
    picks = {"rate-limited": "open(workers=2)", "S1": "open(workers=64)",
             "S2": "decode(workers=1), prefetch(2)", "S4": "map(workers=2)"}
    for grid in grids:
        label = next(v for k, v in picks.items() if k in grid.group)
        if quick and label not in grid.rows:  # the quick grid has no open(workers=2)
            label = next(k for k in grid.rows if k != AUTO)
        grid.rows = with_control(grid.rows, label)
    return grids


def _grids(quick: bool, s1: dict[str, Any], s2: dict[str, Any], proxies: dict[float, Any],
           throttled: Any, limited: Any) -> list[Grid]:
    grids = []
    rows: dict[str, dict[str, Any]]
    for t, proxy in proxies.items():
        group = f"S1 PNG pairs, open(read=True), T={t:g} ms"
        grids.append(Grid(group, "make_s1", s1, _s1_rows(quick), proxy))
    grids.append(Grid(f"S1 throttled: 503 SlowDown on {THROTTLED:.0%} of GETs, T=20 ms", "make_s1", s1,
                      _s1_rows(quick), throttled))
    grids.append(Grid(f"S1 rate-limited: 503 SlowDown above {RATE_LIMIT:g} GETs/s, T=20 ms", "make_s1", s1,
                      _s1_rows(quick), limited))
    rows = {}
    for d in (0, 1, 2) if quick else (0, 1, 2, 4):
        for p in (2, 64) if not quick or d == 1 else (2,):
            rows[f"decode(workers={d}), prefetch({p})"] = {"decode_workers": d, "prefetch": p}
    rows[AUTO] = {"decode_workers": AUTO, "prefetch": None}
    grids.append(Grid("S2 tar shards, decode to 224", "make_s2", s2, rows, proxies[max(proxies)]))
    for method in ("thread", "process"):
        counts = (1, 2, 4) if quick else (1, 2, 3, 4, 8)
        rows = {f"map(workers={w})": {"workers": w, "method": method} for w in counts}
        rows[AUTO] = {"workers": AUTO, "method": method}
        grids.append(Grid(f"S4 JPEG decode in map, {method} workers", "make_s4", {"count": 200_000}, rows))
    return grids


def _run_row(grid: Grid, label: str, seconds: float, workdir: Path, log: Callable[[str], None],
             pipeflow_from: str | None = None) -> float:
    report = workdir / f"choice-{abs(hash((grid.group, label)))}.json"
    report.unlink(missing_ok=True)
    kwargs = {**grid.common, **grid.rows[label], "report": str(report) if label == AUTO else None}
    case = Case("autotune", grid.group, label, f"benchmarks.autotune:{grid.factory}", kwargs,
                max_seconds=seconds, min_seconds=seconds, max_samples=10**9)
    env = {}
    if grid.proxy is not None:
        env = {"AWS_ENDPOINT_URL": grid.proxy.url, "S3_ENDPOINT_URL": grid.proxy.url}
    row = run_case(case, proxy_url=grid.proxy.url if grid.proxy else None, env=env, log=lambda _: None,
                   pipeflow_from=pipeflow_from)
    if "error" in row:
        log(f"  ! {grid.group} / {label}: {row['error'][-800:]}")
        return 0.0
    if label == AUTO and report.exists():
        grid.chosen.append(json.loads(report.read_text()))
    side = "@base" if pipeflow_from else ""
    log(f"  {grid.group:<42} {label + side:<36} {row['samples_per_s']:>9.1f} samples/s")
    return float(row["samples_per_s"])


def _order(labels: list[str], repeat: int) -> list[str]:
    """The rows of a group in the order repeat ``repeat`` runs them: rotated by one each repeat.
    Cases slow down as a run goes on (in the quiet run of 2026-11-25 23:09 every explicit row of
    the plain S1 groups was 3-21% slower than in the repeat before), so a row always run last
    (the auto row, before this) would carry that drift alone."""
    shift = repeat % len(labels)
    return labels[shift:] + labels[:shift]


def _data(quick: bool, endpoint: str) -> tuple[dict[str, Any], dict[str, Any]]:
    count = 200 if quick else 400
    prefix = f"s3://{BUCKET}/autotune-s1/"
    _generate("single", prefix, count=count, image_size=128)
    s1 = {"prefix": prefix, "count": count, "repeat": 200}
    shards = photos.write_shards(_client(endpoint), BUCKET, "autotune-s2", "imagenet",
                                 count=160 if quick else 400, shard_mb=4)
    return s1, {"shards": shards.urls, "repeat": 200}


@contextlib.contextmanager
def _bench(quick: bool, only: str, log: Callable[[str], None],
           control: bool = False) -> Iterator[tuple[Path, list[Grid]]]:
    """The server, the data, the proxies and the chosen groups, for the time of a run."""
    from pipeflow.testing.proxy import Faults, ProxyProcess

    with (tempfile.TemporaryDirectory(prefix="pipeflow-autotune-") as tmp,
          _server("moto", log=log) as endpoint, contextlib.ExitStack() as stack):
        _make_bucket(endpoint)
        s1, s2 = _data(quick, endpoint)
        proxies = {t: stack.enter_context(ProxyProcess(endpoint, delay_ms=t)) for t in (0.0, 20.0)}
        throttled = stack.enter_context(ProxyProcess(endpoint, delay_ms=20.0,
                                                     faults=Faults(error_rate=THROTTLED, seed=1)))
        limited = stack.enter_context(ProxyProcess(endpoint, delay_ms=20.0,
                                                   faults=Faults(rate_limit=RATE_LIMIT)))
        grids = [g for g in _grids(quick, s1, s2, proxies, throttled, limited)
                 if only.lower() in g.group.lower()]
        yield Path(tmp), _controlled(grids, quick) if control else grids


def _head(quick: bool, started: float) -> dict[str, Any]:
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)), "quick": quick,
            "seconds_per_case": 6.0 if quick else 15.0, "machine": machine(), "cores": cpu_count()}


def run(quick: bool, repeats: int, log: Callable[[str], None] = print, only: str = "",
        control: bool = False) -> dict[str, Any]:
    head = _head(quick, time.time())
    with _bench(quick, only, log, control) as (workdir, grids):
        for r in range(repeats):
            log(f"== repeat {r + 1} of {repeats}")
            for grid in grids:
                for label in _order(list(grid.rows), r):
                    grid.results.setdefault(label, []).append(
                        _run_row(grid, label, head["seconds_per_case"], workdir, log))
    return {**head, "repeats": repeats,
            "grids": [{"group": g.group, "auto": _auto_label(g), "results": g.results, "chosen": g.chosen}
                      for g in grids]}


# ---- A/B: this tree's auto row against another checkout's -------------------------------------
THIS, BASE = "this", "base"


def pair_order(pair: int) -> tuple[str, str]:
    """The sides of pair ``pair`` in the order they run: this tree first in even pairs, the
    baseline first in odd ones, so the drift inside a pair (a case slows the next one, the
    load moves) favours neither side."""
    return (THIS, BASE) if pair % 2 == 0 else (BASE, THIS)


def ab_summary(this: list[float], base: list[float]) -> dict[str, Any]:
    """Per pair this/base (a failed baseline case, 0 samples/s, gives no ratio) and the
    median, with the lowest and highest ratio as the spread."""
    if len(this) != len(base):
        raise ValueError(f"unpaired runs: {len(this)} of this tree, {len(base)} of the baseline")
    ratios = [t / b for t, b in zip(this, base) if b > 0]
    if not ratios:
        return {"ratios": [], "median": None, "low": None, "high": None}
    return {"ratios": [round(r, 3) for r in ratios], "median": round(statistics.median(ratios), 3),
            "low": round(min(ratios), 3), "high": round(max(ratios), 3)}


def _linked(baseline: Path, workdir: Path) -> str:
    """A directory holding only a link to the baseline's ``pipeflow`` (see ``child_path``)."""
    package = baseline.resolve() / "pipeflow"
    if not (package / "__init__.py").exists():
        raise SystemExit(f"--baseline {baseline}: no pipeflow package there")
    linked = workdir / "baseline"
    linked.mkdir()
    (linked / "pipeflow").symlink_to(package, target_is_directory=True)
    return str(linked)


def run_ab(quick: bool, pairs: int, baseline: Path, log: Callable[[str], None] = print,
           only: str = "") -> dict[str, Any]:
    """Only each group's auto row, ``pairs`` times on each side, in interleaved pairs."""
    head = _head(quick, time.time())
    runs: dict[str, dict[str, list[float]]] = {}
    loads: list[float] = []
    with _bench(quick, only, log) as (workdir, grids):
        sides = {THIS: None, BASE: _linked(baseline, workdir)}
        chosen: dict[str, dict[str, list[Any]]] = {g.group: {THIS: [], BASE: []} for g in grids}
        for p in range(pairs):
            loads.append(os.getloadavg()[0])
            log(f"== pair {p + 1} of {pairs} ({' then '.join(pair_order(p))}), load {loads[-1]:.1f}")
            for grid in grids:
                for side in pair_order(p):
                    rate = _run_row(grid, AUTO, head["seconds_per_case"], workdir, log, sides[side])
                    runs.setdefault(grid.group, {THIS: [], BASE: []})[side].append(rate)
                    # what the side's stages chose (per process), or nothing if it failed
                    chosen[grid.group][side].append(grid.chosen.pop() if grid.chosen else {})
                    if chosen[grid.group][side][-1]:
                        log(f"    chose {_chosen(chosen[grid.group][side][-1])}")
    return {**head, "baseline": str(baseline.resolve()), "pairs": pairs, "loads": loads,
            "groups": [{"group": g, **r, **ab_summary(r[THIS], r[BASE]), "chosen": chosen[g]}
                       for g, r in runs.items()]}


def ab_table(result: dict[str, Any]) -> str:
    lines = [f"{result['date']}, {result['pairs']} pairs of the auto row, {result['seconds_per_case']:g} s "
             f"per case, this tree against {result['baseline']}, load {min(result['loads']):.1f}-"
             f"{max(result['loads']):.1f}", "",
             "| workload | this (median) | baseline (median) | this/baseline per pair "
             "| median [low .. high] |",
             "|---|---:|---:|---|---|"]
    for g in result["groups"]:
        per = ", ".join(f"{r:.2f}" for r in g["ratios"])
        summary = f"{g['median']:.2f} [{g['low']:.2f} .. {g['high']:.2f}]" if g["ratios"] else "-"
        lines.append(f"| {g['group']} | {statistics.median(g[THIS]):.0f} | {statistics.median(g[BASE]):.0f} "
                     f"| {per} | {summary} |")
    return "\n".join(lines)


# ---- the table -----------------------------------------------------------------------------
def _chosen(stages: dict[str, Any]) -> str:
    def one(label: str, v: dict[str, Any]) -> str:
        pushed = [f"{v[k]:g} {name}" for k, name in (("backoffs", "backoffs"), ("steady_errors", "undone"))
                  if v.get(k)]
        note = f" ({', '.join(pushed)})" if pushed else ""
        return f"{label} {v.get('workers', '-'):g}/{v['inflight']:g}{note}"

    return ", ".join(one(label, v) for label, v in stages.items())


def table(result: dict[str, Any]) -> str:
    """The summary (auto/best: against the fastest explicit row of each repeat, a maximum of
    noisy draws that favours the grid; auto/best point: against the row with the best median,
    in the same repeat) and every row's median."""
    lines = ["| workload | configuration | samples/s | vs best |", "|---|---|---:|---:|"]
    controls = ["| workload | control row | control/best (median) | control/best per repeat "
                "| auto/best (median) |", "|---|---|---:|---|---:|"]
    summary = ["| workload | best grid point | best | auto | auto/best (median) | auto/best per repeat "
               "| auto/best point (median) | auto chose (workers/in flight per process, per repeat) |",
               "|---|---|---:|---:|---:|---|---:|---|"]
    for g in result["grids"]:
        med = {label: statistics.median(v) for label, v in g["results"].items()}
        grid = {k: v for k, v in med.items() if k != AUTO and not k.endswith(CONTROL)}
        best_label = max(grid, key=grid.__getitem__)
        best = grid[best_label]
        for label, value in med.items():
            shown = g["auto"] if label == AUTO else label
            lines.append(f"| {g['group']} | {shown} | {value:.0f} | {value / best if best else 0:.2f} |")
        ratios = per_repeat(g["results"], AUTO)
        per = ", ".join(f"{x:.2f}" for x in ratios)
        control = next((k for k in g["results"] if k.endswith(CONTROL)), None)
        if control is not None:
            checks = per_repeat(g["results"], control)
            controls.append(f"| {g['group']} | {control} | {statistics.median(checks):.2f} | "
                            f"{', '.join(f'{x:.2f}' for x in checks)} | {statistics.median(ratios):.2f} |")
        pairs = zip(g["results"][AUTO], g["results"][best_label])
        point = statistics.median(a / b if b else 0.0 for a, b in pairs)
        chosen = " / ".join(_chosen(c) for c in g["chosen"])
        summary.append(f"| {g['group']} | {best_label} | {best:.0f} | {med[AUTO]:.0f} | "
                       f"{statistics.median(ratios):.2f} | {per} | {point:.2f} | {chosen} |")
    m = result["machine"]
    head = (f"{result['date']}, {m['cpu_affinity']} cores ({m['processor']}), {m['memory_gb']} GB, "
            f"{'quick' if result['quick'] else 'full'} grid, {result['seconds_per_case']:g} s per case, "
            f"{result['repeats']} repeat(s), median per row")
    shown = [*summary, "", *controls] if len(controls) > 2 else summary
    return "\n".join([head, "", *shown, "", *lines])


def per_repeat(results: dict[str, list[float]], label: str) -> list[float]:
    """Row ``label`` against the fastest explicit row (not the auto row, not a control) of each
    repeat."""
    ratios = []
    for r in range(len(results[label])):
        best_r = max(v[r] for k, v in results.items() if k != AUTO and not k.endswith(CONTROL))
        ratios.append(results[label][r] / best_r if best_r else 0.0)
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller grid and 6 s per case")
    parser.add_argument("--repeats", type=int, default=1, help="run the whole grid this many times")
    parser.add_argument("--only", default="", help="run the groups whose name contains this text")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="where results.json goes")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="A/B: only the auto row, against pipeflow imported from the checkout DIR")
    parser.add_argument("--pairs", type=int, default=8, help="with --baseline: pairs per group")
    parser.add_argument("--control", action="store_true",
                        help="add a second copy of one explicit row per group, scored as auto is")
    args = parser.parse_args()
    if args.baseline:
        result = run_ab(args.quick, args.pairs, args.baseline, only=args.only)
        name, text = "autotune-ab", ab_table(result)
    else:
        result = run(args.quick, args.repeats, only=args.only, control=args.control)
        name, text = "autotune", table(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2))
    (args.out / f"{name}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
