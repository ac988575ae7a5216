"""Run the ``pipeflow`` command with its output on pseudo-terminals, as a user at a shell does."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[2]
#: what a tqdm bar draws on its line: a redraw and a rate
BAR_MARKS = ("\r", "/s]")


class _PtyReader:
    """One pseudo-terminal: the child writes to ``writer``; a thread drains ``reader`` so a full
    terminal buffer never blocks the command."""

    def __init__(self, columns: int) -> None:
        self.reader, self.writer = pty.openpty()
        # a terminal window has a size; a bare pseudo-terminal reports 0 x 0
        fcntl.ioctl(self.writer, termios.TIOCSWINSZ, struct.pack("HHHH", 40 if columns else 0, columns, 0, 0))
        self.data = bytearray()
        self.thread = threading.Thread(target=self._drain, daemon=True)

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.reader, 1 << 16)
            except OSError:  # EIO: the command closed its end
                return
            if not chunk:
                return
            self.data.extend(chunk)

    def started(self) -> None:
        os.close(self.writer)
        self.thread.start()

    def text(self) -> str:
        self.thread.join(10)
        os.close(self.reader)
        # a terminal turns "\n" into "\r\n"; undo it so a bar's own "\r" redraws stand out
        return self.data.decode(errors="replace").replace("\r\n", "\n")


def pipeflow_cli(*args: str, terminal: bool | Literal["stdout", "stderr"], env: dict[str, str] | None = None,
                 timeout: float = 300, columns: int = 160) -> tuple[int, str, str]:
    """``(exit code, stdout, stderr)`` of ``pipeflow ARGS``.

    ``terminal=True``: stdout and stderr are terminals (each its own pseudo-terminal, so they can
    be told apart), as at a shell; ``"stdout"``: only stdout is (``pipeflow ... 2>log``);
    ``"stderr"``: only stderr is (``pipeflow ... | tail``); False: both are pipes. ``columns``:
    the terminals' width (0: a pseudo-terminal that reports no size)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    command = [sys.executable, "-m", "pipeflow.cli", *args]
    if terminal is False:
        done = subprocess.run(command, capture_output=True, text=True, env=full_env, timeout=timeout)
        return done.returncode, done.stdout, done.stderr
    ptys = {name: _PtyReader(columns) for name in ("stdout", "stderr") if terminal in (True, name)}
    proc = subprocess.Popen(command, env=full_env,
                            stdout=ptys["stdout"].writer if "stdout" in ptys else subprocess.PIPE,
                            stderr=ptys["stderr"].writer if "stderr" in ptys else subprocess.PIPE)
    for one in ptys.values():
        one.started()
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    texts = {name: one.text() for name, one in ptys.items()}
    return (proc.returncode, texts.get("stdout", (out or b"").decode(errors="replace")),
            texts.get("stderr", (err or b"").decode(errors="replace")))


def has_bar(stderr: str, desc: str) -> bool:
    """True when ``stderr`` holds a tqdm bar described by ``desc``."""
    return all(mark in stderr for mark in BAR_MARKS) and f"\r{desc}" in stderr


_ESCAPE = re.compile(r"\x1b\[([0-9;]*)([A-Za-z])")


def screen_lines(text: str) -> list[str]:
    """The lines a terminal shows for ``text`` (as :func:`pipeflow_cli` returns it): ``\\r``
    returns to the line's start and later characters overwrite it, ``\\n`` starts a new line,
    ``ESC[2K`` clears the line; other escape sequences are dropped."""
    lines, col, at = [""], 0, 0
    while at < len(text):
        esc = _ESCAPE.match(text, at)
        if esc:
            if esc.group(2) == "K" and esc.group(1) == "2":
                lines[-1] = ""
            at = esc.end()
            continue
        char, at = text[at], at + 1
        if char == "\r":
            col = 0
        elif char == "\n":
            lines.append("")
            col = 0
        else:
            line = lines[-1].ljust(col)
            lines[-1] = line[:col] + char + line[col + 1:]
            col += 1
    return lines
