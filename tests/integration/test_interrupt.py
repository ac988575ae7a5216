"""Ctrl-C (SIGINT to the whole foreground process group, as a terminal sends it) with process
workers: one traceback from the user's own script, none from the workers; the ``pipeflow``
command says one line."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys, time
import pipeflow as pf

if __name__ == "__main__":
    for i, item in enumerate(pf.from_items(range(100000)).map(abs, workers=2, method="process")):
        if i == 20:
            print("running", flush=True)   # both workers are up and waiting for work
        time.sleep(0.05)
"""


def _interrupt_when_running(command: list[str], cwd: Path,
                            after: float = 0.5) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while "running" not in (line := proc.stdout.readline()):
            if not line and proc.poll() is not None:
                pytest.fail(f"the command ended (exit status {proc.returncode}) before it said it was "
                            f"running:\n{proc.stderr.read() if proc.stderr else ''}")
            if time.monotonic() > deadline:
                pytest.fail("the command did not say it was running within 120 s")
        assert proc.poll() is None, "the command ended as soon as it was running"
        time.sleep(after)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: every process of the group
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


@pytest.mark.slow
def test_ctrl_c_with_process_workers_is_one_traceback_not_one_per_worker(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = _interrupt_when_running([sys.executable, str(script)], tmp_path)
    assert done.returncode != 0
    assert done.stderr.count("Traceback") == 1, done.stderr
    assert "ForkServerProcess" not in done.stderr and done.stderr.rstrip().endswith("KeyboardInterrupt")


@pytest.mark.slow
def test_ctrl_c_in_the_pipeflow_command_is_one_line(tmp_path):
    data = tmp_path / "data"
    made = subprocess.run([sys.executable, "-m", "pipeflow.cli", "make-data", "single", str(data), "--count",
                           "40", "--image-size", "8", "--quiet"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert made.returncode == 0, made.stderr
    # epochs of 20 batches: the DataLoader forks two new workers many times a second, so the
    # interrupt lands at or near a fork (at-fork callbacks, finalizers, a worker before torch's
    # loop, the iterator's constructor), where an interrupt raised at once is dropped or messy;
    # before the command took Ctrl-C at a batch boundary, 8 of 20 such runs were
    command = [sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from pipeflow.cli import main
        print("running", flush=True)
        sys.exit(main(["run", "single-ffm", "--url", {str(data)!r}, "--batch-size", "2", "--num-workers",
                       "2", "--epochs", "100000", "--quiet"]))
    """)]
    for after in (1.0, 1.37, 1.71):
        done = _interrupt_when_running(command, tmp_path, after=after)
        assert done.returncode == 128 + signal.SIGINT, done.stderr
        assert done.stderr.strip() == "pipeflow run: interrupted"


STUCK = """
import os, sys, time
from multiprocessing.util import Finalize
import pipeflow as pf
from pipeflow._cli._measure import measure

def ended_by_itself(worker_id):
    # multiprocessing runs this at a worker's own exit; a worker terminated by the DataLoader
    # (SIGTERM after its join timed out) never runs it
    Finalize(None, lambda: open(f"ended-{worker_id}", "w").close(), exitpriority=0)

def stuck(x):
    if x >= 40:
        time.sleep(600)  # a store that stopped answering
    return x

def said(n, seen=[]):
    seen.append(n)
    if len(seen) == 5:
        print("running", flush=True)  # batches came: both workers are up and about to be stuck

if __name__ == "__main__":
    try:
        measure(pf.from_items(range(10**6)).map(stuck), batch_size=2, num_workers=2, on_batch=said,
                loader_kwargs={"worker_init_fn": ended_by_itself})
    except KeyboardInterrupt:
        sys.exit(130)
"""


@pytest.mark.slow
def test_ctrl_c_in_the_command_ends_workers_stuck_in_the_pipeline_at_once(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent(STUCK))
    done = _interrupt_when_running([sys.executable, str(script)], tmp_path, after=1.0)
    assert done.returncode == 130, done.stderr
    # each worker, stuck inside the pipeline's iteration, took the interrupt there and ended by
    # itself; a worker that left its ending to the command would have been terminated
    assert sorted(p.name for p in tmp_path.glob("ended-*")) == ["ended-0", "ended-1"], done.stderr


def _kill_session(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


@pytest.mark.slow
def test_sigterm_ends_the_demo_as_ctrl_c_does_and_leaves_nothing_behind(tmp_path):
    # `kill PID` to the demo alone: its recipe runs in a process of its own, which the SIGTERM
    # does not reach. It used to go on for 10 s and be killed outright, sometimes while its
    # DataLoader forked an epoch's workers; such a worker outlived the command, holding its
    # stderr. Now the demo passes the interrupt on and the recipe's loop ends its workers.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    argv = ["demo", "--out", str(tmp_path / "out"), "--count", "16", "--image-size", "8", "--shards", "2",
            "--steps", "1000000", "--num-workers", "2", "--recipes", "single-ffm", "--quiet"]
    code = f"import sys\nfrom pipeflow.cli import main\nsys.exit(main({argv!r}))\n"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)},
                            start_new_session=True)
    # a demo that never gets to its recipe cannot hang the test: its session is killed, and
    # the read below sees the end of its stderr
    stall = threading.Timer(120, _kill_session, (proc.pid,))
    stall.start()
    try:
        assert proc.stderr is not None
        seen = ""
        while "running single-ffm" not in seen:
            line = proc.stderr.readline()
            if not line:
                pytest.fail(f"the demo ended before its recipe ran ({proc.wait(timeout=60)}):\n{seen}")
            seen += line
        time.sleep(1.0)  # the recipe's DataLoader is in its epochs, forking workers at each start
        assert proc.poll() is None, seen
        proc.send_signal(signal.SIGTERM)  # to the command alone, as `kill PID` sends it
        try:
            _, err = proc.communicate(timeout=60)  # until every holder of its stderr has ended
        except subprocess.TimeoutExpired:
            pytest.fail(f"stderr still open 60 s after SIGTERM (exit status {proc.poll()}): a process "
                        "of the demo outlived it")
        assert proc.returncode == 128 + signal.SIGTERM, seen + err
        assert err.strip().endswith("pipeflow demo: terminated"), seen + err
        assert "Traceback" not in err, err
        deadline = time.monotonic() + 10  # the local server ends with its lifeline, moments later
        while list(tmp.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(tmp.iterdir()) == []
    finally:
        stall.cancel()
        _kill_session(proc.pid)  # whatever is left of it
        proc.wait()


TERM = """
import os, signal, sys, time
from pipeflow.cli import _TermAsInterrupt

if sys.argv[1] == "ignored":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # started in the background by a shell
with _TermAsInterrupt() as term:
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    except KeyboardInterrupt:
        print("interrupted", term.received, flush=True)
        sys.exit(0)
print("not interrupted", flush=True)
"""


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_sigterm_is_an_interrupt_also_where_sigint_is_ignored(sigint):
    # the command's SIGTERM handler: `kill`, `timeout` or a scheduler ending a command used to end
    # it where it stood (no finally: the demo's data folder and its server's log stayed behind);
    # now it takes the Ctrl-C path, also in a command started in the background with SIGINT
    # ignored
    done = subprocess.run([sys.executable, "-c", TERM, sigint], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["interrupted", "True"], done
