"""``prefetch``: run the upstream stages in a background thread."""

from __future__ import annotations

import logging
import queue
from typing import Any

from .._checks import check_int_or_auto, is_int
from .._pump import Pump
from ..executor.autotune import BufferTuner
from ..executor.intraop import one_intraop_thread
from ..executor.pool import stop_grace_seconds
from .base import SOURCES_KEY, Stage

__all__ = ["Prefetcher"]

log = logging.getLogger("pipeflow")

#: how long close() waits for the background thread before giving up on it
JOIN_TIMEOUT = 10.0


class Prefetcher(Stage[Any]):
    """Pulls from ``source`` on a background thread into a queue of ``size`` items.

    The queue bound is the backpressure: the thread blocks when the consumer falls behind.
    Each queued item carries the source's state right after it was pulled, so this stage's
    state is exactly "after the last item delivered", whatever is still queued.
    Exceptions raised upstream are re-raised in the consumer with their original type.

    Args:
        source: the input stage.
        size: queue capacity (>= 1), or ``"auto"``: start at 2 and double (up to 64) while
            the consumer keeps finding the queue empty and the producer finds it full.
    """

    passes_items = True

    one_to_one = True
    pulls_in_background = True
    elastic_roles = frozenset({"to_drop_point", "after_drop_point"})

    def __init__(self, source: Stage[Any], size: int | str = 2) -> None:
        super().__init__(source)
        check_int_or_auto(size, "prefetch(size=...)", low=1)
        #: tunes the size across epochs of this stage ("auto")
        self._tuner: BufferTuner | None = None
        if is_int(size):
            self._size = size
        else:
            self._tuner = BufferTuner()
            self._size = self._tuner.value
        self._pump: Pump | None = None
        self._state: dict[str, Any] = {}
        self._finished = False  # the run ended (its end, or an upstream error, was delivered)

    def start(self, state: dict[str, Any] | None) -> None:
        if self._tuner is not None:
            self._size = self._tuner.value
        self._state = self.source.state_dict()
        self._finished = False
        self._pump = Pump(self._pull, maxsize=self._size,
                          name=f"pipeflow-prefetch-{self.name}").start()

    def _pull(self, pump: Pump) -> None:
        one_intraop_thread()  # its parallelism is the pipeline's, not torch's (see executor.intraop)
        source, tuner = self.source, self._tuner
        while not pump.stopped.is_set():
            try:
                item = next(source)
            except StopIteration:
                return
            if tuner is not None and pump.full():
                tuner.full()
            if not pump.put((self.prepare(item), source.state_dict())):
                return

    def prepare(self, item: Any) -> Any:
        """The item as queued, computed on the background thread (a subclass's per-item work
        overlapping the consumer: ``pin_memory``, ``to(device)``)."""
        return item

    def _get(self, pump: Pump) -> Any:
        tuner = self._tuner
        if tuner is None:
            return pump.get()
        try:
            value, waited = pump.get(timeout=0), False
        except queue.Empty:
            value, waited = pump.get(), True
        if tuner.got(waited):
            self._size = tuner.value
            pump.resize(self._size)
        return value

    def measure(self) -> dict[str, float]:
        numbers = super().measure()
        if self._tuner is not None:
            numbers["inflight"] = self._size
        return numbers

    def next(self) -> Any:
        pump = self._pump
        if pump is None or self._finished:
            raise StopIteration
        try:
            item, self._state = self._get(pump)
        except BaseException:
            # after the upstream error (or the end) was delivered the run is over: StopIteration
            self._finished = pump.ended
            raise
        return item

    def get_state(self) -> dict[str, Any]:
        return {SOURCES_KEY: [self._state]}

    def stop(self) -> None:
        pump, self._pump = self._pump, None
        if pump is None:
            return
        if self.context.interrupted:  # a worker ending on Ctrl-C: the daemon thread ends with it
            pump.stop()
        else:
            # after Ctrl-C in the main process: the shorter stop grace (the thread is a daemon)
            timeout = min(JOIN_TIMEOUT, stop_grace_seconds()) if self.context.stopping else JOIN_TIMEOUT
            if not pump.stop(join=timeout):
                log.warning("pipeflow: %s: background thread still busy after %gs; abandoning it",
                            self.name, timeout)

    def __del__(self) -> None:
        pump = getattr(self, "_pump", None)
        if pump is not None:
            pump.stopped.set()
