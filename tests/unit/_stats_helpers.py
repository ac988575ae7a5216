"""Module-level functions for the stats tests (picklable for spawn/forkserver workers)."""

import time


def slow_identity(x):
    time.sleep(0.002)
    return x


def very_slow_identity(x):
    time.sleep(0.02)
    return x


#: seconds the planted slow stage of the verdict table sleeps per item
PLANTED_S = 0.005


def planted(x):
    time.sleep(PLANTED_S)
    return x


def planted_list(i):
    """Four items per call (unbatch's input), as slow as four calls of planted."""
    time.sleep(4 * PLANTED_S)
    return [i] * 4


def planted_pair(i):
    """A (name, bytes) record; two consecutive ones make a sample for group_pairs."""
    time.sleep(PLANTED_S)
    return (f"s{i // 2:04d}.f{i % 2}", b"x")


def planted_path(path):
    time.sleep(PLANTED_S)
    return path


def shown_kept(x):
    return x % 4 != 0
