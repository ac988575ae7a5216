"""Launching helper scripts under torchrun or as fresh Python processes, with hard timeouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def _torchrun_cmd(script: str, out_dir: Path, nproc: int, *args: str) -> list[str]:
    """The launch line on a free loopback port. The agent's log directory goes into ``out_dir``:
    by default it makes a ``torchelastic_*`` directory in the system's temp dir and leaves it."""
    return [str(TORCHRUN), f"--nproc_per_node={nproc}", "--nnodes=1", "--master-addr=127.0.0.1",
            f"--master-port={free_port()}", f"--log-dir={out_dir / 'torchelastic'}", str(HERE / script),
            str(out_dir), *args]


def torchrun(script: str, out_dir: Path, *args: str, nproc: int = 2, timeout: float = 180.0,
             env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``script`` under torchrun on a free loopback port; return its results.json."""
    cmd = _torchrun_cmd(script, out_dir, nproc, *args)
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(env), capture_output=True, text=True, timeout=timeout)
    results = out_dir / "results.json"
    if proc.returncode != 0 or not results.exists():
        raise AssertionError(f"torchrun exited with {proc.returncode}{_failed_suites(results)}\n"
                             f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-8000:]}")
    return json.loads(results.read_text())


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
