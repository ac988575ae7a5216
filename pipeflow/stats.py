"""Run statistics: what the stages of a pipeline skipped, retried or dropped (:class:`Stats`)."""

from __future__ import annotations

import threading
from collections import Counter

__all__ = ["Stats"]


class Stats:
    """Thread-safe counters keyed by ``(stage name, counter name)``.

    Stages count what they skip (``on_error="skip"``), retry or drop so nothing is lost silently;
    ``Pipeline.stats()`` returns a snapshot after (or during) an epoch.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()

    def incr(self, stage: str, counter: str, n: int = 1) -> None:
        """Add ``n`` to ``counter`` of ``stage`` (thread-safe)."""
        with self._lock:
            self._counts[(stage, counter)] += n

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Returns ``{stage: {counter: value}}``."""
        out: dict[str, dict[str, int]] = {}
        with self._lock:
            for (stage, counter), value in sorted(self._counts.items()):
                out.setdefault(stage, {})[counter] = value
        return out
