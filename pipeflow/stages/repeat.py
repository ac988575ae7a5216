"""``repeat``: restart the upstream stages when they are exhausted."""

from __future__ import annotations

from typing import Any

from .._checks import check_int
from .base import SOURCES_KEY, Stage

__all__ = ["Repeater"]


class Repeater(Stage[Any]):
    """Yields ``source`` ``times`` times over (forever when ``times`` is None).

    Each round resets the upstream stages, and shufflers upstream reshuffle because they count
    their restarts. An upstream that yields nothing ends the repetition instead of spinning.

    Args:
        source: the input stage.
        times: number of rounds, or None for endless.
    """

    passes_items = True

    def __init__(self, source: Stage[Any], times: int | None = None) -> None:
        super().__init__(source)
        check_int(times, "repeat(times=...)", low=0, optional=True)
        self._times = times
        self._round = 0
        self._yielded_this_round = False

    def start(self, state: dict[str, Any] | None) -> None:
        self._round = int(state["round"]) if state else 0
        self._yielded_this_round = bool(state["yielded"]) if state else False

    def next(self) -> Any:
        while self._times is None or self._round < self._times:
            try:
                item = next(self.source)
            except StopIteration:
                if not self._yielded_this_round:
                    raise  # an empty upstream would otherwise loop forever
                self._round += 1
                self._yielded_this_round = False
                if self._times is not None and self._round >= self._times:
                    break
                self.source.reset(None)
                continue
            self._yielded_this_round = True
            return item
        raise StopIteration

    def get_state(self) -> dict[str, Any]:
        return {"round": self._round, "yielded": self._yielded_this_round,
                SOURCES_KEY: [self.source.state_dict()]}
