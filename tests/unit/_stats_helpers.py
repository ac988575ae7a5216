"""Module-level functions for the stats tests (picklable for spawn/forkserver workers)."""

import time


def slow_identity(x):
    time.sleep(0.002)
    return x


def very_slow_identity(x):
    time.sleep(0.02)
    return x
