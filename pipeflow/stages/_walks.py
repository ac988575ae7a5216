"""Walks over built stages: every stage once, the graph's shape, and the questions the counting
stages ask of their upstream (where the sharding is, how many items a source holds).

They live in the stages layer, beside what they walk, so a stage that needs one (``equalize``,
``take(across="all")``) does not import the graph builder above it; :mod:`pipeflow.graph`
re-exports them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .base import Stage

__all__ = ["find_sharder", "fingerprint", "known_total", "walk"]


def walk(stage: Stage[Any]) -> Iterator[Stage[Any]]:
    """Every stage of a built graph, ``stage`` first, each once."""
    seen: set[int] = set()
    todo = [stage]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo.extend(current.sources)


def fingerprint(stage: Stage[Any]) -> str:
    """The graph's shape by stage class (options left out, so they may change on resume)."""
    inner = ",".join(fingerprint(s) for s in stage.sources)
    return f"{type(stage).__name__}({inner})" if inner else type(stage).__name__


def find_sharder(stage: Stage[Any]) -> Any:
    """The nearest sharding stage upstream through one-input stages, or None."""
    seen = 0
    while stage is not None and seen < 64:
        if stage.is_sharder:
            return stage
        if len(stage.sources) != 1:
            return None
        stage = stage.sources[0]
        seen += 1
    return None


def known_total(stage: Stage[Any]) -> int | None:
    """The item count of a source that knows it (``from_items``) reached through one-to-one
    stages and sharders only, or None."""
    while True:
        total = stage.known_length()
        if total is not None:
            return total
        if (stage.is_sharder or stage.one_to_one) and len(stage.sources) == 1:
            stage = stage.sources[0]
            continue
        return None
