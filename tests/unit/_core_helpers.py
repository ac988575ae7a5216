"""Module-level callables for tests that need picklable functions (process workers, spawn)."""

import os
import time


def double(x):
    return x * 2


def slow_double(x):
    time.sleep(0.001 * (x % 5))
    return x * 2


def fail_on_13(x):
    if x == 13:
        raise KeyError(f"bad item {x}")
    return x


def die_on_3(x):
    if x == 3:
        os._exit(7)
    return x


def sleep_forever(x):
    time.sleep(3600)
    return x


def is_even(x):
    return x % 2 == 0


def lambda_on_5(x):
    """An unpicklable result for item 5 only."""
    return (lambda: x) if x == 5 else x


def wait_for_file(x):
    """Blocks (in a worker process) until the path ``x[1]`` exists; returns ``x[0]``."""
    deadline = time.monotonic() + 30
    while not os.path.exists(x[1]) and time.monotonic() < deadline:
        time.sleep(0.01)
    return x[0]


def as_sample(x):
    """A WebDataset-style sample dict for item ``x``."""
    return {"__key__": f"s{x:03d}", "jpg": x, "cls": x % 3}


def as_field_url(x):
    """Item ``x`` as an object URL; four consecutive items share a sample key."""
    return f"s3://b/pairs/{x // 4:03d}.f{x % 4}"


def as_tensor(x):
    import torch

    return {"x": torch.tensor([x]), "pair": (torch.tensor(float(x)), [x])}


def digest(item):
    """What a worker received: sha256 and type of a bytes item, or of each bytes value of a dict."""
    import hashlib

    if isinstance(item, dict):
        return {k: (type(v).__name__, hashlib.sha256(v).hexdigest()) if isinstance(v, bytes) else v
                for k, v in item.items()}
    return type(item).__name__, hashlib.sha256(item).hexdigest()
