"""``open``: turn URLs (or :class:`~pipeflow.items.ObjectInfo` items) into readable streams.

Yields :class:`~pipeflow.items.Opened` ``(url, stream)`` items, or with ``read=True``
:class:`~pipeflow.items.Record` ``(name=url, data=bytes, url=url)`` items whose bodies were read
inside the worker. ``workers=N`` keeps N requests in flight on threads (results stay in input
order): with one object per sample, throughput is bound by request latency, not bandwidth, so
many requests in flight is what makes such datasets fast.

Stream ownership: the consumer (``untar``, a ``map``, user code) closes each stream it
receives. Streams opened ahead but never delivered (the pipeline stopped early), and streams
delivered but still open when this stage is closed, are closed by the stage.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Literal

from .._checks import check_bool
from ..backends._retry import RetryPolicy
from ..backends.base import Backend, scheme_of
from ..backends.registry import backend_class, preferred_backend_for_url
from ..executor.budget import RateBudget, check_rate, process_share
from ..items import Opened, Record
from ..stats import Stats
from ._backends import BackendsByScheme, url_of
from .base import Stage
from .map import WindowedOptions, WindowedStage

__all__ = ["OpenFn", "Opener", "default_backend"]


#: the backend ``open()`` uses when none is named (decided in the registry, for every caller)
default_backend = preferred_backend_for_url


#: ``open()``'s own options; the rest of its keywords are backend options
_OWN_OPTIONS = ("backend", "workers", "read", "on_error", "max_inflight", "request_rate")


class OpenFn:
    """The per-item work of :class:`Opener`: pick the backend, open (and maybe read) one object.

    Picklable and thread-safe (see :class:`~pipeflow.stages._backends.BackendsByScheme`).
    """

    def __init__(self, backend: str | Backend | None, read: bool, options: Mapping[str, Any]) -> None:
        self.read = read
        self.backends = BackendsByScheme(backend, options, what="open", choose=default_backend,
                                         stage_options=_OWN_OPTIONS)
        #: ``(stats, stage label)`` to count requests, bytes and retries into; set per run
        self.counts: tuple[Stats, str] | None = None
        #: this process's share of the job's request rate, when there is a budget; set per run
        self.budget: RateBudget | None = None

    def __getstate__(self) -> dict[str, Any]:
        # counters and the pace stay in the process that owns them
        return {**self.__dict__, "counts": None, "budget": None}

    def __call__(self, item: Any) -> Opened | Record:
        url = url_of(item, "open")
        scheme_of(url)  # InvalidURLError for non-strings early
        be = self.backends.for_url(url)
        counts, budget = self.counts, self.budget
        waited = budget.acquire() if budget is not None else 0.0
        if counts is None:
            return self._open(be, url)
        stats, label = counts
        if waited:
            stats.incr(label, "rate_wait_s", waited)
        pace = budget.retry_turn if budget is not None else None
        with stats.counting(label, pace):  # the backend's retries count here, and take turns
            result = self._open(be, url)
        stats.incr(label, "requests")
        if isinstance(result, Record):
            stats.incr(label, "bytes", len(result.data))
        return result

    def _open(self, be: Backend, url: str) -> Opened | Record:
        if self.read:
            return Record(name=url, data=be.read(url), url=url)
        return Opened(url, be.open(url))

    def close(self) -> None:
        budget, self.budget = self.budget, None  # a next run paces afresh
        if budget is not None:
            budget.close()  # a thread waiting for its slot leaves now
        self.backends.close()


def _size(result: Any) -> int:
    return len(result.data) if isinstance(result, Record) else 0


def _close_result(future: Any) -> None:
    if future.cancelled() or future.exception() is not None:
        return
    result = future.result()
    if isinstance(result, Opened):
        result.stream.close()


class Opener(WindowedStage):
    """Opens every URL of ``source`` with a storage backend.

    Args:
        source: yields URL strings (``s3://``, ``file://``, paths) or ``ObjectInfo`` items.
        backend: a backend name or instance; None chooses by URL scheme (:func:`default_backend`:
            ``s3://`` -> obstore, else boto3; paths and ``file://`` -> local; others -> fsspec).
        workers: requests in flight on threads (0: open inline; ``"auto"``, the default:
            tuned while running; per process, up to 64 requests at once for streams, and for
            ``read=True`` up to 32 at once with up to 128 objects and 256 MiB read ahead;
            streams start with the next object opened while one is read).
        read: read whole bodies and yield ``Record`` items instead of streams.
        on_error: ``"raise"`` or ``"skip"`` (skips are counted in ``stats()``).
        max_inflight: bound on opened-but-undelivered objects (default ``2 * workers``;
            ``"auto"`` tunes it).
        request_rate: requests per second for the whole job, split evenly among its
            processes (ranks x DataLoader workers); None: no budget.
        **options: backend options (need an explicit ``backend``).
    """

    def __init__(self, source: Stage[Any], backend: str | Backend | None = None, *,
                 workers: int | str = "auto", read: bool = False,
                 on_error: Literal["raise", "skip"] = "raise",
                 max_inflight: int | str | None = None, request_rate: float | None = None,
                 **options: Any) -> None:
        check_bool(read, "open(read=...)")
        self._request_rate = check_rate(request_rate, "open(request_rate=...)")
        self._share: float | None = None  # this process's requests per second, once started
        self._open_fn = OpenFn(backend, read, options)
        super().__init__(source, self._open_fn, WindowedOptions(
            what="open", workers=workers, method="thread", in_order=True, max_inflight=max_inflight,
            on_error=on_error, on_discard=_close_result, kind="io" if read else "stream",
            size_of=_size))
        self._handed_out: weakref.WeakSet[Any] = weakref.WeakSet()

    @staticmethod
    def explain_note(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
        """What ``explain()`` adds after the stage: the retry budget its requests run under
        (the backend's ``retry`` option, else the default policy), for backends that retry."""
        backend = args[0] if args else None
        if isinstance(backend, Backend):
            policy = getattr(backend.options, "retry", None)
        else:
            try:
                names = {f.name for f in fields(backend_class(backend).Options)} if backend else {"retry"}
            except Exception:  # an unknown name fails when the pipeline runs, with its own error
                return None
            policy = RetryPolicy.coerce(kwargs.get("retry", RetryPolicy())) if "retry" in names else None
        return f"retry: {policy.describe()}" if isinstance(policy, RetryPolicy) else None

    def start(self, state: dict[str, Any] | None) -> None:
        self._open_fn.counts = (self.context.stats, self.name)
        if self._request_rate is not None and self._open_fn.budget is None:
            # the job's rate, split over its processes: known here without asking the others
            self._share = process_share(self._request_rate, self.context.num_shards)
            self._open_fn.budget = RateBudget(self._share)
        super().start(state)
        budget, window = self._open_fn.budget, self.window
        if budget is not None and window is not None and window.tuner is not None:
            window.tuner.ceiling = budget.rate  # more in flight than the budget carries only wait

    def measure(self) -> dict[str, float]:
        numbers = super().measure()
        if self._share is not None:
            numbers["request_rate"] = self._share  # summed over processes: the job's budget
        return numbers

    def next(self) -> Any:
        value = super().next()
        if isinstance(value, Opened):
            try:
                self._handed_out.add(value.stream)
            except TypeError:  # a stream type without weakref support: the consumer closes it
                pass
        return value

    def close(self) -> None:
        super().close()
        for stream in list(getattr(self, "_handed_out", ())):
            if not stream.closed:
                stream.close()
        self._handed_out = weakref.WeakSet()
        self._open_fn.close()
