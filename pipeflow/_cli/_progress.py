"""Progress bars of the long commands: tqdm on stderr when stderr is a terminal.

A bar redraws its line with carriage returns; into a log or a pipe (``2>log``,
``2>&1 | tail``) that is hundreds of garbled lines, so there a command prints plain lines at
most every few seconds instead (or nothing, where it prints its own lines anyway).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = ["draws_bars", "messages_above", "progress_bar"]


def draws_bars(stream: Any = None) -> bool:
    """Whether a bar may redraw itself on ``stream`` (default stderr): a terminal that can."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"


class _Off:
    """The bar that draws nothing; its ``write`` prints the line as it is."""

    total: int | None = None

    def update(self, n: int = 1) -> None:
        pass

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        pass

    def refresh(self) -> None:
        pass

    def write(self, line: str, file: Any = None) -> None:
        print(line, file=file or sys.stdout, flush=True)

    def close(self) -> None:
        pass


class _Lines(_Off):
    """No bar: a plain line on stderr at most every ``every`` seconds, and one at the end."""

    def __init__(self, desc: str, total: int | None, unit: str, every: float) -> None:
        self.desc, self.total, self.unit, self.every = desc, total, unit, every
        self.n = 0
        self._start = self._last = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if now - self._last >= self.every:
            self._last = now
            self._say(now)

    def _say(self, now: float) -> None:
        of = f"/{self.total}" if self.total else ""
        rate = self.n / max(now - self._start, 1e-9)
        print(f"{self.desc}: {self.n}{of}{self.unit}, {rate:.1f}{self.unit}/s", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.n:
            self._say(time.perf_counter())


def _columns() -> int:
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError):
        return 0


def progress_bar(desc: str, *, total: int | None = None, unit: str = " samples",
                 quiet: bool = False, lines_every: float | None = None) -> Any:
    """A tqdm bar on stderr (items, rate, ETA when ``total`` is known) when stderr is a terminal.

    Otherwise (a log, a pipe, no tqdm installed) or with ``quiet``, a bar that draws nothing;
    with ``lines_every``, not quiet and no terminal, plain lines every that many seconds and one
    at the end. Print other lines with the bar's ``write`` while it is open, so they do not
    tear it."""
    if quiet:
        return _Off()
    if draws_bars():
        try:
            from tqdm import tqdm
        except ImportError:
            pass
        else:
            # a terminal that reports no size (a bare pseudo-terminal) would get no bar at all:
            # tqdm draws nothing on 0 columns, nor below the last of 0 rows
            size = {} if _columns() else {"ncols": 100, "nrows": 24}
            return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, **size)
    return _Lines(desc, total, unit, lines_every) if lines_every is not None else _Off()


@contextlib.contextmanager
def messages_above(bar: Any) -> Iterator[None]:
    """While the block runs, pipeflow's log records and Python's warnings go on lines of their
    own above ``bar`` instead of being glued to the end of the bar's line (a bar leaves the
    cursor there). The routes are installed in this process, so the DataLoader workers it forks
    inherit them. Nothing changes for a bar that draws nothing (a log or a pipe)."""
    if isinstance(bar, _Off):
        yield
        return
    handler = _AboveBar(bar)
    logger = logging.getLogger("pipeflow")
    propagate, show = logger.propagate, warnings.showwarning
    logger.addHandler(handler)
    logger.propagate = False  # else a handler further up would print each record a second time
    warnings.showwarning = handler.show_warning
    try:
        yield
    finally:
        warnings.showwarning = show
        logger.propagate = propagate
        logger.removeHandler(handler)


class _AboveBar(logging.Handler):
    """Writes records and warnings above a tqdm bar: with the bar's ``write`` in the process that
    draws it; in a forked worker (whose copy of the bar is stale) by clearing the terminal's
    current line first, the bar's line, which the drawing process redraws at its next update."""

    def __init__(self, bar: Any) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))
        self._bar, self._pid = bar, os.getpid()
        self._show = warnings.showwarning

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._write(self.format(record))
        except Exception:
            self.handleError(record)

    def show_warning(self, message: Warning | str, category: type[Warning], filename: str, lineno: int,
                     file: Any = None, line: str | None = None) -> None:
        """``warnings.showwarning`` for stderr; a warning meant for another file goes there."""
        if file is not None and file is not sys.stderr:
            self._show(message, category, filename, lineno, file, line)
            return
        self._write(warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n"))

    def _write(self, text: str) -> None:
        if os.getpid() == self._pid:
            self._bar.write(text, file=sys.stderr)
        else:
            sys.stderr.write(f"\r\x1b[2K{text}\n")
            sys.stderr.flush()
