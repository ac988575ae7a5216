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


def test_cases_side_by_side_each_go_through_a_proxy_of_their_own_and_keep_their_order(tmp_path, monkeypatch):
    import contextlib
    import threading
    import time

    from pipeflow.testing.proxy import ProxyProcess

    lock, running, through = threading.Lock(), set(), []

    def run_case(case, *, proxy_url, env, **kwargs):
        with lock:
            assert proxy_url not in running, "two cases at once through one proxy"
            running.add(proxy_url)
            through.append(proxy_url)
        assert env["AWS_ENDPOINT_URL"] == env["S3_ENDPOINT_URL"] == proxy_url
        time.sleep(0.05 * (len(case.library) % 3))  # cases end out of order
        with lock:
            running.discard(proxy_url)
        return {"library": case.library}

    monkeypatch.setattr(scenarios, "run_case", run_case)
    runner = _runner(tmp_path, repeats=2)
    libraries = ["pipeflow", "S3IterableDataset", "webdataset pipe:s5cmd", "SPDL pipeline", "boto3 map-style"]
    with contextlib.ExitStack() as stack:
        main = stack.enter_context(ProxyProcess("http://127.0.0.1:9", delay_ms=20.0))
        runner.lanes = scenarios._Lanes(stack, "http://127.0.0.1:9", {20.0: main}, 2)
        for library in libraries:
            runner.case(main, Case("s2", "4 MB shards", library, "m:f"))
        runner.unavailable("s2", "4 MB shards", "LitData StreamingDataset", "side venv missing")
        runner.case(main, Case("s2", "4 MB shards", "pipeflow loader()", "m:f"))
        runner.settle()
    expected = [lib for lib in libraries for _ in range(2)] + ["LitData StreamingDataset"]
    assert [r["library"] for r in runner.rows] == expected + ["pipeflow loader()"] * 2
    assert [r.get("repeat") for r in runner.rows if "error" not in r] == [0, 1] * 6
    assert main.url not in through and len(set(through)) == 2  # the run's own proxy is the ceilings'


def test_side_by_side_below_one_is_refused():
    import dataclasses

    with pytest.raises(ValueError, match="side_by_side must be >= 1"):
        dataclasses.replace(scenarios.TINY, side_by_side=0)
