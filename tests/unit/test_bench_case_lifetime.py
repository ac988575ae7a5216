"""A benchmark case's process ends with the runner that started it, however the runner ends."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

_ROOT = str(Path(__file__).resolve().parents[2])


def sleeping(seconds):
    """A case's factory: an iterable that waits ``seconds`` before its only batch."""
    time.sleep(seconds)
    return [0]


def _gone_within(pid, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_case_ends_when_its_runner_is_killed(sig):
    # killed, the runner runs no finally: its case (here waiting 60 s) was left behind, as
    # cases waiting on a server that had gone with the runner were
    code = (f"import sys; sys.path.insert(0, {_ROOT!r})\n"
            "from benchmarks.harness import Case, run_case\n"
            "run_case(Case('t', 'g', 'lib', 'tests.unit.test_bench_case_lifetime:sleeping',"
            " {'seconds': 60}, max_seconds=60), log=lambda _: None)\n")
    runner = subprocess.Popen([sys.executable, "-c", code], cwd=_ROOT)
    case = None
    try:
        deadline = time.monotonic() + 60
        while case is None and time.monotonic() < deadline:
            children = psutil.Process(runner.pid).children()
            case = children[0].pid if children else None
            time.sleep(0.05)
        assert case is not None, "the case never started"
        runner.send_signal(sig)
        runner.wait(timeout=10)
        assert _gone_within(case, 10.0)
    finally:
        runner.kill()
        runner.wait()
        if case is not None:  # never leave the case behind, even when the test fails
            with contextlib.suppress(ProcessLookupError):
                os.kill(case, signal.SIGKILL)
