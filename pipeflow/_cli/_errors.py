"""How a command prints an error a user can fix: the message and its notes, no traceback, also
when the error was raised in a DataLoader worker (torch raises it again in the main process with
the worker's whole traceback as its message)."""

from __future__ import annotations

import re

__all__ = ["error_text"]

#: the start of the message torch gives an exception it raises again from a worker
_CAUGHT = re.compile(r"Caught (\w+) (in DataLoader worker process \d+)\.\nOriginal Traceback")


def error_text(exc: BaseException) -> str:
    """``exc``'s message and notes; from a DataLoader worker, the original message and notes
    (the last lines of the worker's traceback) and which worker raised it."""
    text = str(exc)
    caught = _CAUGHT.match(text)
    if caught is not None:
        # the traceback ends with "module.Name: message", then the notes, one a line
        lines = text.rstrip("\n").split("\n")
        head = re.compile(rf"^(?:[\w.]+\.)?{re.escape(caught.group(1))}: ")
        for i in range(len(lines) - 1, -1, -1):
            found = head.match(lines[i])
            if found is not None:
                return "\n".join([lines[i][found.end():], *lines[i + 1:], f"({caught.group(2)})"])
        return text  # not in the form expected: all of it rather than a guess
    return "\n".join([text, *getattr(exc, "__notes__", ())])
