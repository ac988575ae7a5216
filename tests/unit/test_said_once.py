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


IDLE = """
import logging, sys
import torch.utils.data
import pipeflow as pf

logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(process)d %(message)s")

if __name__ == "__main__":
    for n, explicit in ((2, False), (2, True), (3, False)):
        pipe = pf.from_items([f"s3://b/shard-{i}.tar" for i in range(n)])
        if explicit:
            pipe = pipe.shuffle(10).shard_by_rank()
        loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=3,
                                             multiprocessing_context="fork")
        for epoch in range(2):
            pipe.set_epoch(epoch)
            assert sorted(loader) == [f"s3://b/shard-{i}.tar" for i in range(n)]
        print("done", n, explicit, file=sys.stderr, flush=True)
"""


def test_fewer_shards_than_workers_is_one_warning_naming_the_split(tmp_path):
    script = tmp_path / "idle.py"
    script.write_text(textwrap.dedent(IDLE))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if "split over" in line or line.startswith("done")]
    # once per run (two epochs, three workers), from the first pipeline; the flag is per run
    assert len(lines) == 4, out.stderr
    assert lines[0].split(" ", 1)[1] == (
        "pipeflow: auto_shard: 2 items (shards or objects) split over 3 ranks x workers (1 rank x 3 "
        "DataLoader workers): 1 of them reads nothing; keep ranks x workers <= 2, or split the data "
        "into more shards")
    assert lines[1:] == ["done 2 False", "done 2 True", "done 3 False"]


@pytest.mark.parametrize(("ranks", "build_pipe", "warned"), [
    (1, lambda pf: pf.from_items(["a", "b"]).shuffle(10).shard_by_rank(), True),
    (2, lambda pf: pf.from_items(["a", "b", "c"]).shard_by_rank(), True),       # 2 ranks x 3 workers
    (1, lambda pf: pf.from_items(["a", "b", "c"]).shard_by_rank(), False),
    (1, lambda pf: pf.from_items(["a", "b"]).repeat(2).shard_by_rank(), False),  # count not known
])
def test_the_idle_shard_warning_for_explicit_sharding(caplog, monkeypatch, ranks, build_pipe, warned):
    import pipeflow as pf
    from pipeflow import _once
    from pipeflow.graph import build
    from pipeflow.run_context import RunContext

    slot = _once._KEYS.index("idle_shards")
    saved = _once._shared[slot]
    _once._shared[slot] = 0
    try:
        stage = build(build_pipe(pf).node, RunContext(rank=0, world_size=ranks, worker_id=0, num_workers=3))
        with caplog.at_level("WARNING", logger="pipeflow"):
            list(stage)
    finally:
        _once._shared[slot] = saved
    said = [r.getMessage() for r in caplog.records if "split over" in r.getMessage()]
    assert len(said) == (1 if warned else 0), said
    if warned:
        assert f"({ranks} rank{'s' if ranks > 1 else ''} x 3 DataLoader workers)" in said[0]
