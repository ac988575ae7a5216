"""Progress bars of the long commands: tqdm on stderr, only when stdout is a terminal."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["progress_bar"]


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


def progress_bar(desc: str, *, total: int | None = None, unit: str = " samples",
                 quiet: bool = False) -> Any:
    """A tqdm bar (items, rate, ETA when ``total`` is known), or one that draws nothing when
    ``quiet``, when stdout is not a terminal (a log, a pipe) or without tqdm installed.

    Print other lines with the bar's ``write`` while it is open, so they do not tear it."""
    if quiet or not sys.stdout.isatty():
        return _Off()
    try:
        from tqdm import tqdm
    except ImportError:
        return _Off()
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False)
