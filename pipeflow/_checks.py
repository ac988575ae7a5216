"""Option validators: one wording for every stage's and backend's bad option.

Each raises :class:`~pipeflow.errors.ConfigError` naming the option as the user wrote it
(``what``, for example ``"map(workers=...)"``) and the value received.
"""

from __future__ import annotations

from typing import Any, TypeGuard

from .errors import ConfigError

__all__ = ["check_bool", "check_choice", "check_int", "check_int_or_auto", "is_int"]


def is_int(value: Any) -> TypeGuard[int]:
    """True for an ``int`` that is not a ``bool`` (``True`` is an int to Python, never to us)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(value: Any, what: str, *, low: int | None = None, optional: bool = False) -> int | None:
    """``value`` must be an int (not a bool), at least ``low`` when given; None if ``optional``."""
    if value is None and optional:
        return None
    if not is_int(value) or (low is not None and value < low):
        raise ConfigError(f"{what} must be {_int_kind(low)}, got {value!r}")
    return value


def _int_kind(low: int | None) -> str:
    bound = "" if low is None else {0: "a non-negative ", 1: "a positive "}.get(low, f"an >= {low} ")
    return f"{bound}int" if bound else "an int"


def check_int_or_auto(value: Any, what: str, *, low: int | None = None,
                      optional: bool = False) -> int | str | None:
    """Like :func:`check_int`, but the string ``"auto"`` (tuned while running) is accepted too."""
    if isinstance(value, str) and value == "auto":
        return value
    if (value is None and optional) or (is_int(value) and (low is None or value >= low)):
        return value
    raise ConfigError(f"{what} must be 'auto' or {_int_kind(low)}, got {value!r}")


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
