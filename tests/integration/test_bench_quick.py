"""Smoke test of ``pipeflow bench``: a tiny run produces the JSON, Markdown and plots with every peer.

No timing assertions: only that every case ran and every output is there.
"""

from __future__ import annotations

import json

import pytest

from pipeflow.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.s3]

STREAMING_PEERS = {"LitData StreamingDataset", "Mosaic StreamingDataset"}

RECIPES = {
    "recipe single-boto3",
    "recipe single-s5cmd",
    "recipe s3connector-shards",
    "recipe wds-boto3",
    "recipe wds-pipe-cli",
    "recipe wds-s3fs",
    "recipe torchdata-fsspec",
}
PEERS = {
    "boto3 map-style",
    "s5cmd sampler",
    "S3MapDataset",
    "fsspec random access",
    "DataPipes FSSpecFileOpener",
    "S3IterableDataset",
    "webdataset + boto3 url_opener",
    "webdataset + s3fs url_opener",
    "webdataset pipe:s5cmd",
    "SPDL pipeline",
    "SPDL pipeline + pipeflow's decoder",
}
#: needs Debian's FFmpeg libraries; without them the row says so (and a note says why)
SPDL_FFMPEG = "SPDL pipeline + spdl.io decode (FFmpeg)"


@pytest.mark.timeout(900)
def test_tiny_bench_writes_every_output_with_every_peer(tmp_path):
    out = tmp_path / "bench"
    code = main(
        ["bench", "--tiny", "--out", str(out), "--latency-ms", "5", "--workdir", str(tmp_path / "work"),
         "--no-streaming-peers"]
    )
    result = json.loads((out / "results.json").read_text())
    no_ffmpeg = any(n.startswith("SPDL's FFmpeg decoder unavailable") for n in result["notes"])
    failed = [(r["library"], r["group"], r.get("error", "")[-300:]) for r in result["rows"] if "error" in r]
    if no_ffmpeg:
        failed = [f for f in failed if not (f[0] == SPDL_FFMPEG and "apt-get install" in f[2])]
    assert failed == [] and (code == 0 or no_ffmpeg)
    libraries = {r["library"] for r in result["rows"]}
    assert SPDL_FFMPEG in libraries and result["versions"]["spdl"]
    # SPDL joins S1, S2 (with and without decode), S4 on threads and processes, and S5
    spdl_rows = {(r["scenario"], r["group"]) for r in result["rows"] if r["library"].startswith("SPDL")}
    assert {s for s, _ in spdl_rows} == {"s1", "s2", "s4"} and len(spdl_rows) >= 5
    assert [r["chain"] for r in result["overhead_spdl"]] == ["inline (5 stages)", "threads + prefetch"]
    assert PEERS <= libraries and RECIPES <= libraries and "pipeflow" in libraries
    assert {r["scenario"] for r in result["rows"]} == {"s1", "s2", "s3", "s4"}
    assert result["overhead"], "scenario 5 (benchmarks/overhead.py) produced no rows"
    markdown = (out / "results.md").read_text()
    assert result["latency_ms"] == 5 and result["server"].startswith("moto")
    assert not STREAMING_PEERS & libraries  # switched off: no rows, not failed ones
    # the rows that ran: all, but the one a machine without FFmpeg's libraries cannot run
    # (SPDL's own decoder; its error was checked above)
    ran = [r for r in result["rows"] if not (no_ffmpeg and r["library"] == SPDL_FFMPEG and "error" in r)]
    for r in ran:
        assert r["samples"] > 0 and r["cpu_pct"] is not None and r["peak_rss_mb"] > 0
        # a tiny case can use less CPU than the clock resolution: measured, not necessarily > 0
        assert r["cpu_s_per_sample"] >= 0 and r["first_batch_s"] is not None
    # the server's and the proxy's CPU over each S3 case, beside the client's
    for r in ran:
        if r["scenario"] in ("s1", "s2"):
            assert set(r["others_cpu_pct"]) == {"server", "proxy"}, r["others_cpu_pct"]
            assert all(v >= 0 for v in r["others_cpu_pct"].values())
    assert "server + proxy CPU %" in markdown
    # every recipe row sits beside the row of the code it reproduces, in the same group
    for r in ran:
        if r["library"].startswith("recipe "):
            group = {o["library"] for o in result["rows"] if o["group"] == r["group"]}
            assert r["reproduces"] in group, r
    # the decode group (one kind of JPEG in the tiny run) is there, named for what it does
    decode_groups = {r["group"] for r in result["rows"] if r.get("decode_kind") == "imagenet"}
    assert len(decode_groups) == 1 and "to 224x224" in decode_groups.pop()
    # with the bare loops beside pipeflow, and pipeflow's CPU per sample over the one that runs
    # pipeflow's own decoder
    from benchmarks.scenarios import BARE_DATALOADER, BARE_OWN_DECODER, BARE_PIL  # importable now

    decoding = {r["library"] for r in result["rows"] if r.get("decode_kind") == "imagenet"}
    assert {"pipeflow", BARE_PIL, BARE_OWN_DECODER, BARE_DATALOADER} <= decoding
    assert f"Client CPU per sample, pipeflow / {BARE_OWN_DECODER}" in markdown
    assert "recipe / original" in markdown
    # requests were counted at the proxy: every one-object-per-field case fetched its objects
    for r in ran:
        if r["scenario"] == "s1":
            assert r["requests"].get("GET_OBJECT", 0) >= r["samples"] * 2
    for name in PEERS | {"pipeflow"}:
        assert name in markdown
    assert "pipeflow / this" in markdown and "Ceilings measured in this run" in markdown
    for png in ("throughput_by_scenario.png", "throughput_vs_shard_size.png", "epochs_cache.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(result["summary"]) == {"s1", "s2", "s3", "s4", "recipes", "thread_native", "against_spdl"}
    assert result["summary"]["against_spdl"] and "## pipeflow against SPDL" in markdown
    assert result["summary"]["thread_native"], "the loader() rows are compared with the DataLoader rows"
