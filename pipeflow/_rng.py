"""A tiny counter-based random number generator.

Every draw is a pure function of ``(seed, counter)``, so a stage's random state is two integers
rather than the 2.5 KB of ``random.Random.getstate()``: states stay small and exact.
"""

from __future__ import annotations

import hashlib

__all__ = ["derive_seed", "draw", "uniform"]

_MASK = (1 << 64) - 1


def derive_seed(*parts: object) -> int:
    """A 64-bit seed from any mix of ints and strings (stable across processes and runs)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def draw(seed: int, counter: int, n: int) -> int:
    """A uniform integer in ``[0, n)`` for draw number ``counter`` of stream ``seed``."""
    # 64 random bits; the modulo bias for n << 2**64 is negligible for shuffling
    return _splitmix64(seed ^ (counter * 0xD1B54A32D192ED03 & _MASK)) % n


def uniform(seed: int, counter: int) -> float:
    """A uniform float in ``[0, 1)``."""
    return (_splitmix64(seed ^ (counter * 0xD1B54A32D192ED03 & _MASK)) >> 11) / float(1 << 53)
