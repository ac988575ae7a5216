"""A benchmark case's process ends with the runner that started it, however the runner ends."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ._process_helpers import gone_within, reaped

_ROOT = str(Path(__file__).resolve().parents[2])


def sleeping(seconds):
    """A case's factory: an iterable that waits ``seconds`` before its only batch."""
    time.sleep(seconds)
    return [0]


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
    cases: list[int] = []
    with reaped(runner, cases):  # never leave the case behind, even when the test fails
        deadline = time.monotonic() + 60
        while not cases and time.monotonic() < deadline:
            cases.extend(child.pid for child in psutil.Process(runner.pid).children())
            time.sleep(0.05)
        assert cases, "the case never started"
        runner.send_signal(sig)
        runner.wait(timeout=10)
        assert gone_within(cases, 10.0)


_HOOK_PROBE = """
import builtins, ctypes, sys
from pipeflow.testing.s3server import death_signal_hook

hook = death_signal_hook()
real_import = builtins.__import__

def no_import(*args, **kwargs):
    raise ImportError("an import between fork and exec")

builtins.__import__ = no_import  # what the hook may not do in the forked child
try:
    hook()
finally:
    builtins.__import__ = real_import
signum = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(signum))  # PR_GET_PDEATHSIG
print(signum.value)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_the_death_signal_hook_imports_and_loads_nothing_in_the_child():
    # between fork and exec only the forking thread exists: an import or a library load there
    # can wait forever on a lock another thread of the parent held at the fork, so the hook
    # must come with prctl already looked up and only make the call
    out = subprocess.run([sys.executable, "-c", _HOOK_PROBE], cwd=_ROOT, capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.split() == [str(int(signal.SIGTERM))]
