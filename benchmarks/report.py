"""Turns a benchmark result (``results.json``) into a Markdown report and PNG plots.

    python -m benchmarks.report results.json [--out DIR]

Ratios are pipeflow / peer within one comparison group (same data, same server, same latency,
same run); absolute numbers on a shared 2-core machine move from run to run, ratios much less.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.scenarios import (
    BARE_DATALOADER,
    BARE_OWN_DECODER,
    BARE_PIL,
    S4_DATALOADER,
    SPDL_LIBRARIES,
    THREAD_NATIVE,
)

PIPEFLOW = "pipeflow"
#: the peers' decode on a bare pool (the older label too, for results written before)
PIL_BARE_LOOPS = (BARE_PIL, "bare decode loop (in memory)")


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _groups(rows: list[dict[str, Any]], scenario: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r["scenario"] == scenario:
            out[r["group"]].append(r)
    return out


def _ok(r: dict[str, Any]) -> bool:
    return "error" not in r and bool(r.get("samples_per_s"))


def _pipeflow(group: list[dict[str, Any]], workers: int | None = None) -> dict[str, Any] | None:
    for r in group:
        if r["library"] == PIPEFLOW and _ok(r) and (workers is None or r["workers"] == workers):
            return r
    return None


def _ours(r: dict[str, Any]) -> bool:
    """pipeflow's own rows: the library itself and its recipes (never counted as peers)."""
    return r["library"].startswith(PIPEFLOW) or r["library"].startswith("recipe ")


def _ratio(a: float | None, b: float | None) -> float | None:
    if not a or not b:
        return None
    return round(a / b, 2)


def _req(r: dict[str, Any], method: str) -> Any:
    return (r.get("requests") or {}).get(method, 0) if _ok(r) else None


def _table(group: list[dict[str, Any]]) -> list[str]:
    pf = _pipeflow(group)
    lines = [
        "| library | workers | samples/s | steady samples/s | MB/s | CPU % | server + proxy CPU % | "
        "CPU ms/sample | peak PSS MB | first batch s | GET | HEAD | pipeflow / this |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(group, key=lambda r: (r["library"] != PIPEFLOW, -(r.get("samples_per_s") or 0))):
        if not _ok(r):
            lines.append(
                f"| {r['library']} | {r['workers']} | failed: {_oneline(r.get('error', 'no samples'))} "
                "| | | | | | | | | | |"
            )
            continue
        ratio = _ratio(pf["samples_per_s"] if pf else None, r["samples_per_s"]) if r is not pf else None
        cpu_ms = r.get("cpu_s_per_sample")
        lines.append(
            f"| {r['library']} | {r['workers']} | {_fmt(r['samples_per_s'])} | "
            f"{_fmt(r.get('steady_samples_per_s'))} | {_fmt(r.get('mb_per_s'))} | "
            f"{_fmt(r.get('cpu_pct'))} | {_others_cpu(r)} | {_fmt(cpu_ms * 1000 if cpu_ms else None, 2)} | "
            f"{_fmt(r.get('peak_pss_mb'), 0)} | {_fmt(r.get('first_batch_s'), 2)} | "
            f"{_req(r, 'GET_OBJECT')} | {_req(r, 'HEAD')} | {_fmt(ratio, 2) if ratio else ''} |"
        )
    return lines


def cpu_vs_own_decoder(group: list[dict[str, Any]]) -> dict[str, float] | None:
    """pipeflow's client CPU per sample over that of the bare loop running pipeflow's own decode
    call on the same samples in memory (the decode groups; None elsewhere). With ``--repeats``,
    each side is the median of its runs."""
    def cpu_ms(library: str) -> float | None:
        runs = [r["cpu_s_per_sample"] for r in group
                if r["library"] == library and _ok(r) and r.get("cpu_s_per_sample")]
        return statistics.median(runs) * 1000 if runs else None

    ours, ref, loader = cpu_ms(PIPEFLOW), cpu_ms(BARE_OWN_DECODER), cpu_ms(BARE_DATALOADER)
    if not ours or not ref:
        return None
    out = {"pipeflow_ms": round(ours, 2), "bare_ms": round(ref, 2), "ratio": round(ours / ref, 2)}
    if loader:
        out.update(dataloader_ms=round(loader, 2), dataloader_ratio=round(loader / ref, 2))
    return out


def _cpu_line(group: list[dict[str, Any]]) -> list[str]:
    own = cpu_vs_own_decoder(group)
    if not own:
        return []
    line = (f"Client CPU per sample, pipeflow / {BARE_OWN_DECODER}: **{own['ratio']:.2f}** "
            f"({own['pipeflow_ms']:.2f} ms / {own['bare_ms']:.2f} ms)")
    if "dataloader_ratio" in own:
        line += (f"; the same decode in a plain DataLoader ({BARE_DATALOADER}): "
                 f"{own['dataloader_ratio']:.2f} ({own['dataloader_ms']:.2f} ms)")
    return [line + ".", ""]


def _others_cpu(row: dict[str, Any]) -> str:
    """The server's + the proxy's CPU % over the case (what the client left them), or blank."""
    others = row.get("others_cpu_pct") or {}
    if not others:
        return ""
    parts = [others.get("server"), others.get("proxy")]
    return " + ".join(_fmt(p) if p is not None else "?" for p in parts)


def _oneline(text: str, limit: int = 160) -> str:
    """The last line of an error that says something, for a table cell."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    useful = [ln for ln in lines if "Error" in ln or "error" in ln or ln.startswith("unavailable")]
    line = (useful or lines or [""])[-1] if not str(text).startswith("unavailable") else lines[0]
    return line.replace("|", "/")[:limit]


def recipe_pairs(group: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """Each recipe with the article's code it reproduces (same workers), one pair per recipe:
    with repeats, each side is its median over its good runs (never one run against another)."""
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in group:
        if r.get("reproduces"):
            runs.setdefault((r["library"], r["workers"]), []).append(r)
    pairs = []
    for (_, workers), mine in runs.items():
        originals = [o for o in group if o["library"] == mine[0]["reproduces"] and o["workers"] == workers]
        pairs.append((_median_row(mine), _median_row(originals) if originals else None))
    return pairs


def _median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row for a case's runs: the first good one with the median samples/s of the good ones
    (the first run, with its error, when none is good)."""
    good = [r for r in runs if _ok(r)]
    if not good:
        return runs[0]
    return {**good[0], "samples_per_s": _median(good, "samples_per_s"), "runs": len(good)}


def _recipe_table(group: list[dict[str, Any]]) -> list[str]:
    pairs = recipe_pairs(group)
    if not pairs:
        return []
    lines = ["| recipe (defaults) | article's code | recipe samples/s | original samples/s | "
             "recipe / original |", "|---|---|---:|---:|---:|"]
    for r, o in pairs:
        rs = r.get("samples_per_s") if _ok(r) else None
        os_ = o.get("samples_per_s") if o and _ok(o) else None
        lines.append(f"| {r['library'].removeprefix('recipe ')} | {r['reproduces']} | {_fmt(rs)} | "
                     f"{_fmt(os_)} | {_fmt(_ratio(rs, os_), 2)} |")
    return lines + [""]


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """The headline ratios (the targets of the benchmark issue), computed from the rows."""
    rows = result["rows"]
    summary: dict[str, Any] = {"s1": {}, "s2": {}, "s3": {}, "s4": {}, "recipes": {}}
    for name, group in _groups(rows, "s1").items():
        pf = _pipeflow(group)
        peers = [r for r in group if _ok(r) and not _ours(r)]
        if not pf or not peers:
            continue
        best = max(peers, key=lambda r: r["samples_per_s"])
        same = [r for r in peers if r["workers"] == pf["workers"]]
        ceiling = result["ceilings"].get(f"s1 {name}", {}).get("gets_per_s")
        per_sample = pf.get("objects_per_sample", 2)
        t = pf.get("latency_ms") or 0
        inflight = pf["workers"] * 32
        summary["s1"][name] = {
            "pipeflow_samples_per_s": pf["samples_per_s"],
            "server_ceiling_samples_per_s": round(ceiling / per_sample, 1) if ceiling else None,
            "fraction_of_server_ceiling": _ratio(pf["samples_per_s"] * per_sample, ceiling),
            "latency_bound_samples_per_s": round(inflight / (t / 1000) / per_sample, 1) if t else None,
            "best_peer": f"{best['library']} ({best['workers']} workers)",
            "vs_best_peer_any_workers": _ratio(pf["samples_per_s"], best["samples_per_s"]),
            "vs_each_peer_same_workers": {
                r["library"]: _ratio(pf["samples_per_s"], r["samples_per_s"]) for r in same
            },
            "cpu_vs_best_peer": _ratio(pf.get("cpu_pct"), best.get("cpu_pct")),
            "memory_vs_best_peer": _ratio(pf.get("peak_pss_mb"), best.get("peak_pss_mb")),
            "first_batch_s": pf.get("first_batch_s"),
            "head_requests": _req(pf, "HEAD"),
        }
    for name, group in _groups(rows, "s2").items():
        pf = _pipeflow(group)
        peers = [
            r
            for r in group
            if _ok(r) and not _ours(r) and "bare" not in r["library"]
        ]
        if not pf or not peers:
            continue
        best = max(peers, key=lambda r: r["samples_per_s"])
        entry = {
            "pipeflow_samples_per_s": pf["samples_per_s"],
            "pipeflow_mb_per_s": pf.get("mb_per_s"),
            "best_peer": best["library"],
            "vs_best_peer": _ratio(pf["samples_per_s"], best["samples_per_s"]),
            "first_batch_s": pf.get("first_batch_s"),
        }
        bare = next((r for r in group if r["library"] in PIL_BARE_LOOPS and _ok(r)), None)
        if bare:
            entry["vs_bare_decode_loop"] = _ratio(pf["samples_per_s"], bare["samples_per_s"])
        own = cpu_vs_own_decoder(group)
        if own:
            entry["cpu_per_sample_vs_bare_own_decoder"] = own["ratio"]
            if "dataloader_ratio" in own:
                entry["cpu_per_sample_bare_dataloader_vs_bare_own_decoder"] = own["dataloader_ratio"]
        stream = result["ceilings"].get(f"s2 stream {pf.get('shard_mb'):g} MB shard", {}).get("mb_per_s")
        if stream and not pf.get("decode"):
            entry["fraction_of_raw_stream"] = _ratio(pf.get("mb_per_s"), stream)
        entry["peak_pss_mb"] = pf.get("peak_pss_mb")
        cpu = pf.get("cpu_s_per_sample")
        entry["cpu_ms_per_sample"] = round(cpu * 1000, 3) if cpu else None
        summary["s2"][name] = entry
    summary["recipes"] = {
        f"{r['scenario']} {r['group']}: {r['library'].removeprefix('recipe ')}": _ratio(
            r.get("samples_per_s") if _ok(r) else None, o.get("samples_per_s") if o and _ok(o) else None)
        for scen in ("s1", "s2") for group in _groups(rows, scen).values() for r, o in recipe_pairs(group)
    }
    for name, group in _groups(rows, "s3").items():
        by = {r["library"]: r for r in group if _ok(r)}
        cached, local = by.get("pipeflow + cache()"), by.get("pipeflow, local disk")
        if cached:
            summary["s3"][name] = {
                "gets_per_epoch_with_cache": [e["requests"].get("GET_OBJECT", 0) for e in cached["epochs"]],
                "gets_per_epoch_without_cache": [
                    e["requests"].get("GET_OBJECT", 0)
                    for e in by.get("pipeflow, no cache", {}).get("epochs", [])
                ],
                "epoch2_vs_local_disk": _ratio(
                    cached["epochs"][1]["samples_per_s"], local["epochs"][1]["samples_per_s"]
                )
                if local and len(cached["epochs"]) > 1
                else None,
            }
    for name, group in _groups(rows, "s4").items():
        pf = _pipeflow(group)
        bare = next((r for r in group if r["library"].startswith("bare") and _ok(r)), None)
        if pf and bare:
            summary["s4"][name] = {
                "pipeflow_samples_per_s": pf["samples_per_s"],
                "bare_samples_per_s": bare["samples_per_s"],
                "overhead_pct": round(100 * (1 - pf["samples_per_s"] / bare["samples_per_s"]), 1),
            }
    summary["thread_native"] = thread_native(rows)
    summary["against_spdl"] = against_spdl(rows)
    return summary


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def median(key: str, scale: float = 1.0, digits: int = 1) -> float | None:
        value = _median(runs, key)
        return None if value is None else round(value * scale, digits)

    return {"runs": len(runs), "samples_per_s": median("samples_per_s"), "peak_pss_mb": median("peak_pss_mb"),
            "first_batch_s": median("first_batch_s", digits=3),
            "cpu_ms_per_sample": median("cpu_s_per_sample", 1000.0, 3)}


def _loader_sides(rows: list[dict[str, Any]]) -> Iterator[tuple[str, str, list[dict[str, Any]],
                                                                list[dict[str, Any]], list[dict[str, Any]]]]:
    """Per scenario that has ``loader()`` rows and per group: ``(scenario, group name, the group's
    rows, its good loader() rows, its good rows of the same pipeline in DataLoader workers)``. In
    S4 one DataLoader row serves both groups of a layout (threads and processes)."""
    for scen in ("s1", "s2", "s4"):
        workers_row = S4_DATALOADER if scen == "s4" else PIPEFLOW
        groups = _groups(rows, scen)
        everything = [r for g in groups.values() for r in g]
        for name, group in groups.items():
            ours = [r for r in group if r["library"] == THREAD_NATIVE and _ok(r)]
            theirs = [r for r in group if r["library"] == workers_row and _ok(r)]
            if scen == "s4" and not theirs:
                theirs = [r for r in everything if r["library"] == workers_row and _ok(r)
                          and r["group"].split(",")[0] == name.split(",")[0]]
            yield scen, name, group, ours, theirs


def thread_native(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``Pipeline.loader()`` (no DataLoader workers) against the same pipeline in DataLoader
    worker processes, per group: medians over the repeats of each side, and their ratios."""
    out: dict[str, Any] = {}
    for scen, name, _, ours, theirs in _loader_sides(rows):
        if not ours or not theirs:
            continue
        a, b = _medians(ours), _medians(theirs)
        out[f"{scen} {name}"] = {
            "loader": a, "dataloader": b, "dataloader_workers": theirs[0]["workers"],
            "throughput_ratio": _ratio(a["samples_per_s"], b["samples_per_s"]),
            "pss_ratio": _ratio(a["peak_pss_mb"], b["peak_pss_mb"]),
            "cpu_per_sample_ratio": _ratio(a["cpu_ms_per_sample"], b["cpu_ms_per_sample"]),
        }
    return out


def against_spdl(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """pipeflow's ``loader()`` and the same pipeline in DataLoader workers beside each SPDL row of
    a group (medians over the repeats), with pipeflow's ratios over SPDL: one entry per SPDL row."""
    out: dict[str, Any] = {}
    for scen, name, group, ours, theirs in _loader_sides(rows):
        for library in SPDL_LIBRARIES:
            spdl = [r for r in group if r["library"] == library and _ok(r)]
            if not spdl or not ours:
                continue
            a, b, c = _medians(ours), _medians(theirs) if theirs else None, _medians(spdl)
            out[f"{scen} {name} | {library}"] = {
                "group": f"{scen} {name}", "spdl_library": library, "loader": a, "dataloader": b,
                "spdl": c, "loader_over_spdl": _ratio(a["samples_per_s"], c["samples_per_s"]),
                "dataloader_over_spdl": _ratio(b["samples_per_s"], c["samples_per_s"]) if b else None,
                "cpu_per_sample_spdl_over_loader": _ratio(c["cpu_ms_per_sample"], a["cpu_ms_per_sample"]),
            }
    return out


def against_spdl_table(summary: dict[str, Any]) -> list[str]:
    """The markdown table of :func:`against_spdl` (empty when the run has no SPDL rows)."""
    if not summary:
        return []
    lines = ["| scenario, group | SPDL row | samples/s loader() / DataLoader / SPDL | loader() / SPDL | "
             "DataLoader / SPDL | PSS MB loader() / DataLoader / SPDL | CPU ms/sample loader() / "
             "DataLoader / SPDL | first batch s loader() / DataLoader / SPDL |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for e in summary.values():
        sides = (e["loader"], e["dataloader"] or {}, e["spdl"])
        lines.append(f"| {e['group']} | {e['spdl_library']} | {_each(sides, 'samples_per_s', 1)} | "
                     f"{_fmt(e['loader_over_spdl'], 2)} | {_fmt(e['dataloader_over_spdl'], 2)} | "
                     f"{_each(sides, 'peak_pss_mb', 0)} | {_each(sides, 'cpu_ms_per_sample', 2)} | "
                     f"{_each(sides, 'first_batch_s', 2)} |")
    return lines + [""]


def _each(sides: tuple[dict[str, Any], ...], key: str, digits: int = 1) -> str:
    """One measure of every side of a comparison, ``a / b / c`` (a side without it: ``-``)."""
    return " / ".join(_fmt(side.get(key), digits) for side in sides)


def _overhead_spdl_table(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = ["", "## 5. Per-stage overhead vs SPDL", "",
             "The same chains as SPDL stages (each stage's function runs on SPDL's thread pool), "
             "alternated with pipeflow's in one process of the SPDL venv.", "",
             "| chain | items | pipeflow items/s | SPDL items/s | ratio |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['chain']} | {r['items']:,} | {r['pipeflow_items_per_s']:,} | "
                     f"{r['spdl_items_per_s']:,} | {r['ratio']:.2f} |")
    return lines


def thread_native_table(summary: dict[str, Any]) -> list[str]:
    """The markdown table of :func:`thread_native` (empty when the run has no such rows)."""
    if not summary:
        return []
    lines = ["| scenario, group | runs | loader() samples/s | DataLoader samples/s (workers) | "
             "throughput ratio | loader() / DataLoader PSS MB | PSS ratio | CPU ms/sample | "
             "first batch s |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, e in summary.items():
        a, b = sides = e["loader"], e["dataloader"]
        lines.append(
            f"| {name} | {a['runs']}/{b['runs']} | {_fmt(a['samples_per_s'])} | "
            f"{_fmt(b['samples_per_s'])} ({e['dataloader_workers']}) | {_fmt(e['throughput_ratio'], 2)} | "
            f"{_each(sides, 'peak_pss_mb')} | {_fmt(e['pss_ratio'], 2)} | "
            f"{_each(sides, 'cpu_ms_per_sample', 2)} | {_each(sides, 'first_batch_s', 2)} |")
    return lines + [""]


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"# pipeflow benchmark ({result['mode']})",
        "",
        f"{result['date']}, {m['cpu_affinity']} cores, {m['memory_gb']} GiB, Python {m['python']}, "
        f"server: {result['server']}, delay proxy T = {result['latency_ms']:g} ms unless a group says "
        f"otherwise; run time {result['duration_s']:.0f} s.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()) + ".",
        "",
        "samples/s covers the whole run of a case including start-up; first batch is the start-up "
        "alone and steady samples/s the rate after the first batch. A case runs at least "
        "the run's minimum samples and seconds (passes over the data repeat until then). CPU % is "
        "the CPU time of the client's process tree over wall time (100 % = one core; the server "
        "and the proxy are not included); CPU ms/sample is that CPU time per sample. PSS counts "
        "pages shared by forked workers once. GET counts object GETs at the proxy (LISTs excluded).",
        "",
        "## Ceilings measured in this run",
        "",
        "| what | figure |",
        "|---|---|",
    ]
    for name, c in result["ceilings"].items():
        streams = c.get("streams", 1)
        figure = (
            f"{c['gets_per_s']:,.0f} GET/s ({c['threads']} threads, presigned URLs, keep-alive)"
            if "gets_per_s" in c
            else f"{c['mb_per_s']:,.0f} MB/s ({streams} concurrent streaming GET{'s' * (streams > 1)}: "
            "DataLoader workers x shards in flight)"
        )
        lines.append(f"| {name} | {figure} |")
    titles = {
        "s1": "1. Small objects, random access",
        "s2": "2. Tar shards, sequential",
        "s3": "3. Epochs with and without cache()",
        "s4": "4. Decode-bound (data in memory)",
    }
    for scen, title in titles.items():
        groups = _groups(result["rows"], scen)
        if not groups:
            continue
        lines += ["", f"## {title}", ""]
        for name, group in groups.items():
            lines += [f"### {name}", ""] + _table(group) + [""] + _cpu_line(group) + _recipe_table(group)
            if scen == "s3":
                lines += [
                    "| library | epoch | samples/s | GET | first batch s |",
                    "|---|---:|---:|---:|---:|",
                ]
                for r in group:
                    for e in r.get("epochs", []):
                        lines.append(
                            f"| {r['library']} | {e['epoch'] + 1} | {_fmt(e['samples_per_s'])} | "
                            f"{e['requests'].get('GET_OBJECT', 0)} | {_fmt(e['first_batch_s'], 2)} |"
                        )
                lines.append("")
    native = thread_native_table(thread_native(result["rows"]))
    if native:
        lines += ["", "## Thread-native loading against DataLoader workers", "",
                  "`Pipeline.loader()` in the training process against the same pipeline in "
                  "DataLoader worker processes (medians over the repeats of each side).", ""] + native
    spdl = against_spdl_table(against_spdl(result["rows"]))
    if spdl:
        lines += ["", "## pipeflow against SPDL", "",
                  "Each SPDL row beside `Pipeline.loader()` and the same pipeline in DataLoader workers, "
                  "medians over the repeats of each.", ""] + spdl
    if result.get("overhead"):
        lines += [
            "",
            "## 5. Per-stage overhead vs torchdata.nodes",
            "",
            "| chain | items | pipeflow items/s | torchdata.nodes items/s | ratio |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in result["overhead"]:
            lines.append(
                f"| {r['chain']} | {r['items']:,} | {r['pipeflow_items_per_s']:,} | "
                f"{r['torchdata_nodes_items_per_s']:,} | {r['ratio']:.2f} |"
            )
    lines += _overhead_spdl_table(result.get("overhead_spdl") or [])
    if result.get("conversions"):
        lines += ["", "## Conversions (not part of the throughput above)", "",
                  "| data set, format | seconds |", "|---|---:|"]
        for name, c in result["conversions"].items():
            lines.append(f"| {name} | {_fmt(c.get('seconds'), 1) if 'seconds' in c else 'failed'} |")
    lines += ["", "## Headline ratios", "", "```json", json.dumps(summarize(result), indent=1), "```"]
    if result.get("notes"):
        lines += ["", "Notes: " + "; ".join(result["notes"])]
    return "\n".join(lines) + "\n"


def plots(result: dict[str, Any], out: Path) -> list[Path]:
    """throughput_by_scenario.png, throughput_vs_shard_size.png, epochs_cache.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    rows = [r for r in result["rows"] if _ok(r)]
    # 1: throughput by scenario group, one bar per library (best worker count)
    groups: dict[str, dict[str, float]] = defaultdict(dict)
    for r in rows:
        if r["scenario"] in ("s1", "s2", "s4"):
            label = f"S{r['scenario'][1]} {r['group']}"
            groups[label][r["library"]] = max(groups[label].get(r["library"], 0), r["samples_per_s"])
    if groups:
        fig, axes = plt.subplots(
            len(groups),
            1,
            figsize=(9, 1.0 + 0.32 * sum(len(g) for g in groups.values()) + 0.5 * len(groups)),
            squeeze=False,
        )
        for ax, (label, libs) in zip(axes[:, 0], groups.items()):
            names = sorted(libs, key=lambda k: libs[k])
            colors = ["tab:orange" if n.startswith(PIPEFLOW) else "tab:blue" for n in names]
            ax.barh(names, [libs[n] for n in names], color=colors)
            ax.set_title(label, fontsize=9, loc="left")
            ax.tick_params(labelsize=7)
            ax.set_xscale("log")
        axes[-1, 0].set_xlabel("samples/s (log scale, best worker count)")
        fig.suptitle(
            f"pipeflow vs peers, {result['server']}, T={result['latency_ms']:g} ms, {result['date']}",
            fontsize=9,
        )
        fig.tight_layout()
        path = out / "throughput_by_scenario.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    # 2: throughput and peak PSS vs shard size (the shard-size groups, no decode)
    series: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for r in rows:
        if r["scenario"] == "s2" and not r.get("decode") and "shard_mb" in r and not r.get("layout"):
            series[r["library"]].append((r["shard_mb"], r.get("mb_per_s") or 0, r.get("peak_pss_mb") or 0))
    fig, (ax, ax_pss) = plt.subplots(1, 2, figsize=(12, 4.5))
    for lib, pts in sorted(series.items()):
        pts.sort()
        style = {"marker": "o", "label": lib, "linewidth": 2.5 if lib == PIPEFLOW else 1.2,
                 "linestyle": "--" if lib.startswith("recipe ") else "-"}
        ax.plot([p[0] for p in pts], [p[1] for p in pts], **style)
        ax_pss.plot([p[0] for p in pts], [p[2] for p in pts], **style)
    stream = sorted(
        (float(k.split()[2]), v["mb_per_s"], v.get("streams", 1))
        for k, v in result["ceilings"].items()
        if k.startswith("s2 stream")
    )
    if stream:
        ax.plot([p[0] for p in stream], [p[1] for p in stream], "k--",
                label=f"raw streaming GETs x{stream[0][2]}")
    for axis, ylabel in ((ax, "MB/s"), (ax_pss, "peak PSS (MB)")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("shard size (MB)")
        axis.set_ylabel(ylabel)
    ax.set_title(f"Tar shards, no decode, {result['server']}, T={result['latency_ms']:g} ms", fontsize=9)
    ax_pss.set_title("peak PSS of the loader's process tree", fontsize=9)
    if series:
        ax_pss.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    path = out / "throughput_vs_shard_size.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    # 3: epochs with / without cache
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in rows:
        if r["scenario"] == "s3":
            eps = r.get("epochs", [])
            ax.plot(
                [e["epoch"] + 1 for e in eps],
                [e["samples_per_s"] for e in eps],
                marker="o",
                label=r["library"],
            )
            for e in eps:
                ax.annotate(
                    f"{e['requests'].get('GET_OBJECT', 0)} GET",
                    (e["epoch"] + 1, e["samples_per_s"]),
                    fontsize=7,
                    textcoords="offset points",
                    xytext=(4, 4),
                )
    ax.set_xlabel("epoch")
    ax.set_ylabel("samples/s")
    ax.set_title("Several epochs with and without cache() (GETs per epoch annotated)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "epochs_cache.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written


def write(result: dict[str, Any], out: Path) -> dict[str, Path]:
    """Write results.json, results.md and the plots into ``out``; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    result = dict(result, summary=summarize(result))
    paths = {"json": out / "results.json", "markdown": out / "results.md"}
    paths["json"].write_text(json.dumps(result, indent=2))
    paths["markdown"].write_text(markdown(result))
    for p in plots(result, out):
        paths[p.stem] = p
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    result = json.loads(args.results.read_text())
    for name, path in write(result, args.out or args.results.parent).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
