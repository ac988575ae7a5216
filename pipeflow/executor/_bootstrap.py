"""Recognising the most common reason process workers die at start: a script that runs its
pipeline at import time, without ``if __name__ == "__main__":``.

With the spawn and forkserver start methods every worker process imports the main script again
before it can run anything. If the script starts the process pool at its top level, each worker
tries to start a pool of its own while still importing, multiprocessing refuses, and the worker
dies; the parent only learns that a worker died. Whether a call comes from unguarded top-level
code is a question about the script's structure, answered from its syntax tree, never from the
worker's error text.
"""

from __future__ import annotations

import ast
import os
import sys
from types import FrameType

from ..errors import WorkerCrashedError

__all__ = ["RESTARTING_METHODS", "crashed_error", "unguarded_main_call"]

#: start methods whose workers import the main script again
RESTARTING_METHODS = frozenset({"spawn", "forkserver"})


def _is_main_guard(stmt: ast.stmt) -> bool:
    if not isinstance(stmt, ast.If) or not isinstance(stmt.test, ast.Compare):
        return False
    test = stmt.test
    if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(consts) == 1


def _main_module_frame(start: FrameType | None, main_globals: dict) -> FrameType | None:
    frame = start
    while frame is not None:
        if frame.f_globals is main_globals and frame.f_code.co_name == "<module>":
            return frame
        frame = frame.f_back
    return None


def unguarded_main_call() -> str | None:
    """``"script.py, line 12"`` when the running call comes from the top level of the main
    script outside an ``if __name__ == "__main__":`` block; None otherwise (the guard is there,
    the call comes from a function, or there is no main script: ``python -c``, a notebook)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str):
        return None
    frame = _main_module_frame(sys._getframe(1), main.__dict__)
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), filename=path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    for stmt in tree.body:
        if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
            return None if _is_main_guard(stmt) else f"{path}, line {line}"
    return None


def unreadable_main() -> str | None:
    """The main script's name when it is no file a worker could import again (``python -``
    reads it from ``<stdin>``, which multiprocessing then looks for as a path), else None."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not isinstance(path, str) or os.path.isfile(path):
        return None
    return path


def crashed_error(name: str, start_method: str | None, detail: str) -> WorkerCrashedError:
    """The error for a dead process worker of stage ``name``: the missing main guard when that
    is the reason (the call comes from unguarded top-level code under spawn or forkserver),
    else a crash; ``detail`` says which item was in flight or could not be submitted."""
    restarting = start_method in RESTARTING_METHODS
    unreadable = unreadable_main() if restarting else None
    if unreadable:
        return WorkerCrashedError(
            f"the worker processes of {name} could not start: with the {start_method!r} start "
            f"method each worker imports the main script again, and it was read from {unreadable}, "
            'which a worker cannot read. Save the script to a file and run that, or use method="thread"')
    where = unguarded_main_call() if restarting else None
    if where:
        return WorkerCrashedError(
            f"the worker processes of {name} could not start: with the {start_method!r} start "
            f"method each worker imports the main script again, and {where} starts the pipeline at "
            'import time. Put the code that runs the pipeline under `if __name__ == "__main__":`, '
            'or use method="thread"')
    return WorkerCrashedError(f"a worker process of {name} died (killed, out of memory or crashed); {detail}")
