"""Launching helper scripts under torchrun or as fresh Python processes, with hard timeouts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pipeflow.testing import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TORCHRUN = Path(sys.executable).with_name("torchrun")


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONWARNINGS"] = "ignore::UserWarning"  # DataLoader's "3 workers on 2 cores" notice
    env.update(extra or {})
    return env


#: seconds the ranks of a launch past its timeout get to print their stacks before the kill
STACKS_GRACE_S = 2.0


def _torchrun_cmd(script: str, out_dir: Path, nproc: int, *args: str) -> list[str]:
    """The launch line on a free loopback port. The agent's log directory goes into ``out_dir``:
    by default it makes a ``torchelastic_*`` directory in the system's temp dir and leaves it.
    ``--tee 3``: each rank's stdout and stderr also go to its own file there (read back when
    the launch fails), and on the console each line names its rank."""
    return [str(TORCHRUN), f"--nproc_per_node={nproc}", "--nnodes=1", "--master-addr=127.0.0.1",
            f"--master-port={free_port()}", f"--log-dir={out_dir / 'torchelastic'}", "--tee=3",
            str(HERE / script), str(out_dir), *args]


def torchrun(script: str, out_dir: Path, *args: str, nproc: int = 2, timeout: float = 180.0,
             env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``script`` under torchrun on a free loopback port; return its results.json.

    A launch that fails or runs past ``timeout`` raises AssertionError with each rank's stderr
    and, for a launch that stalled, the Python stack of every thread of every rank."""
    cmd = _torchrun_cmd(script, out_dir, nproc, *args)
    code, stdout, stderr = _run_bounded(cmd, _env(env), timeout)
    results = out_dir / "results.json"
    if code != 0 or not results.exists():
        ended = f"exited with {code}" if code is not None else f"timed out after {timeout:.0f} s"
        raise AssertionError(f"torchrun {ended}{_failed_suites(results)}\n{_rank_logs(out_dir)}"
                             f"torchrun stdout:\n{stdout[-4000:]}\ntorchrun stderr:\n{stderr[-4000:]}")
    return json.loads(results.read_text())


def _run_bounded(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int | None, str, str]:
    """``(exit code or None past the timeout, stdout, stderr)`` of ``cmd`` run in a session of its
    own. Past the timeout every rank prints its threads' stacks (SIGUSR1, see
    ``_dist.stacks_on_signals``), then each rank's session (the rank and its DataLoader workers)
    is killed; the agent, finding its ranks dead, ends and cleans up after itself, and whatever
    is left of its own session is killed. ``subprocess.run`` would kill the agent alone, leave
    the ranks running and drop the output."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        return proc.returncode, stdout, stderr
    except subprocess.TimeoutExpired:
        _end_launch(proc.pid, stacks=True)
        stdout, stderr = proc.communicate(timeout=60)
        return None, stdout, stderr
    finally:
        if proc.returncode is None:  # interrupted: not reaped yet, so its ids are still its own
            _end_launch(proc.pid, stacks=False)
            proc.communicate()


def _end_launch(agent: int, *, stacks: bool) -> None:
    """Kill the ranks' sessions (after their stacks when ``stacks``), let the agent end (30 s at
    most), then kill what is left of its session. The agent is not reaped here, so neither its
    id nor its session's can have passed to another process meanwhile."""
    parents = _parents()
    ranks = _children(agent, parents)
    if stacks:  # the ranks and their DataLoader workers: a worker that hangs stalls its rank
        for pid in (pid for rank in ranks for pid in _family(rank, parents)):
            _send([pid], signal.SIGUSR1)
            time.sleep(0.2)  # one at a time: a rank and its workers share a stderr, dumps would mix
        time.sleep(STACKS_GRACE_S)
    _send([-pid for pid in ranks], signal.SIGKILL)  # torchrun starts each rank in a session of its own
    deadline = time.monotonic() + 30
    while _state(agent) not in ("Z", "") and time.monotonic() < deadline:
        time.sleep(0.1)
    _send([-agent], signal.SIGKILL)


def _state(pid: int) -> str:
    """The process's state letter ("Z": ended, not yet reaped); "" when there is none."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def _send(pids: list[int], sig: signal.Signals) -> None:
    """``sig`` to each of ``pids`` still there (a negative one: that process group)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _parents() -> dict[int, int]:
    """Every process's parent, from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    return parents


def _children(parent: int, parents: dict[int, int]) -> list[int]:
    """The processes whose parent is ``parent`` (torchrun's ranks are the agent's children)."""
    return [pid for pid, ppid in parents.items() if ppid == parent]


def _family(pid: int, parents: dict[int, int]) -> list[int]:
    """``pid`` and every process below it."""
    family = [pid]
    for child in _children(pid, parents):
        family.extend(_family(child, parents))
    return family


def _rank_logs(out_dir: Path, limit: int = 12000) -> str:
    """The end of each rank's stderr, from the files ``--tee`` wrote: written by the ranks
    themselves, they hold what a rank printed up to its last moment, the agent killed or not."""
    parts = []
    for log in sorted((out_dir / "torchelastic").glob("*/attempt_*/*/stderr.log")):
        text = log.read_text(errors="replace")
        parts.append(f"rank {log.parent.name} stderr ({log}):\n{text[-limit:]}\n")
    return "".join(parts)


def _failed_suites(results: Path) -> str:
    """The suites that raised on some rank, from a results.json written before the launch failed:
    a rank that crashes on the way out must not hide the error that came first."""
    if not results.exists():
        return " (no results.json)"
    failed = [f"\n{name} on rank {rank}: {part.get('error')}\n{part.get('traceback', '')}"
              for name, parts in json.loads(results.read_text()).items() if isinstance(parts, list)
              for rank, part in enumerate(parts) if isinstance(part, dict) and part.get("ok") is False]
    return "".join(failed) or " (every suite succeeded on every rank)"


def python(script: str, *args: str, timeout: float = 120.0,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh Python interpreter."""
    cmd = [sys.executable, str(HERE / script), *args]
    return subprocess.run(cmd, cwd=ROOT, env=_env(env), capture_output=True, text=True, timeout=timeout)
