"""Argument types for the subcommands' numeric options: a value out of range is refused by
argparse itself (the subcommand's usage, then ``error: argument --batch-size: must be a positive
integer, got 0``, exit status 2), before anything is generated, listed or started, instead of
reaching torch or a modulo as a traceback."""

from __future__ import annotations

import argparse
import math

__all__ = ["non_negative_int", "positive_float", "positive_int"]


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    """An int >= 1 (a batch size, a count of steps, epochs or samples)."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An int >= 0 (DataLoader workers: 0 loads in the main process)."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def positive_float(text: str) -> float:
    """A finite float > 0 (megabytes, seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 < value < math.inf:  # NaN and infinity too: MB and seconds become ints and timers
        raise argparse.ArgumentTypeError(f"must be a finite number more than 0, got {text}")
    return value
