"""Module-level functions for process-worker tests (picklable, importable by the workers)."""

from __future__ import annotations

import os
import time

import numpy as np
import torch


def big_sample(i: int) -> dict:
    """A decoded-sample-like result: large tensor and array (shared memory), small ones (pickled)."""
    return {"__key__": f"k{i}", "image": torch.full((3, 224, 224), i % 251, dtype=torch.uint8),
            "depth": np.full((256, 256), float(i), dtype=np.float32), "small": np.arange(4) + i,
            "list": [torch.arange(40_000, dtype=torch.int32) + i]}


def big_or_die_on_5(i: int) -> dict:
    if i == 5:
        os._exit(9)
    return big_sample(i)


def big_or_raise_on_5(i: int) -> dict:
    if i == 5:
        raise ValueError("bad item 5")
    return big_sample(i)


def slow_big(i: int) -> dict:
    time.sleep(0.05)
    return big_sample(i)


def parallel_ops(i: int) -> int:
    """torch operators that run on an OpenMP team when given more than one thread."""
    x = torch.randn(800, 800)
    y = x.permute(1, 0).contiguous()
    return i + int(torch.isfinite((x @ y).sum()).item())
