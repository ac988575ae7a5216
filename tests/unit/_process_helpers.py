"""Shared by the tests of processes that must end with their parent: waiting for them to go, and
never leaving one behind when a test fails."""

import contextlib
import os
import signal
import subprocess
import time

import psutil


def gone_within(pids, seconds):
    """True once none of ``pids`` runs any more (a zombie waiting for its reaper counts as gone)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in pids):
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def reaped(parent: subprocess.Popen, pids):
    """On the way out, kill ``parent`` and every pid in ``pids`` (a list the block may still fill),
    whether the test passed or not."""
    try:
        yield
    finally:
        parent.kill()
        parent.wait()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
