"""Run the ``pipeflow`` command with its stdout on a pseudo-terminal, as a user at a shell does."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: what a tqdm bar draws on its line: a redraw and a rate
BAR_MARKS = ("\r", "/s]")


def pipeflow_cli(*args: str, terminal: bool, env: dict[str, str] | None = None,
                 timeout: float = 300) -> tuple[int, str, str]:
    """``(exit code, stdout, stderr)`` of ``pipeflow ARGS``; stdout is a pseudo-terminal when
    ``terminal``, else a pipe like stderr always is."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    command = [sys.executable, "-m", "pipeflow.cli", *args]
    if not terminal:
        done = subprocess.run(command, capture_output=True, text=True, env=full_env, timeout=timeout)
        return done.returncode, done.stdout, done.stderr
    reader, writer = pty.openpty()
    proc = subprocess.Popen(command, stdout=writer, stderr=subprocess.PIPE, env=full_env)
    os.close(writer)
    out = bytearray()

    def drain() -> None:
        # a full terminal buffer would block the command: read it while it runs
        while True:
            try:
                chunk = os.read(reader, 1 << 16)
            except OSError:  # EIO: the command closed its end
                return
            if not chunk:
                return
            out.extend(chunk)

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        thread.join(10)
        os.close(reader)
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def has_bar(stderr: str, desc: str) -> bool:
    """True when ``stderr`` holds a tqdm bar described by ``desc``."""
    return all(mark in stderr for mark in BAR_MARKS) and f"\r{desc}" in stderr
