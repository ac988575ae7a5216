"""Messages meant once per run appear once, not once per DataLoader worker per epoch."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import logging, sys
import torch.utils.data
import pipeflow as pf

logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(process)d %(message)s")

def inc(x):
    return x + 1

if __name__ == "__main__":
    pipe = pf.from_items(range(40)).map(inc, workers=2, method="process")
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2,
                                         multiprocessing_context="{context}")
    for epoch in range(3):
        pipe.set_epoch(epoch)
        assert sorted(loader) == list(range(1, 41))
    print("done")
"""


@pytest.mark.parametrize("context", ["fork"])
def test_auto_shard_note_and_thread_fallback_warning_appear_once(tmp_path, context):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.replace("{context}", context)))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "done"
    assert out.stderr.count("sharding each source across 2 ranks x workers automatically") == 1
    assert out.stderr.count("RuntimeWarning: pipeflow: ") == 1
    assert "using threads instead of worker processes" in out.stderr


def test_first_time_is_shared_with_forked_children():
    from pipeflow import _once

    code = textwrap.dedent("""
        import os, sys
        from pipeflow._once import first_time
        pid = os.fork()
        if pid == 0:
            os._exit(0 if first_time("process_fallback") else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        print(first_time("process_fallback"), first_time("auto_shard"), first_time("auto_shard"))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.split() == ["False", "True", "False"]
    with pytest.raises(ValueError):
        _once.first_time("no-such-message")
