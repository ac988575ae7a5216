"""The recording-cost benchmark compares two different things: its copy of the package records
nothing, and the copy is built from this tree or not at all."""

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import recording_cost

_PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
import pipeflow as pf
assert pf.__file__.startswith(sys.argv[1]), pf.__file__
pipe = pf.from_items(range(300)).map(abs).map(abs, workers=2).batch(4)
assert sum(len(b) for b in pipe) == 300
stats = pipe.stats()
print(repr((stats["map"]["busy_s"], stats["map#2"]["busy_s"], stats["batch"]["busy_s"])))
"""


def _busy(first_on_path):
    out = subprocess.run([sys.executable, "-c", _PROBE, first_on_path], capture_output=True,
                         text=True, timeout=120, check=True)
    return eval(out.stdout.strip().splitlines()[-1])  # a tuple of three floats printed by repr


def test_the_copy_without_recording_times_nothing(tmp_path):
    copy = recording_cost.build_copy(str(tmp_path))
    # this tree's package times the stages and the thread workers (the first calls all) ...
    assert all(busy > 0 for busy in _busy(str(Path(recording_cost.ROOT))))
    # ... the copy none of them: otherwise the benchmark would measure recording against itself
    assert _busy(copy) == (0.0, 0.0, 0.0)


def test_a_hook_that_moved_is_an_error_not_a_silent_copy(tmp_path, monkeypatch):
    moved = (("stages/base.py", "a line that is not in the file\n", "x"),)
    monkeypatch.setattr(recording_cost, "CUTS", moved)
    with pytest.raises(recording_cost.CutFailed, match="stages/base.py"):
        recording_cost.build_copy(str(tmp_path))
