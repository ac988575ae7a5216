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


def test_a_control_row_is_scored_as_auto_and_never_counts_as_the_best():
    rows = autotune.with_control({"a": {"w": 1}, "b": {"w": 2}, autotune.AUTO: {"w": "auto"}}, "b")
    control = "b" + autotune.CONTROL
    assert rows[control] == {"w": 2} and rows[control] is not rows["b"]
    results = {"a": [100.0, 90.0, 80.0], "b": [50.0, 100.0, 100.0], control: [200.0, 80.0, 150.0],
               autotune.AUTO: [90.0, 90.0, 90.0]}
    # per repeat against the fastest explicit row, the control's 200 not among them
    assert autotune.per_repeat(results, control) == [2.0, 0.8, 1.5]
    assert autotune.per_repeat(results, autotune.AUTO) == [0.9, 0.9, 0.9]
    result = {"date": "d", "quick": False, "seconds_per_case": 15.0, "repeats": 3,
              "machine": {"cpu_affinity": 2, "processor": "x", "memory_gb": 1},
              "grids": [{"group": "G", "auto": "auto", "results": results, "chosen": []}]}
    text = autotune.table(result)
    assert "| G | b (control) | 1.50 | 2.00, 0.80, 1.50 | 0.90 |" in text
    # the best grid point is b (median 100), not the control (median 150)
    assert "| G | b | 100 | 90 | 0.90 |" in text and "| G | b (control) | 150 | 1.50 |" in text
