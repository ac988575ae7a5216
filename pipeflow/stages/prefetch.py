"""``prefetch``: run the upstream stages in a background thread."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from .._checks import check_int_or_auto
from ..executor.autotune import AUTO, BufferTuner
from ..executor.intraop import one_intraop_thread
from .base import SOURCES_KEY, Stage

__all__ = ["Prefetcher"]

log = logging.getLogger("pipeflow")

#: seconds between checks of the stop flag while blocked on the queue
_POLL = 0.1
#: how long close() waits for the background thread before giving up on it
JOIN_TIMEOUT = 10.0

_END = object()


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


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

    one_to_one = True
    pulls_in_background = True
    elastic_roles = frozenset({"to_drop_point", "after_drop_point"})

    def __init__(self, source: Stage[Any], size: int | str = 2) -> None:
        super().__init__(source)
        check_int_or_auto(size, "prefetch(size=...)", low=1)
        #: tunes the size across epochs of this stage
        self._tuner = BufferTuner() if size == AUTO else None
        self._size = self._tuner.value if self._tuner is not None else size
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._queue: queue.Queue[Any] = queue.Queue(size)
        self._state: dict[str, Any] = {}
        self._finished = False

    def start(self, state: dict[str, Any] | None) -> None:
        if self._tuner is not None:
            self._size = self._tuner.value
        self._state = self.source.state_dict()
        self._finished = False
        self._stop = threading.Event()
        self._queue = queue.Queue(self._size)
        self._thread = threading.Thread(target=self._run, args=(self._stop, self._queue),
                                        name=f"pipeflow-prefetch-{self.name}", daemon=True)
        self._thread.start()

    def _run(self, stop: threading.Event, out: queue.Queue[Any]) -> None:
        one_intraop_thread()  # its parallelism is the pipeline's, not torch's (see executor.intraop)
        source = self.source
        try:
            while not stop.is_set():
                try:
                    item = next(source)
                except StopIteration:
                    self._put(stop, out, _END)
                    return
                self._put(stop, out, (self.prepare(item), source.state_dict()))
        except BaseException as exc:  # handed to the consumer, never lost
            self._put(stop, out, _Failure(exc))

    def prepare(self, item: Any) -> Any:
        """The item as queued, computed on the background thread (a subclass's per-item work
        overlapping the consumer: ``pin_memory``, ``to(device)``)."""
        return item

    def _put(self, stop: threading.Event, out: queue.Queue[Any], value: Any) -> None:
        tuner = self._tuner
        if tuner is not None and out.full():
            tuner.full()
        while not stop.is_set():
            try:
                out.put(value, timeout=_POLL)
                return
            except queue.Full:
                continue

    def _get(self) -> Any:
        tuner = self._tuner
        if tuner is not None:
            try:
                value = self._queue.get_nowait()
                waited = False
            except queue.Empty:
                value, waited = self._wait(), True
            if tuner.got(waited):
                self._resize(tuner.value)
            return value
        return self._wait()

    def _resize(self, size: int) -> None:
        out = self._queue
        with out.mutex:  # a blocked put() waits on not_full: wake it for the new room
            out.maxsize = self._size = size
            out.not_full.notify_all()

    def measure(self) -> dict[str, float]:
        numbers = super().measure()
        if self._tuner is not None:
            numbers["inflight"] = self._size
        return numbers

    def next(self) -> Any:
        if self._finished:
            raise StopIteration
        value = self._get()
        if value is _END:
            self._finished = True
            raise StopIteration
        if isinstance(value, _Failure):
            self._finished = True
            raise value.exc
        item, self._state = value
        return item

    def _wait(self) -> Any:
        while True:
            try:
                return self._queue.get(timeout=_POLL)
            except queue.Empty:
                thread = self._thread
                if thread is None or not thread.is_alive():
                    if self._queue.empty():
                        raise RuntimeError(f"{self.name}: the prefetch thread stopped unexpectedly") from None

    def get_state(self) -> dict[str, Any]:
        return {SOURCES_KEY: [self._state]}

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        deadline = time.monotonic() + JOIN_TIMEOUT
        while thread.is_alive() and time.monotonic() < deadline:
            try:  # drain so a blocked put() returns promptly
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            thread.join(_POLL)
        if thread.is_alive():
            log.warning("pipeflow: %s: background thread still busy after %.0fs; abandoning it",
                        self.name, JOIN_TIMEOUT)

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
