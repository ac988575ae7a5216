"""A process ``map`` in a script without ``if __name__ == "__main__":`` is explained, not
reported as a mysterious crash; scripts run through a real interpreter in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeflow.executor._bootstrap import _is_main_guard

ROOT = Path(__file__).resolve().parents[2]

BODY = """
import pipeflow as pf

def double(x):
    return 2 * x

def run():
    print(sorted(pf.from_items(range(6)).map(double, workers=2, method="process")))
"""


def _run(tmp_path: Path, text: str, method: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(text))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PIPEFLOW_START_METHOD": method}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                          timeout=240, cwd=tmp_path)


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_unguarded_script_is_told_to_add_the_guard(tmp_path, method):
    out = _run(tmp_path, BODY + "\nrun()\n", method)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("pipeflow.errors.WorkerCrashedError: the worker processes of map could not start")
    assert f"with the {method!r} start method" in last
    assert f"{tmp_path / 'train.py'}, line 10 starts the pipeline at import time" in last
    assert 'if __name__ == "__main__":' in last
    assert "out of memory" not in last


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_script_read_from_stdin_is_told_to_be_saved_to_a_file(tmp_path, method):
    # python - <<EOF ... : the workers look for the main script at the path '<stdin>'
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PIPEFLOW_START_METHOD": method}
    out = subprocess.run([sys.executable, "-"], input=textwrap.dedent(BODY) + "\nrun()\n",
                         capture_output=True, text=True, env=env, timeout=240, cwd=tmp_path)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("pipeflow.errors.WorkerCrashedError: the worker processes of map could not start")
    assert "read from <stdin>, which a worker cannot read" in last and "out of memory" not in last


def test_guarded_script_runs(tmp_path):
    out = _run(tmp_path, BODY + '\nif __name__ == "__main__":\n    run()\n', "forkserver")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0, 2, 4, 6, 8, 10]"


def test_fork_needs_no_guard(tmp_path):
    out = _run(tmp_path, BODY + "\nrun()\n", "fork")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0, 2, 4, 6, 8, 10]"


@pytest.mark.parametrize("source, guard", [
    ('if __name__ == "__main__":\n    pass', True),
    ("if '__main__' == __name__:\n    pass", True),
    ('if __name__ != "__main__":\n    pass', False),
    ("if True:\n    pass", False),
    ("x = 1", False),
])
def test_guard_recognition(source, guard):
    import ast

    assert _is_main_guard(ast.parse(source).body[0]) is guard
