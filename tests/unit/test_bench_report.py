"""The benchmark report on a hand-made result (no server, no timing)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import report  # noqa: E402
from benchmarks.harness import count_batch  # noqa: E402


def _row(scenario, group, library, sps, workers=2, **extra):
    return {
        "scenario": scenario,
        "group": group,
        "library": library,
        "workers": workers,
        "samples": 100,
        "samples_per_s": sps,
        "mb_per_s": sps * 0.1,
        "cpu_pct": 50.0,
        "peak_rss_mb": 300.0,
        "peak_pss_mb": 200.0,
        "first_batch_s": 0.3,
        "requests": {"GET_OBJECT": 200},
        "epochs": [{"epoch": 0, "samples_per_s": sps, "requests": {"GET_OBJECT": 200}, "first_batch_s": 0.3}],
        **extra,
    }


@pytest.fixture
def result():
    g1 = "PNG pairs, T=20 ms"
    return {
        "date": "2026-01-01 00:00 UTC",
        "duration_s": 1.0,
        "mode": "quick",
        "latency_ms": 20.0,
        "server": "moto",
        "machine": {"cpu_affinity": 2, "memory_gb": 24.0, "python": "3.11.7"},
        "versions": {"torch": "2.13.0"},
        "datasets": {},
        "notes": [],
        "ceilings": {
            f"s1 {g1}": {"gets_per_s": 160.0, "threads": 32},
            "s2 stream 4 MB shard": {"mb_per_s": 300.0, "streams": 1},
        },
        "rows": [
            _row("s1", g1, "pipeflow", 72.0, objects_per_sample=2, latency_ms=20.0),
            _row("s1", g1, "S3MapDataset", 36.0),
            _row("s1", g1, "S3MapDataset", 70.0, workers=8),
            _row("s1", g1, "boto3 map-style", 15.0),
            {"scenario": "s1", "group": g1, "library": "fsspec random access", "workers": 2, "error": "boom"},
            _row("s2", "4 MB shards", "pipeflow", 800.0, shard_mb=4, decode=False),
            _row("s2", "4 MB shards", "S3IterableDataset", 400.0, shard_mb=4, decode=False),
            _row("s3", "JPEG, 2 epochs", "pipeflow + cache()", 100.0),
            _row("s4", "JPEG, thread workers", "pipeflow", 95.0),
            _row("s4", "JPEG, thread workers", "bare decode loop", 100.0),
        ],
        "overhead": [
            {
                "chain": "inline",
                "items": 10,
                "pipeflow_items_per_s": 2,
                "torchdata_nodes_items_per_s": 1,
                "ratio": 2.0,
            }
        ],
    }


def test_summary_ratios(result):
    s = report.summarize(result)
    s1 = s["s1"]["PNG pairs, T=20 ms"]
    assert s1["vs_best_peer_any_workers"] == pytest.approx(72 / 70, abs=0.01)
    assert s1["best_peer"] == "S3MapDataset (8 workers)"
    assert s1["vs_each_peer_same_workers"] == {"S3MapDataset": 2.0, "boto3 map-style": 4.8}
    assert s1["fraction_of_server_ceiling"] == 0.9
    assert s1["latency_bound_samples_per_s"] == 1600.0  # 64 in flight / 20 ms / 2 objects
    assert s["s2"]["4 MB shards"]["vs_best_peer"] == 2.0
    assert s["s2"]["4 MB shards"]["fraction_of_raw_stream"] == pytest.approx(80 / 300, abs=0.01)
    assert s["s4"]["JPEG, thread workers"]["overhead_pct"] == 5.0


def test_write_produces_markdown_json_and_plots(result, tmp_path):
    paths = report.write(result, tmp_path)
    md = paths["markdown"].read_text()
    assert "| S3MapDataset | 8 | 70.0 |" in md and "| 1.03 |" in md
    assert "failed: boom" in md and "## 5. Per-stage overhead" in md
    assert json.loads(paths["json"].read_text())["summary"]["s1"]
    for name in ("throughput_by_scenario", "throughput_vs_shard_size", "epochs_cache"):
        assert paths[name].read_bytes()[:4] == b"\x89PNG"


def test_count_batch_shapes():
    import torch

    assert count_batch({"jpg": [b"a", b"b", b"c"], "cls": [1, 2, 3]}) == 3
    assert count_batch({"jpg": torch.zeros(4, 3, 2, 2)}) == 4
    assert count_batch([{"a": 1}, {"a": 2}]) == 2
    assert count_batch((torch.zeros(5, 2), torch.zeros(5))) == 5


def test_recipe_rows_are_paired_with_the_code_they_reproduce(result, tmp_path):
    g = "4 MB shards"
    result["rows"] += [
        _row("s2", g, "webdataset + boto3 url_opener", 300.0, shard_mb=4, decode=False),
        _row("s2", g, "recipe wds-boto3", 450.0, shard_mb=4, decode=False,
             reproduces="webdataset + boto3 url_opener"),
        {"scenario": "s2", "group": g, "library": "LitData StreamingDataset", "workers": 2,
         "error": "unavailable: conversion failed: boom\nValueError: no"},
    ]
    s = report.summarize(result)
    assert s["recipes"] == {"s2 4 MB shards: wds-boto3": 1.5}
    # a recipe is pipeflow's own: never the best peer
    assert s["s2"][g]["best_peer"] == "S3IterableDataset"
    md = report.write(result, tmp_path)["markdown"].read_text()
    assert "| wds-boto3 | webdataset + boto3 url_opener | 450.0 | 300.0 | 1.50 |" in md
    assert "failed: unavailable: conversion failed: boom" in md


def test_decode_groups_report_cpu_per_sample_against_the_bare_loop_with_pipeflows_decoder(result, tmp_path):
    from benchmarks.scenarios import BARE_DATALOADER, BARE_OWN_DECODER, BARE_PIL

    g = "64 MB shards, decode 1024x768 JPEG (~313 KB) to 224x224"
    result["rows"] += [
        _row("s2", g, "pipeflow", 120.0, shard_mb=64, decode=True, cpu_s_per_sample=0.0052),
        _row("s2", g, "S3IterableDataset", 60.0, shard_mb=64, decode=True, cpu_s_per_sample=0.0106),
        _row("s2", g, BARE_PIL, 50.0, shard_mb=64, decode=True, cpu_s_per_sample=0.0189),
        _row("s2", g, BARE_DATALOADER, 200.0, shard_mb=64, decode=True, cpu_s_per_sample=0.0048),
        _row("s2", g, BARE_OWN_DECODER, 300.0, shard_mb=64, decode=True, cpu_s_per_sample=0.0040),
    ]
    s = report.summarize(result)["s2"][g]
    assert s["cpu_per_sample_vs_bare_own_decoder"] == 1.3
    assert s["cpu_per_sample_bare_dataloader_vs_bare_own_decoder"] == 1.2
    assert s["vs_bare_decode_loop"] == 2.4  # the PIL loop, the peers' decode
    assert s["best_peer"] == "S3IterableDataset"
    md = report.write(result, tmp_path)["markdown"].read_text()
    assert f"pipeflow / {BARE_OWN_DECODER}: **1.30** (5.20 ms / 4.00 ms); the same decode in a " \
           f"plain DataLoader ({BARE_DATALOADER}): 1.20 (4.80 ms)." in md
    # groups without that row print no such line
    assert md.count("Client CPU per sample") == 1
    # repeated runs: the median of each side
    result["rows"] += [
        _row("s2", g, "pipeflow", 120.0, shard_mb=64, decode=True, cpu_s_per_sample=0.0080, repeat=1),
        _row("s2", g, "pipeflow", 120.0, shard_mb=64, decode=True, cpu_s_per_sample=0.0050, repeat=2),
        _row("s2", g, BARE_OWN_DECODER, 300.0, shard_mb=64, decode=True, cpu_s_per_sample=0.0050, repeat=1),
    ]
    median = report.summarize(result)["s2"][g]["cpu_per_sample_vs_bare_own_decoder"]
    assert median == pytest.approx(5.2 / 4.5, abs=0.01)


def test_server_and_proxy_cpu_in_the_table(result, tmp_path):
    result["rows"][5]["others_cpu_pct"] = {"server": 81.5, "proxy": 40.25}
    md = report.write(result, tmp_path)["markdown"].read_text()
    assert "server + proxy CPU %" in md
    assert "| 50.0 | 81.5 + 40.2 |" in md or "| 50.0 | 81.5 + 40.3 |" in md


def test_cpu_of_processes_outside_the_case_is_counted_over_the_window():
    import os
    import time

    from benchmarks.harness import _Others

    outside = _Others({"me": os.getpid(), "gone": 2**22 + 12345})
    assert set(outside.procs) == {"me"}  # a pid that does not exist is left out, not an error
    outside.open()
    end = time.process_time() + 0.2
    while time.process_time() < end:  # burn 0.2 s of CPU inside the window
        pass
    outside.close()
    assert outside.used["me"] >= 0.2 - 0.02  # the counter psutil reads ticks in 10 ms steps, at both ends
    assert outside.percent()["me"] > 0


def test_thread_native_rows_are_compared_with_the_dataloader_rows_by_their_medians(result, tmp_path):
    g1 = "PNG pairs, T=20 ms"
    result["rows"] += [
        _row("s1", g1, "pipeflow loader()", sps, workers=0, peak_pss_mb=pss, cpu_s_per_sample=0.002)
        for sps, pss in ((90.0, 100.0), (60.0, 120.0), (84.0, 110.0))
    ] + [
        _row("s4", "JPEG, process workers", "pipeflow in DataLoader workers", 50.0),
    ]
    result["rows"].insert(0, _row("s4", "JPEG, thread workers", "pipeflow loader()", 75.0, workers=0))
    s = report.summarize(result)
    s1 = s["thread_native"][f"s1 {g1}"]
    assert s1["loader"]["runs"] == 3 and s1["loader"]["samples_per_s"] == 84.0  # the median
    assert s1["throughput_ratio"] == pytest.approx(84 / 72, abs=0.01)
    assert s1["pss_ratio"] == 0.55 and s1["dataloader_workers"] == 2
    # the thread group's loader row meets the layout's one DataLoader row (in the process group)
    assert s["thread_native"]["s4 JPEG, thread workers"]["throughput_ratio"] == 1.5
    assert s["s4"]["JPEG, thread workers"]["bare_samples_per_s"] == 100.0  # never a pipeflow row
    md = report.write(result, tmp_path)["markdown"].read_text()
    assert "## Thread-native loading against DataLoader workers" in md and "| 1.17 |" in md


def test_a_recipe_is_set_against_its_original_median_by_median():
    """With repeats, one pair per recipe: median over median, not every run over the first
    original run (which gave 2.5-4x for a recipe level with its original)."""
    recipe = [{"library": "recipe x", "reproduces": "orig", "workers": 2, "samples_per_s": v}
              for v in (10, 30, 20)]
    originals = [{"library": "orig", "workers": w, "samples_per_s": v}
                 for w, v in ((2, 5), (2, 40), (2, 10), (8, 99))]
    pairs = report.recipe_pairs(recipe + originals)
    assert [(r["samples_per_s"], o and o["samples_per_s"]) for r, o in pairs] == [(20, 10)]
