"""Ctrl-C taken at a batch boundary by the command's training loop.

A terminal's Ctrl-C is a SIGINT to every process of the foreground group: the command and each
DataLoader worker. Python turns it into ``KeyboardInterrupt`` wherever the interpreter happens to
be. A DataLoader without persistent workers forks new workers at every epoch's start, and an
interrupt raised there lands in places that cannot take it: the at-fork callbacks and the
finalizers (Python prints "Exception ignored" and drops it, so the run goes on), the middle of
the DataLoader iterator's constructor (its ``__del__`` then fails on missing attributes), a worker
between the fork and torch's worker loop (it dies with exit status 1, the command reports "worker
exited unexpectedly" instead of an interrupt). With short epochs that is a large share of the time.

:class:`DeferredInterrupt` replaces the SIGINT handler of the command's main thread for the length
of the loop: the first Ctrl-C only records the request and the loop raises ``KeyboardInterrupt``
itself at its next batch (:meth:`DeferredInterrupt.check`), where the DataLoader shuts its workers
down the normal way. Forked workers inherit the handler: one that is inside the pipeline's
iteration (where torch's worker loop takes ``KeyboardInterrupt`` and pipeflow stops its threads
without waiting) raises it there, as without this class, so a worker stuck on a store ends at
once; anywhere else (forking, starting, ending) it leaves its ending to the command. A loop
that does not reach a batch within ``grace`` seconds (a store that stopped answering) gets the
interrupt raised where it waits, as without this class; so does a second Ctrl-C.

Except inside :meth:`DeferredInterrupt.held`, around the DataLoader iterator's construction (an
epoch's start): raised between a worker's fork and the iterator recording it, the interrupt
left that worker unknown to everything that ends workers (the iterator's shutdown, and, when
it fell before ``Process.start`` returned, multiprocessing's exit handler), alive after the
command. Construction only forks the workers (it does not talk to the store), so it is short
and bounded: a forced or second interrupt waits for its end, and is raised there, where the
built iterator shuts its workers down the normal way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType, TracebackType

from pipeflow._parent import in_forked_child
from pipeflow.iterator import PipelineIterator

__all__ = ["DeferredInterrupt"]


class DeferredInterrupt:
    """Record Ctrl-C; raise it at the loop's next :meth:`check` (see the module's docstring).

    Args:
        grace: seconds the loop has to reach :meth:`check` before the interrupt is raised where
            the main thread waits.

    Outside the main thread (where Python delivers no signals) it does nothing.
    """

    def __init__(self, grace: float = 1.0) -> None:
        self.grace = grace
        self.requested = False
        self._pid = os.getpid()
        self._previous: object = None
        self._installed = False
        self._raising = False
        self._forced = False
        self._holding = False
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._main_ident = threading.main_thread().ident

    def __enter__(self) -> DeferredInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._pid = os.getpid()
            self._previous = signal.signal(signal.SIGINT, self._handler)
            self._installed = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._cancel()
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]
            self._installed = False

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if in_forked_child(self._pid):  # a forked DataLoader worker
            if _iterating(frame):
                raise KeyboardInterrupt  # inside torch's worker loop, which takes it
            return  # forking, starting or ending: the command ends it through the DataLoader
        if self._forced:  # sent by the grace timer
            self._forced = False
            if self._raising or self._holding:
                return  # the loop got there first and is already raising, or raises at held()'s end
            raise KeyboardInterrupt
        if self.requested or self._raising:
            if self._holding:
                return  # a second Ctrl-C while workers are forked: raised at held()'s end
            raise KeyboardInterrupt  # a second Ctrl-C, or the loop missed its grace: raise here
        self.requested = True
        timer = threading.Timer(self.grace, self._force)
        timer.daemon = True
        timer.start()
        self._timer = timer

    def _force(self) -> None:
        """The loop did not reach a batch in time: a SIGINT to the main thread wakes its wait."""
        with self._lock:
            if self._installed and self._main_ident is not None and not self._raising:
                self._forced = True
                signal.pthread_kill(self._main_ident, signal.SIGINT)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A section no interrupt is raised in (building the DataLoader's iterator, which forks
        its workers); one that came meanwhile is raised as it ends."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        self.check()

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` here if Ctrl-C was pressed since the loop started."""
        if self.requested:
            with self._lock:
                self._cancel()
                self._raising = True
            raise KeyboardInterrupt


_NEXT = PipelineIterator.__next__.__code__


def _iterating(frame: FrameType | None) -> bool:
    """Whether the interrupted thread is inside a pipeline iterator's ``__next__``."""
    while frame is not None:
        if frame.f_code is _NEXT:
            return True
        frame = frame.f_back
    return False
