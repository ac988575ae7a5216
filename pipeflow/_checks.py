"""Option validators: one wording for every stage's and backend's bad option.

Each raises :class:`~pipeflow.errors.ConfigError` naming the option as the user wrote it
(``what``, for example ``"map(workers=...)"``) and the value received.
"""

from __future__ import annotations

from typing import Any

from .errors import ConfigError

__all__ = ["check_bool", "check_choice", "check_int", "is_int"]


def is_int(value: Any) -> bool:
    """True for an ``int`` that is not a ``bool`` (``True`` is an int to Python, never to us)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(value: Any, what: str, *, low: int | None = None, optional: bool = False) -> int | None:
    """``value`` must be an int (not a bool), at least ``low`` when given; None if ``optional``."""
    if value is None and optional:
        return None
    if not is_int(value) or (low is not None and value < low):
        bound = "" if low is None else {0: "a non-negative ", 1: "a positive "}.get(low, f"an >= {low} ")
        kind = f"{bound}int" if bound else "an int"
        raise ConfigError(f"{what} must be {kind}, got {value!r}")
    return value


def check_bool(value: Any, what: str) -> bool:
    """``value`` must be a real ``bool`` (not 0/1 or a string)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{what} must be True or False, got {value!r}")
    return value


def check_choice(value: Any, what: str, choices: tuple[Any, ...]) -> Any:
    """``value`` must be one of ``choices``."""
    if value not in choices:
        shown = " or ".join(repr(c) for c in choices)
        raise ConfigError(f"{what} must be {shown}, got {value!r}")
    return value
