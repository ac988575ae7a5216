"""The SPDL peer of the benchmark: its settings, which rows it gets and where they run, its side
venv, and its report (no server, no SPDL needed, no timing)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import report, scenarios  # noqa: E402
from benchmarks.peers import _sidevenv, spdl_peer  # noqa: E402
from benchmarks.scenarios import SPDL, SPDL_FFMPEG, SPDL_OWN_DECODER  # noqa: E402

VENV_PYTHON = "/venvs/spdl/bin/python"


class _Proxy:
    url = "http://127.0.0.1:9"
    delay_ms = 20.0


@pytest.fixture
def ran(monkeypatch):
    cases = []

    def run_case(case, **kwargs):
        cases.append(case)
        return {"library": case.library, "samples_per_s": 1.0}

    monkeypatch.setattr(scenarios, "run_case", run_case)
    return cases


def _runner(tmp_path, *, ffmpeg=True, venv=VENV_PYTHON, **options):
    cfg = scenarios.BenchConfig(out=tmp_path, sizes=scenarios.TINY, **options)
    runner = scenarios._Runner(cfg, log=lambda line: None)
    runner.spdl_python = venv
    why = {} if ffmpeg else {"why": "OSError: libavutil"}
    runner.spdl_probe = {"spdl": "0.8.0", "ffmpeg": ffmpeg, **why}
    return runner


# ---- settings: what SPDL's docs recommend ---------------------------------------------------------
def test_default_settings_follow_spdls_docs():
    s = spdl_peer.SpdlSettings()
    cores = spdl_peer._cores()
    assert s.decode_concurrency == cores  # decode about one task per core
    assert s.fetch_concurrency >= 32 and s.shards_in_flight > scenarios.S2_WORKERS  # fetches: many in flight
    assert s.batch_size == 4 and s.buffer_size == 3  # the batch of every other row, SPDL's default sink
    # a pool at least as large as the stages' concurrency together, or the stages starve each other
    assert s.threads(s.shards_in_flight, s.decode_concurrency) == s.shards_in_flight + cores


@pytest.mark.parametrize("bad", [{"fetch_concurrency": 0}, {"decode_concurrency": -1}, {"batch_size": 1.5},
                                 {"shards_in_flight": True}, {"buffer_size": 0}])
def test_settings_refuse_what_cannot_run(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        spdl_peer.SpdlSettings(**bad)


def test_unknown_decoder_and_method_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="decoder must be one of"):
        spdl_peer.make_shards(["s3://b/0.tar"], decoder="pil")
    with pytest.raises(ValueError, match="method must be"):
        spdl_peer.make_decode("jpeg", 4, 32, 2, method="fiber")


def test_tar_members_are_grouped_into_samples_by_stem():
    members = [("000001.cls", b"1"), ("000001.jpg", memoryview(b"J1")), ("d/000002.cls", b"2"),
               ("d/000002.jpg", b"J2"), ("000003.cls", b"3")]
    samples = list(spdl_peer.group_members(members))
    assert samples == [{"__key__": "000001", "cls": b"1", "jpg": b"J1"},
                       {"__key__": "000002", "cls": b"2", "jpg": b"J2"}, {"__key__": "000003", "cls": b"3"}]
    assert all(isinstance(v, bytes) for s in samples for v in s.values() if v is not s["__key__"])
    with pytest.raises(ValueError, match="'jpg' twice in sample '000001'"):
        list(spdl_peer.group_members([("000001.jpg", b"a"), ("000001.jpg", b"b")]))
    assert list(spdl_peer.group_members([])) == []


# ---- which rows, where ------------------------------------------------------------------------------
@pytest.mark.parametrize(("options", "wanted"), [
    ({}, True),
    ({"spdl": False}, False),
    ({"scenarios": ("s3",)}, False),
    ({"scenarios": ("s5",)}, True),
    ({"only": ("pipeflow",)}, False),
    ({"only": ("pipeflow", SPDL_OWN_DECODER)}, True),
])
def test_the_spdl_venv_is_made_only_when_a_row_of_it_runs(tmp_path, options, wanted):
    assert scenarios.wants_spdl(scenarios.BenchConfig(out=tmp_path, **options)) is wanted


def test_s2_decode_groups_get_both_decoders_and_the_others_one_row(tmp_path):
    runner = _runner(tmp_path)
    kw = runner._s2_budget(1000.0, {"shard_mb": 16, "decode": True})
    decode = runner._s2_spdl("g", ["s3://b/0.tar"], kw, decode=True)
    assert [(c.library, c.kwargs["decoder"]) for c in decode] == [(SPDL_FFMPEG, "ffmpeg"),
                                                                   (SPDL_OWN_DECODER, "pipeflow")]
    plain = runner._s2_spdl("g", ["s3://b/0.tar"], kw, decode=False)
    assert [(c.library, c.kwargs["decoder"]) for c in plain] == [(SPDL, "none")]
    for c in decode + plain:
        assert c.python == VENV_PYTHON and c.factory == "benchmarks.peers.spdl_peer:make_shards"
        assert c.workers == 0 and c.min_samples == kw["min_samples"]  # the group's budget, no DataLoader
        # the settings that ran are in the row, and they are the docs' defaults
        defaults = dataclasses.asdict(spdl_peer.SpdlSettings())
        assert c.extra["spdl_settings"] == c.kwargs["settings"] == defaults
        assert c.extra["shard_mb"] == 16


def test_without_ffmpeg_only_the_ffmpeg_row_is_unavailable_and_says_how_to_fix_it(tmp_path):
    runner = _runner(tmp_path, ffmpeg=False)
    cases = runner._s2_spdl("g", ["s3://b/0.tar"], runner._s2_budget(1.0, {}), decode=True)
    assert [c.library for c in cases] == [SPDL_OWN_DECODER]
    [row] = runner.rows
    assert row["library"] == SPDL_FFMPEG and row["error"].startswith("unavailable: ")
    assert "libavutil" in row["error"] and "apt-get install" in row["error"]


def test_without_the_venv_every_row_is_unavailable_with_the_reason(tmp_path):
    runner = _runner(tmp_path, venv=None)
    runner.spdl_missing = "SPDL peer(s) unavailable: pip failed"
    assert runner._s2_spdl("g", ["s3://b/0.tar"], runner._s2_budget(1.0, {}), decode=True) == []
    assert [r["library"] for r in runner.rows] == [SPDL_FFMPEG, SPDL_OWN_DECODER]
    assert all("pip failed" in r["error"] for r in runner.rows)


def test_only_and_the_switch_leave_no_rows_at_all(tmp_path):
    for options in ({"only": ("pipeflow",)}, {"spdl": False}):
        runner = _runner(tmp_path, ffmpeg=False, **options)
        assert runner._s2_spdl("g", ["s3://b/0.tar"], runner._s2_budget(1.0, {}), decode=True) == []
        assert runner.rows == []


def test_s4_runs_spdl_on_threads_and_on_processes_beside_the_loader(tmp_path, ran):
    runner = _runner(tmp_path, only=(SPDL, scenarios.THREAD_NATIVE))
    runner.s4(_Proxy())
    spdl = [c for c in ran if c.library == SPDL]
    assert [c.group for c in spdl] == ["JPEG, thread workers", "JPEG, process workers"]
    assert [c.kwargs["method"] for c in spdl] == ["thread", "process"]
    native = [c for c in ran if c.library == scenarios.THREAD_NATIVE]
    for ours, theirs in zip(native, spdl, strict=True):  # the same data, the same workers
        assert {k: v for k, v in theirs.kwargs.items()} == ours.kwargs
        assert theirs.python == VENV_PYTHON and theirs.factory == "benchmarks.peers.spdl_peer:make_decode"


def test_s5_against_spdl_runs_in_the_venv_and_a_failure_is_a_note(tmp_path, monkeypatch):
    calls = []
    rows = [{"chain": "inline (5 stages)", "items": 400, "pipeflow_items_per_s": 9, "spdl_items_per_s": 3,
             "ratio": 3.0}]

    def command(python, args, timeout=120):
        calls.append((python, args))
        return {"rows": rows}

    monkeypatch.setattr(scenarios, "_spdl_command", command)
    runner = _runner(tmp_path)
    assert runner._s5_spdl() == rows
    items = max(1000, scenarios.TINY.s5_items // scenarios.SPDL_S5_FRACTION)
    assert calls == [(VENV_PYTHON, ["overhead", str(items), str(scenarios.TINY.s5_repeats)])]
    monkeypatch.setattr(scenarios, "_spdl_command", lambda *a, **k: {"error": "Traceback: boom"})
    assert runner._s5_spdl() == [] and "boom" in runner.notes[-1]


def test_the_probe_reports_a_missing_ffmpeg_as_a_note(tmp_path, monkeypatch):
    runner = _runner(tmp_path, venv=None)
    monkeypatch.setattr(scenarios, "_side_venv", lambda r, what, make: VENV_PYTHON)
    probe = {"spdl": "0.8.0", "ffmpeg": False, "why": "OSError: x"}
    monkeypatch.setattr(scenarios, "_spdl_command", lambda python, args, timeout=120: probe)
    scenarios._prepare_spdl(runner)
    assert runner.spdl_python == VENV_PYTHON and runner.spdl_probe["spdl"] == "0.8.0"
    assert runner.notes == ["SPDL's FFmpeg decoder unavailable: OSError: x"]


# ---- the side venv ----------------------------------------------------------------------------------
def test_side_venv_specs_are_checked_and_kept_apart():
    with pytest.raises(ValueError, match="must not be empty"):
        _sidevenv.SideVenv(what="x", dirname="x", path_variable="X", no_deps=(), check="pass")
    with pytest.raises(ValueError, match="empty package"):
        _sidevenv.SideVenv(what="x", dirname="x", path_variable="X", no_deps=("a", " "), check="pass")
    assert _sidevenv.SPDL.dirname != _sidevenv.STREAMING.dirname
    assert {p.split("==")[0] for p in _sidevenv.SPDL.no_deps} == {"spdl", "spdl_core", "spdl_io"}
    assert _sidevenv.NO_DEPS == _sidevenv.STREAMING.no_deps  # the LitData / Mosaic list is unchanged


def test_a_built_venv_is_reused_and_a_changed_package_list_rebuilds_it(tmp_path, monkeypatch):
    venv = tmp_path / "spdl-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / ".pipeflow-peers-ok").write_text(_sidevenv.SPDL.wanted + "\n0.8.0\n")
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    pth = site / "_pipeflow_base_env.pth"
    pth.write_text("import site; site.addsitedir('/a/removed/clone/.venv/lib/python3.11/site-packages')\n")
    ran = []

    def run(args, **kwargs):
        ran.append(args)
        raise RuntimeError("stop here")

    monkeypatch.setattr(_sidevenv.subprocess, "run", run)
    # layered over another environment (a clone's venv since removed): rebuilt, never reused
    with pytest.raises(RuntimeError, match="stop here"):
        _sidevenv.ensure_venv(venv, spec=_sidevenv.SPDL, log=lambda line: None)
    ran.clear()
    pth.write_text(_sidevenv.base_pth_line())
    python = _sidevenv.ensure_venv(venv, spec=_sidevenv.SPDL, log=lambda line: None)
    assert python == str(venv / "bin" / "python")
    assert ran == []
    other = dataclasses.replace(_sidevenv.SPDL, no_deps=("spdl==0.9.0",))
    with pytest.raises(RuntimeError, match="stop here"):
        _sidevenv.ensure_venv(venv, spec=other, log=lambda line: None)
    assert ran and "venv" in ran[0]
    monkeypatch.setenv("PIPEFLOW_BENCH_SPDL_VENV", str(tmp_path / "elsewhere"))
    assert _sidevenv.default_path(_sidevenv.SPDL) == tmp_path / "elsewhere"


# ---- the report -------------------------------------------------------------------------------------
def _row(group, library, sps, *, scenario="s2", pss=200.0, cpu=0.002):
    return {"scenario": scenario, "group": group, "library": library, "workers": 0, "samples": 100,
            "samples_per_s": sps, "peak_pss_mb": pss, "cpu_s_per_sample": cpu, "first_batch_s": 0.1}


def test_the_report_sets_each_spdl_row_beside_the_loader_and_the_dataloader_by_medians():
    g = "16 MB shards, decode"
    rows = [_row(g, scenarios.THREAD_NATIVE, s) for s in (300.0, 100.0, 200.0)]
    rows += [_row(g, "pipeflow", 150.0), _row(g, SPDL_FFMPEG, 100.0), _row(g, SPDL_FFMPEG, 80.0),
             _row(g, SPDL_FFMPEG, 120.0, cpu=0.004), _row(g, SPDL_OWN_DECODER, 250.0),
             {"scenario": "s2", "group": "other", "library": SPDL, "workers": 0, "error": "unavailable: x"}]
    out = report.against_spdl(rows)
    assert set(out) == {f"s2 {g} | {SPDL_FFMPEG}", f"s2 {g} | {SPDL_OWN_DECODER}"}
    ffmpeg = out[f"s2 {g} | {SPDL_FFMPEG}"]
    assert ffmpeg["loader"]["samples_per_s"] == 200.0 and ffmpeg["spdl"]["samples_per_s"] == 100.0
    assert ffmpeg["loader_over_spdl"] == 2.0 and ffmpeg["dataloader_over_spdl"] == 1.5
    assert out[f"s2 {g} | {SPDL_OWN_DECODER}"]["loader_over_spdl"] == 0.8
    table = "\n".join(report.against_spdl_table(out))
    assert f"| s2 {g} | {SPDL_FFMPEG} | 200.0 / 150.0 / 100.0 | 2.00 | 1.50 |" in table
    assert report.against_spdl_table({}) == []
