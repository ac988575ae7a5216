"""Walks over built stages that the counting stages need: where the sharding is upstream, and
how many items a source holds.

They live in the stages layer, beside what they walk, so the stages that ask (``equalize``,
``take(across="all")``) do not import the graph builder above them; :mod:`pipeflow.graph`
re-exports them.
"""

from __future__ import annotations

from typing import Any

from .base import Stage

__all__ = ["find_sharder", "known_total"]


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
