"""``pipeflow bench --only`` and ``--repeats``: which cases run, and how often (no server)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import scenarios  # noqa: E402
from benchmarks.harness import Case  # noqa: E402


class _Proxy:
    url = "http://127.0.0.1:9"
    delay_ms = 20.0


@pytest.fixture
def ran(monkeypatch):
    calls: list[str] = []

    def run_case(case, **kwargs):
        calls.append(case.library)
        return {"library": case.library, "samples_per_s": 1.0}

    monkeypatch.setattr(scenarios, "run_case", run_case)
    return calls


def _runner(tmp_path, **options):
    cfg = scenarios.BenchConfig(out=tmp_path, **options)
    return scenarios._Runner(cfg, log=lambda line: None)


def test_only_runs_the_named_libraries(ran, tmp_path):
    runner = _runner(tmp_path, only=("pipeflow", "S3IterableDataset"))
    for library in ("pipeflow", "pipeflow (boto3 backend)", "S3IterableDataset", "webdataset pipe:s5cmd"):
        runner.case(_Proxy(), Case("s2", "4 MB shards", library, "m:f"))
    assert ran == ["pipeflow", "S3IterableDataset"]
    assert [r["library"] for r in runner.rows] == ["pipeflow", "S3IterableDataset"]


def test_repeats_run_each_case_in_a_row_and_number_the_rows(ran, tmp_path):
    runner = _runner(tmp_path, repeats=3)
    runner.case(_Proxy(), Case("s2", "4 MB shards", "pipeflow", "m:f"))
    runner.case(_Proxy(), Case("s2", "4 MB shards", "S3IterableDataset", "m:f"))
    assert ran == ["pipeflow"] * 3 + ["S3IterableDataset"] * 3
    assert [r["repeat"] for r in runner.rows] == [0, 1, 2, 0, 1, 2]
    assert all(r["latency_ms"] == 20.0 for r in runner.rows)


def test_one_run_by_default_has_no_repeat_field(ran, tmp_path):
    runner = _runner(tmp_path)
    runner.case(_Proxy(), Case("s2", "4 MB shards", "pipeflow", "m:f"))
    assert ran == ["pipeflow"] and "repeat" not in runner.rows[0]


def test_repeats_below_one_are_refused(capsys):
    from pipeflow.cli import main

    with pytest.raises(SystemExit, match="--repeats must be >= 1"):
        main(["bench", "--repeats", "0", "--scenarios", "s5"])


@pytest.mark.parametrize(("only", "converted"), [
    (("pipeflow",), []),
    (("pipeflow", "LitData StreamingDataset"), ["litdata_peer"]),
    ((), ["litdata_peer", "mosaic"]),
])
def test_only_converts_just_the_streaming_peers_it_runs(tmp_path, monkeypatch, only, converted):
    # a conversion takes seconds to minutes per shard size: a run that leaves a peer out skips it
    runner = _runner(tmp_path, only=only)
    runner.peers_python = "/side-venv/bin/python"
    calls: list[str] = []

    def convert(module, shards, url, mb):
        calls.append(module)
        return {"seconds": 1.0, "url": url}

    monkeypatch.setattr(runner, "_convert", convert)
    cases = runner._s2_streaming_peers("4 MB shards", ["s3://b/s-0.tar"], "s2-4mb", 4, {}, decode=False)
    assert calls == converted
    assert len(cases) == len(converted) and not runner.rows
