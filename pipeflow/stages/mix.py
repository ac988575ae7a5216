"""``mix`` and ``interleave``: fan-in of several pipelines."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from .._checks import check_choice
from .._rng import derive_seed, uniform
from ..errors import ConfigError
from .base import SOURCES_KEY, Stage

__all__ = ["Interleaver", "Mixer"]


class Mixer(Stage[Any]):
    """Draws each item from one of several sources, chosen at random by weight.

    Args:
        *sources: the input stages.
        weights: one non-negative weight per source, or ``f(epoch, step) -> weights`` to change
            the mix during training (for example a curriculum).
        seed: base seed; the draws depend on ``(seed, epoch)`` and the step number.
        stop: ``"first"`` ends at the first exhausted source; ``"all"`` continues with the
            others, renormalising their weights, until every source is exhausted.
    """

    def __init__(self, *sources: Stage[Any],
                 weights: Sequence[float] | Callable[[int, int], Sequence[float]],
                 seed: int = 0, stop: Literal["first", "all"] = "all") -> None:
        super().__init__(*sources)
        if not sources:
            raise ConfigError("mix() needs at least one pipeline")
        check_choice(stop, "mix(stop=...)", ("first", "all"))
        if not callable(weights):
            self._check_weights(list(weights))
        self._weights = weights
        self._seed = seed
        self._stop = stop
        self._step = 0
        self._active = [True] * len(sources)

    def _check_weights(self, weights: list[float]) -> list[float]:
        if len(weights) != len(self.sources) or any(w < 0 for w in weights) or not any(weights):
            raise ConfigError(
                f"mix() needs {len(self.sources)} non-negative weights, not all zero; got {weights!r}")
        return weights

    def start(self, state: dict[str, Any] | None) -> None:
        self._step = int(state["step"]) if state else 0
        self._active = list(state["active"]) if state else [True] * len(self.sources)
        shard = self.context.shard_index if self.sharded_upstream else -1
        self._stream = derive_seed("mix", self._seed, self.context.epoch, shard)

    def _current_weights(self) -> list[float]:
        if callable(self._weights):
            return self._check_weights([float(w) for w in self._weights(self.context.epoch, self._step)])
        return list(self._weights)

    def next(self) -> Any:
        while True:
            weights = [w if active else 0.0 for w, active in zip(self._current_weights(), self._active)]
            total = sum(weights)
            if total <= 0:
                raise StopIteration
            u = uniform(self._stream, self._step) * total
            chosen, acc = len(weights) - 1, 0.0
            for i, w in enumerate(weights):
                acc += w
                if u < acc and w > 0:
                    chosen = i
                    break
            try:
                item = next(self.sources[chosen])
            except StopIteration:
                self._step += 1
                if self._stop == "first":
                    raise
                self._active[chosen] = False
                continue
            self._step += 1  # only now: a draw whose source failed is drawn again on resume
            return item

    def get_state(self) -> dict[str, Any]:
        return {"step": self._step, "active": list(self._active),
                SOURCES_KEY: [s.state_dict() for s in self.sources]}


class Interleaver(Stage[Any]):
    """Takes one item from each source in turn.

    Args:
        *sources: the input stages.
        stop: ``"first"`` ends at the first exhausted source; ``"all"`` skips exhausted
            sources until every one is exhausted.
    """

    def __init__(self, *sources: Stage[Any], stop: Literal["first", "all"] = "all") -> None:
        super().__init__(*sources)
        if not sources:
            raise ConfigError("interleave() needs at least one pipeline")
        check_choice(stop, "interleave(stop=...)", ("first", "all"))
        self._stop = stop
        self._turn = 0
        self._active = [True] * len(sources)

    def start(self, state: dict[str, Any] | None) -> None:
        self._turn = int(state["turn"]) if state else 0
        self._active = list(state["active"]) if state else [True] * len(self.sources)

    def next(self) -> Any:
        n = len(self.sources)
        while any(self._active):
            i = self._turn
            self._turn = (i + 1) % n
            if not self._active[i]:
                continue
            try:
                return next(self.sources[i])
            except StopIteration:
                if self._stop == "first":
                    self._active = [False] * n
                    raise
                self._active[i] = False
        raise StopIteration

    def get_state(self) -> dict[str, Any]:
        return {"turn": self._turn, "active": list(self._active),
                SOURCES_KEY: [s.state_dict() for s in self.sources]}
