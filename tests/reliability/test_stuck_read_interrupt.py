"""Ctrl-C (or SIGTERM taken as Ctrl-C) with a map thread stuck in a read that never returns (a
FIFO nobody writes to, as a hung NFS read): the interrupt reaches the user's loop within the stop
grace and the interpreter exits; before, closing the pipeline joined the stuck thread for ever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import signal, sys
    import pipeflow as pf

    if sys.argv[2] == "TERM":  # as the CLI does: SIGTERM taken as Ctrl-C
        signal.signal(signal.SIGTERM, lambda *a: signal.raise_signal(signal.SIGINT))

    def read(path):
        print("reading", flush=True)
        with open(path, "rb") as f:  # a FIFO with no writer: open never returns
            return f.read()

    pipe = pf.from_items([sys.argv[1]]).map(read, workers=2)
    try:
        for batch in pipe.loader(batch_size=None):
            pass
    except KeyboardInterrupt:
        print("interrupt reached the loop", flush=True)
        sys.exit(130)
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_with_a_stuck_read_ends_the_process(tmp_path: Path, sig: signal.Signals) -> None:
    fifo = tmp_path / "f.tar"
    os.mkfifo(fifo)
    script = tmp_path / "loop.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PIPEFLOW_STOP_GRACE_SECONDS="0.5")
    how = "TERM" if sig == signal.SIGTERM else "INT"
    proc = subprocess.Popen([sys.executable, str(script), str(fifo), how],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "reading"  # the read is under way (and stuck)
        time.sleep(0.2)  # let it get into open()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert "interrupt reached the loop" in out, err
    assert proc.returncode == 130, err
    assert "did not return within 0.5 s; exiting without them" in err
    with pytest.raises(ProcessLookupError):  # nothing of the process group is left
        os.killpg(proc.pid, 0)
