"""One torch intra-op thread in each of pipeflow's own worker threads.

torch runs an operator (``interpolate`` in a resize, the ``stack`` of ``default_collate``) on a
team of OpenMP threads, as many as the cores, and every thread that calls one gets a team of its
own. In a DataLoader worker torch sets one thread, so N workers use N cores. In the training
process, a pipeline's decode threads and its batching thread each started a team of their own:
on 2 busy cores that made the decode group 10x slower (measured: 25 samples/s against 260/s with
one thread each), the threads waiting on each other's barriers instead of decoding.

pipeflow's threads get their parallelism from ``workers=``, so each runs torch single-threaded.
OpenMP keeps the thread count per calling thread, so this leaves the training loop's own
intra-op threads (``torch.get_num_threads()`` in the main thread) as they are.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable

__all__ = ["one_intraop_thread", "single_intraop_thread"]


@functools.cache
def _omp_set_num_threads() -> Callable[[int], object] | None:
    """OpenMP's setter of the calling thread's team size, where torch loaded OpenMP."""
    try:
        return ctypes.CDLL(None).omp_set_num_threads
    except (AttributeError, OSError):  # no OpenMP in this process (a torch built without it)
        return None


def one_intraop_thread() -> None:
    """Make torch operators called from this thread run on this thread alone.

    A no-op before torch is imported (nothing here can call it then) and without OpenMP.
    """
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "get_num_threads"):
        return
    setter = _omp_set_num_threads()
    if setter is None:
        return
    torch.get_num_threads()  # torch's per-thread set-up first, so it does not undo the next line
    setter(1)


def single_intraop_thread() -> bool:
    """True when torch operators called from this thread run on this thread alone (or torch is
    not imported: nothing here calls one then)."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "get_num_threads"):
        return True
    return bool(torch.get_num_threads() == 1)
