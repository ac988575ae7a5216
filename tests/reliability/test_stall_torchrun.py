"""A stalled torchrun launch leaves a clue: the launcher's error carries each rank's stderr and
the Python stack of every thread of the rank that hung, whether the launch ran past the
launcher's timeout or a peer's collective timed out first (torchrun then terminates the rest)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ._launch import torchrun

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _launch_error(out_dir: Path, gloo_timeout_s: float, timeout: float) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    with pytest.raises(AssertionError) as info:
        torchrun("stall_torchrun.py", out_dir, str(gloo_timeout_s), timeout=timeout)
    return str(info.value)


def _assert_stacks_of_rank_0(report: str) -> None:
    assert "rank 0 stderr" in report and "rank 1 stderr" in report, report
    assert "rank 0 stalls" in report and "rank 1 waits at the barrier" in report, report
    # faulthandler's dump of every thread: the main one where it hung, and the other one
    assert 'in stall_on_rank_0' in report, report
    assert 'in side_thread_waits' in report, report


def test_a_launch_past_its_timeout_reports_every_ranks_stacks(tmp_path):
    timeout = 15
    report = _launch_error(tmp_path / "first", gloo_timeout_s=600, timeout=timeout)
    if "rank 0 stalls" not in report or "rank 1 waits at the barrier" not in report:
        # a loaded machine took longer than that to start torch in both ranks, so they never
        # reached the places the test looks for: once more, with time to spare
        timeout = 90
        report = _launch_error(tmp_path / "again", gloo_timeout_s=600, timeout=timeout)
    assert report.startswith(f"torchrun timed out after {timeout} s"), report[:300]
    _assert_stacks_of_rank_0(report)
    assert "in main" in report.split("rank 1 stderr", 1)[1], "rank 1's stack at the barrier is missing"
    # past the timeout, the ranks' worker processes print theirs too (a hung worker stalls its rank)
    assert "in stall_in_a_worker" in report.split("rank 1 stderr", 1)[0], report
    time.sleep(0.5)  # the kernel's reaping of killed processes is not instant
    assert _processes_of(tmp_path) == [], "a rank outlived its launch"


def _processes_of(out_dir) -> list[str]:
    """Command lines naming ``out_dir``: the launch's ranks (zombies aside)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(out_dir) in cmdline and state != "Z":
            found.append(cmdline)
    return found


def test_a_peers_collective_timeout_reports_the_stalled_ranks_stacks(tmp_path):
    report = _launch_error(tmp_path, gloo_timeout_s=4, timeout=120)
    assert report.startswith("torchrun exited with"), report[:300]
    _assert_stacks_of_rank_0(report)
