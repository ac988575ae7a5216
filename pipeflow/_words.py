"""Counts in messages: "1 tar shard", "2 tar shards".

A message that reads "1 tar shards" tells the user the tool was not written for their case;
every count a user can see goes through :func:`counted`.
"""

from __future__ import annotations

__all__ = ["counted"]


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun`` in agreement: the singular for exactly 1, else ``plural`` (by default
    the noun plus "s"; give it for irregular words: ``counted(n, "entry", "entries")``)."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"
