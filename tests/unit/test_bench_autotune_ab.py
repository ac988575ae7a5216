"""The autotune benchmark's A/B mode: the order of each pair, the ratios, and that a case run
against a baseline imports the baseline's ``pipeflow`` with this tree's benchmark code (no
server, no timing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import autotune  # noqa: E402
from benchmarks.harness import ROOT, child_path  # noqa: E402


def test_pairs_alternate_which_side_runs_first():
    orders = [autotune.pair_order(p) for p in range(4)]
    assert orders == [("this", "base"), ("base", "this")] * 2
    assert all(sorted(o) == ["base", "this"] for o in orders)


def test_summary_is_the_median_of_per_pair_ratios():
    # per pair, not the ratio of medians: 2/1, 3/3, 1/2 -> 2.0, 1.0, 0.5
    s = autotune.ab_summary([2.0, 3.0, 1.0], [1.0, 3.0, 2.0])
    assert s["ratios"] == [2.0, 1.0, 0.5]
    assert (s["median"], s["low"], s["high"]) == (1.0, 0.5, 2.0)


def test_a_failed_baseline_case_gives_no_ratio_and_unpaired_runs_are_refused():
    assert autotune.ab_summary([2.0, 1.0], [0.0, 1.0])["ratios"] == [1.0]
    assert autotune.ab_summary([1.0], [0.0])["median"] is None
    with pytest.raises(ValueError, match="unpaired"):
        autotune.ab_summary([1.0, 2.0], [1.0])


def test_a_baseline_side_imports_its_pipeflow_and_this_trees_benchmarks(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "pipeflow").mkdir(parents=True)
    (checkout / "pipeflow" / "__init__.py").write_text("SIDE = 'baseline'\n")
    (checkout / "benchmarks").mkdir()
    (checkout / "benchmarks" / "__init__.py").write_text("raise ImportError('the baseline benchmarks')\n")
    (tmp_path / "work").mkdir()
    linked = autotune._linked(checkout, tmp_path / "work")
    code = "import pipeflow, benchmarks.harness; print(pipeflow.SIDE, benchmarks.harness.ROOT)"
    for pipeflow_from, side in ((linked, "baseline"), (None, None)):
        pythonpath, cwd = child_path(pipeflow_from, None)
        out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env={"PYTHONPATH": pythonpath},
                             capture_output=True, text=True, timeout=60)
        if side:
            assert out.stdout.split() == [side, str(ROOT)], out.stderr
        else:  # this tree's pipeflow has no SIDE
            assert "AttributeError" in out.stderr and "SIDE" in out.stderr


def test_a_baseline_without_pipeflow_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no pipeflow package"):
        autotune._linked(tmp_path, tmp_path)
