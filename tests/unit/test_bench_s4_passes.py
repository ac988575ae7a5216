"""``benchmarks.s4_passes``: the rest of the machine's CPU beside each case, and the steady
competition ``--compete`` starts (no server, no decode)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import s4_passes  # noqa: E402


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
