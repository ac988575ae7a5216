"""``benchmarks.s4_passes``: the rest of the machine's CPU beside each case, and the steady
competition ``--compete`` starts (no server, no decode)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import s4_passes  # noqa: E402

from ._process_helpers import gone_within, reaped  # noqa: E402


def test_machine_cpu_counts_busy_fields_only():
    # user nice system idle iowait irq softirq steal guest guest_nice, in ticks
    line = "cpu  300 500 100 9000 40 7 3 60 20 10"
    busy, niced = s4_passes.machine_cpu(line, 100.0)
    assert busy == pytest.approx((300 + 500 + 100 + 7 + 3) / 100.0)  # idle, iowait, steal out
    assert niced == pytest.approx(5.0)


def test_measure_reports_what_the_rest_of_the_machine_used():
    row = s4_passes.measure(lambda: [[1, 2], [3]], 0.5)
    assert row["samples"] % 3 == 0 and row["passes"] >= 1
    assert row["niced_pct"] >= 0.0
    # the machine's busy time includes this process's: the rest cannot exceed every core (both
    # are counted in 10 ms ticks, four readings: up to ~10 % either way over 0.5 s)
    assert -20.0 < row["others_cpu_pct"] <= 100.0 * (os.cpu_count() or 1) + 20.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sessions and nice as on Linux")
def test_compete_runs_niced_loops_in_another_session_and_reaps_them():
    with s4_passes.competing(2) as pids:
        assert len(pids) == 2
        procs = [psutil.Process(pid) for pid in pids]
        deadline = time.monotonic() + 10.0
        while any(p.nice() != 19 for p in procs) and time.monotonic() < deadline:
            time.sleep(0.01)  # each loop lowers its own priority first thing
        assert [p.nice() for p in procs] == [19, 19]
        assert all(os.getsid(pid) == pid != os.getsid(0) for pid in pids)
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in pids)



def _loop_cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sessions as on Linux")
def test_the_competing_loops_are_not_counted_as_the_case_s_cpu():
    me = psutil.Process()
    with s4_passes.competing(1) as pids:
        total0, own0 = s4_passes._cpu(me)
        start = _loop_cpu(pids[0])
        deadline = time.monotonic() + 20.0
        while _loop_cpu(pids[0]) - start < 0.2 and time.monotonic() < deadline:
            time.sleep(0.02)
        total1, own1 = s4_passes._cpu(me)
        assert _loop_cpu(pids[0]) - start >= 0.2  # the loop did run meanwhile
    # the children's part of the tree grew by nothing like the loop's 0.2 s
    assert (total1 - own1) - (total0 - own0) < 0.05


_ROOT = str(Path(__file__).resolve().parents[2])


def _competing_child(count: int, *, handle_sigterm: bool) -> tuple[subprocess.Popen[str], list[int]]:
    """A process holding ``count`` competing loops (the block sleeps), and their pids."""
    block = "s4_passes.sigterm_exits()" if handle_sigterm else "contextlib.nullcontext()"
    code = (f"import contextlib, sys, time; sys.path.insert(0, {_ROOT!r})\n"
            "from benchmarks import s4_passes\n"
            f"with {block}, s4_passes.competing({count}) as pids:\n"
            "    print(*pids, flush=True); time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    return child, [int(pid) for pid in child.stdout.readline().split()]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sessions as on Linux")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_loops_end_when_their_parent_is_killed_without_cleaning_up(sig):
    # no handler: the parent's finally never runs; each loop must notice the parent is gone
    child, pids = _competing_child(2, handle_sigterm=False)
    with reaped(child, pids):  # never leave a spinning loop behind, even when the test fails
        assert len(pids) == 2 and all(psutil.pid_exists(pid) for pid in pids)
        child.send_signal(sig)
        child.wait(timeout=10)
        assert gone_within(pids, 3.0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals as on Linux")
def test_sigterm_in_the_benchmark_runs_its_finally():
    child, pids = _competing_child(1, handle_sigterm=True)
    with reaped(child, pids):
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=10) == 128 + signal.SIGTERM  # SystemExit, not death by signal
        assert gone_within(pids, 3.0)


def test_sigterm_exits_puts_the_old_handler_back():
    before = signal.getsignal(signal.SIGTERM)
    with s4_passes.sigterm_exits():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sessions as on Linux")
def test_a_loop_that_fails_to_start_stops_the_ones_already_started(monkeypatch):
    started: list[subprocess.Popen[bytes]] = []
    real = subprocess.Popen

    def second_fails(*args, **kwargs):
        if started:
            raise OSError("no more processes")
        started.append(real(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(s4_passes.subprocess, "Popen", second_fails)
    try:
        with pytest.raises(OSError, match="no more processes"):
            with s4_passes.competing(3):
                pass
        assert len(started) == 1 and started[0].returncode is not None  # killed and reaped
    finally:
        for proc in started:  # a loop the code under test left behind must not spin on
            proc.kill()
            proc.wait()
