"""`pipeflow demo` end to end with tiny sizes."""

from __future__ import annotations

import json

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
