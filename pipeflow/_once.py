"""Messages shown once per run, not once per DataLoader worker per epoch.

DataLoader workers are fresh processes every epoch (unless ``persistent_workers``), so a
module-level "already said it" flag is reset in each of them. The flags live instead in one
anonymous shared memory page created when ``pipeflow`` is imported: worker processes forked
from the main process (the DataLoader's default on Linux) share the page, so a flag set by a
worker in epoch 0 is seen by every later worker and by the main process. Workers started with
spawn or forkserver get a page of their own; there the message appears once per worker process.
Nothing is written to disk and the page goes away with the last process that maps it.
"""

from __future__ import annotations

import mmap
import threading

__all__ = ["first_time"]

#: one byte of the shared page per message
_KEYS = ("auto_shard", "process_fallback", "pin_memory_no_cuda", "idle_shards", "unreplayable_state")

_shared = mmap.mmap(-1, mmap.PAGESIZE)  # MAP_SHARED | MAP_ANONYMOUS: inherited across fork
_lock = threading.Lock()


def first_time(key: str) -> bool:
    """True the first time ``key`` is asked for in this process tree, False after."""
    slot = _KEYS.index(key)
    with _lock:
        if _shared[slot]:
            return False
        _shared[slot] = 1
        return True
