"""`pipeflow demo` end to end with tiny sizes."""

from __future__ import annotations

import argparse
import json
import multiprocessing.context
import os
import signal
import threading
import types

import pytest

import pipeflow.recipes as recipes
from pipeflow.cli import main

from ._terminal import has_bar, pipeflow_cli

pytestmark = pytest.mark.s3


def _demo(tmp_path, *extra: str) -> dict:
    out = tmp_path / "out"
    code = main(["demo", "--out", str(out), "--count", "16", "--image-size", "8", "--shards", "3",
                 "--steps", "3", "--report-every", "1", "--num-workers", "1", "--timeout", "90", *extra])
    results = json.loads((out / "results.json").read_text())
    assert (out / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "results.txt").exists()
    return {"code": code, "rows": results["rows"]}


def test_demo_runs_recipes_and_writes_table_and_chart(tmp_path, capsys):
    result = _demo(tmp_path, "--recipes", "tfrecord-pipe", "tfrecord-ffm", "wds-ffm")
    assert result["code"] == 0
    rows = result["rows"]
    assert {r["recipe"] for r in rows} == {"tfrecord-pipe", "tfrecord-ffm", "wds-ffm"}
    assert {r["recipe"]: r["status"] for r in rows} == {r["recipe"]: "ok" for r in rows}
    ok = rows
    assert [r["samples_per_s"] for r in ok] == sorted((r["samples_per_s"] for r in ok), reverse=True)
    for row in ok:
        assert row["steps"] == 3 and row["samples"] == 12
    out = capsys.readouterr().out
    assert "samples/s" in out and "tfrecord-pipe" in out


@pytest.mark.parametrize("terminal, quiet, drawn", [
    pytest.param(True, False, True, id="terminal"), pytest.param(False, False, False, id="pipe"),
    pytest.param(True, True, False, id="terminal-quiet")])
def test_demo_progress_bar_per_recipe(tmp_path, terminal, quiet, drawn):
    args = ["demo", "--out", str(tmp_path / "out"), "--count", "16", "--image-size", "8", "--shards", "2",
            "--steps", "3", "--report-every", "1", "--num-workers", "0", "--recipes", "tfrecord-ffm"]
    code, out, err = pipeflow_cli(*args, *(["--quiet"] if quiet else []), terminal=terminal)
    assert code == 0, err
    # the recipe's bar counts samples towards steps x batch size
    assert has_bar(err, "tfrecord-ffm") is drawn, err
    if drawn:
        assert "/12 [" in err
    assert "tfrecord-ffm" in out  # the table


@pytest.mark.slow
def test_full_demo_every_recipe_succeeds(tmp_path):
    result = _demo(tmp_path)
    rows = result["rows"]
    assert {r["recipe"] for r in rows} == set(recipes.names())
    failed = {r["recipe"]: r["status"] for r in rows if r["status"] != "ok"}
    assert failed == {}


def test_demo_writes_its_results_into_the_user_cache_not_the_working_tree(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    args = ["demo", "--count", "16", "--image-size", "8", "--shards", "2", "--steps", "2",
            "--report-every", "1", "--num-workers", "0", "--recipes", "tfrecord-ffm", "--quiet"]
    code, out, err = pipeflow_cli(*args, terminal=False, env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert code == 0, err
    results = tmp_path / "cache" / "pipeflow" / "demo"
    assert (results / "results.json").exists()
    assert f"wrote {results / 'results.txt'}" in out
    assert list(work.iterdir()) == []


class _Recorded(multiprocessing.context.ForkProcess):
    started: list[multiprocessing.context.ForkProcess] = []

    def start(self) -> None:
        super().start()
        self.started.append(self)


class _RecordingFork(multiprocessing.context.ForkContext):
    Process = _Recorded  # type: ignore[assignment]


def test_an_interrupted_demo_stops_its_recipe_the_way_ctrl_c_does(tmp_path, monkeypatch):
    # SIGTERM sent to the demo alone (`kill PID`, taken as Ctrl-C) does not reach the recipe's
    # process: the demo passes it on, and the recipe's loop ends its DataLoader workers and
    # its process by itself. It was killed outright instead, sometimes while it forked an
    # epoch's workers, and such a worker outlived the command.
    from pipeflow._cli import demo
    from pipeflow.testing.datagen import generate

    generate("single", str(tmp_path / "data"), count=16, image_size=8, progress=False)
    monkeypatch.setattr(demo, "mp", types.SimpleNamespace(get_context=lambda method: _RecordingFork()))
    _Recorded.started = []
    args = argparse.Namespace(preprocess=False, out=str(tmp_path), batch_size=2, num_workers=2,
                              steps=10**9, report_every=10, quiet=True, timeout=120.0)
    ctrl_c = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    ctrl_c.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            demo._run_one(recipes.get("single-ffm"), str(tmp_path / "data"), args)
    finally:
        ctrl_c.cancel()
        for proc in _Recorded.started:
            if proc.is_alive():
                proc.kill()
                proc.join()
    [recipe] = _Recorded.started
    assert recipe.exitcode == 0  # ended by itself; -9 when it was killed
