"""The stage contract every pipeflow stage implements.

A stage is a small iterator class. Subclasses implement four methods:

* ``reset(state=None)``: (re)start, from the beginning when ``state`` is falsy, else from a
  state previously returned by ``get_state``. Expensive setup (threads, connections) lives
  here, not in ``__init__``. Subclasses call ``super().reset(state)`` first.
* ``next()``: return the next item or raise ``StopIteration``.
* ``get_state()``: a small, symbolic description of the position (indices, seeds, cursors),
  from which ``reset`` resumes exactly after the last item returned by ``next``.
* ``close()``: release resources; idempotent; closes the sources too.

The base class owns ``__iter__``/``__next__``, lazy reset (nothing starts until the first item is
requested, so ``load_state_dict`` right after construction is cheap) and ``state_dict``.
The default ``reset``/``get_state`` handle the sources under the key ``"sources"``, so a
stateless one-input stage needs to implement only ``next``.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from ..run_context import RunContext

__all__ = ["Stage", "describe_item"]

T = TypeVar("T")


class Stage(Generic[T]):
    """Base class of all stages. See the module docstring for the contract."""

    #: True for stages that split data across ranks/workers; the builder uses it to decide
    #: on automatic sharding and on how shufflers are seeded.
    is_sharder: bool = False
    #: True for stages that turn every input item into exactly one output item; ``equalize``
    #: counts the items of a known-length source through them
    one_to_one: bool = False

    def __init__(self, *sources: Stage[Any]) -> None:
        self.sources: tuple[Stage[Any], ...] = sources
        self.context: RunContext = RunContext()
        #: name shown in errors and stats; the builder sets it to the explain() label
        self.name: str = type(self).__name__
        #: set by the builder: True when a sharding stage lies upstream of this one
        self.sharded_upstream: bool = False
        self._needs_reset = True
        self._pending_state: dict[str, Any] | None = None
        self._closed = False

    @property
    def source(self) -> Stage[Any]:
        """The single input of a one-input stage."""
        return self.sources[0]

    # ---- contract, overridden by subclasses -------------------------------------------
    def reset(self, state: dict[str, Any] | None = None) -> None:
        """Restart from the beginning (falsy ``state``) or from ``state``."""
        self._needs_reset = False
        self._closed = False
        states = state.get("sources") if state else None
        for i, src in enumerate(self.sources):
            src.reset(states[i] if states else None)

    def next(self) -> T:
        """Return the next item; raise ``StopIteration`` at the end."""
        raise NotImplementedError

    def get_state(self) -> dict[str, Any]:
        """Return the position after the last item returned by ``next``."""
        return {"sources": [src.state_dict() for src in self.sources]} if self.sources else {}

    def close(self) -> None:
        """Release resources held by this stage and its sources. Idempotent."""
        self._closed = True
        self._needs_reset = True
        for src in self.sources:
            src.close()

    # ---- owned by the base class --------------------------------------------------------
    def __iter__(self) -> Stage[T]:
        return self

    def __next__(self) -> T:
        if self._needs_reset:
            state, self._pending_state = self._pending_state, None
            self.reset(state)
        return self.next()

    def state_dict(self) -> dict[str, Any]:
        """The current position; cheap before the first item (returns the pending state)."""
        if self._needs_reset:
            return dict(self._pending_state or {})
        return self.get_state()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Resume from ``state`` when the next item is requested."""
        self._pending_state = dict(state) if state else None
        self._needs_reset = True

    def ensure_started(self) -> None:
        """Run the lazy reset now if it is still pending."""
        if self._needs_reset:
            state, self._pending_state = self._pending_state, None
            self.reset(state)

    def known_length(self) -> int | None:
        """The number of items this stage yields in an epoch when known without reading data."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


def describe_item(item: Any, limit: int = 120) -> str:
    """A short description of an item for error messages: its sample key or URL if it has one."""
    if isinstance(item, dict):
        for key in ("__key__", "__url__", "url"):
            if key in item:
                return f"{key}={item[key]!r}"
    for attr in ("url", "key"):
        value = getattr(item, attr, None)
        if isinstance(value, str):
            return f"{attr}={value!r}"
    if isinstance(item, tuple) and item and isinstance(item[0], str):
        return repr(item[0])[:limit]
    text = repr(item)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text
