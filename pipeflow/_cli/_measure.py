"""The articles' empty training loop: iterate a DataLoader, time every N steps, report throughput
and the CPU used by this process and the processes it starts (DataLoader workers, s5cmd, ...)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeflow._cli._interrupt import DeferredInterrupt

__all__ = ["CpuMeter", "RunResult", "batch_len", "measure"]


@dataclass
class RunResult:
    """What one measured run produced.

    Attributes:
        steps: training steps (batches) taken.
        samples: samples seen.
        seconds: wall time of the whole run, including the first batch.
        first_batch_s: time to the first batch (start-up: workers, listing, first GETs).
        interval_times: wall time of every ``report_every`` steps, as the articles print them.
        cpu_percent: average CPU use of this process tree as a share of the whole machine
            (100 = every core busy), or None without psutil.
        epochs: epochs started.
    """

    steps: int = 0
    samples: int = 0
    seconds: float = 0.0
    first_batch_s: float = 0.0
    interval_times: list[float] = field(default_factory=list)
    cpu_percent: float | None = None
    epochs: int = 0

    @property
    def mean(self) -> float | None:
        """Mean time per interval without the first (warm-up) one, as in the articles; None
        with fewer than 2 intervals."""
        times = self.interval_times[1:]
        return statistics.mean(times) if times else None

    @property
    def variance(self) -> float | None:
        """Variance of the time per interval without the first one; None with fewer than 3
        intervals (two after the warm-up one)."""
        times = self.interval_times[1:]
        return statistics.variance(times) if len(times) >= 2 else None

    @property
    def samples_per_s(self) -> float:
        """Samples per second over the whole run."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def batch_len(batch: Any) -> int:
    """The number of samples in a collated batch (dict of lists/tensors, list, or tensor)."""
    if isinstance(batch, dict):
        for value in batch.values():
            return batch_len(value)
        return 0
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    if isinstance(batch, (list, tuple)):
        return len(batch)
    return 1


class CpuMeter:
    """CPU seconds used by this process and its descendants since :meth:`start`.

    Processes that were already running when the meter started (a local S3 server started by
    ``pipeflow demo``, for instance) are left out, so the figure is the data loader's own cost.
    Without psutil every reading is None.
    """

    def __init__(self) -> None:
        try:
            import psutil
        except ImportError:
            self._proc = None
            return
        self._psutil = psutil
        self._proc = psutil.Process(os.getpid())
        self._excluded: set[int] = set()
        self._start_cpu = 0.0
        self._start_wall = 0.0

    def _descendant_cpu(self, proc: Any) -> float:
        total = 0.0
        for child in proc.children(recursive=True):
            if child.pid in self._excluded:
                continue
            try:
                t = child.cpu_times()
                total += t.user + t.system
            except self._psutil.Error:  # exited between listing and reading
                continue
        return total

    def _total(self, proc: Any) -> float:
        t = proc.cpu_times()
        # children_* hold the CPU of children already waited for (finished DataLoader workers)
        return t.user + t.system + t.children_user + t.children_system + self._descendant_cpu(proc)

    def start(self) -> None:
        proc = self._proc
        if proc is None:
            return
        self._excluded = {c.pid for c in proc.children(recursive=True)}
        self._start_cpu = self._total(proc)
        self._start_wall = time.perf_counter()

    def percent(self) -> float | None:
        """Average CPU use since :meth:`start` as a share of all cores (0-100)."""
        proc = self._proc
        if proc is None:
            return None
        wall = time.perf_counter() - self._start_wall
        cores = os.cpu_count() or 1
        return 100.0 * (self._total(proc) - self._start_cpu) / (wall * cores) if wall > 0 else 0.0


def measure(dataset: Any, *, batch_size: int | None = 4, num_workers: int = 0, epochs: int = 1,
            steps: int | None = None, report_every: int = 100,
            on_report: Callable[[int, float], None] | None = None,
            loader_kwargs: dict[str, Any] | None = None,
            on_batch: Callable[[int], None] | None = None) -> RunResult:
    """Run the empty training loop over ``dataset`` through a ``DataLoader``.

    Args:
        dataset: a :class:`~pipeflow.Pipeline` (or any dataset).
        batch_size: the DataLoader batch size; None when the pipeline batches itself.
        num_workers: DataLoader worker processes.
        epochs: passes over the data (``set_epoch`` is called before each).
        steps: stop after this many steps in total (None: run the epochs out).
        report_every: steps per timed interval (the articles use 100).
        on_report: called with ``(step, seconds)`` after every interval.
        loader_kwargs: more DataLoader arguments.
        on_batch: called with the number of samples of every batch (a progress bar).
    """
    with DeferredInterrupt() as interrupt:
        return _measure(dataset, batch_size, num_workers, epochs, steps, report_every, on_report,
                        loader_kwargs, on_batch, interrupt)


def _measure(dataset: Any, batch_size: int | None, num_workers: int, epochs: int, steps: int | None,
             report_every: int, on_report: Callable[[int, float], None] | None,
             loader_kwargs: dict[str, Any] | None, on_batch: Callable[[int], None] | None,
             interrupt: DeferredInterrupt) -> RunResult:
    import torch.utils.data

    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                                         **(loader_kwargs or {}))
    result = RunResult()
    meter = CpuMeter()
    meter.start()
    t_start = t0 = time.perf_counter()
    done = False
    for epoch in range(epochs):
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(epoch)
        result.epochs = epoch + 1
        batches = None
        try:
            with interrupt.held():  # the epoch's workers are forked: see _interrupt's docstring
                batches = iter(loader)
            for batch in batches:
                interrupt.check()  # Ctrl-C: here, where the DataLoader can end its workers cleanly
                result.steps += 1
                n = batch_len(batch)
                result.samples += n
                if on_batch is not None:
                    on_batch(n)
                if result.steps == 1:
                    result.first_batch_s = time.perf_counter() - t_start
                if result.steps % report_every == 0:
                    now = time.perf_counter()
                    result.interval_times.append(now - t0)
                    if on_report is not None:
                        on_report(result.steps, now - t0)
                    t0 = now
                if steps is not None and result.steps >= steps:
                    done = True
                    break
        finally:
            # the epoch's workers end here, before the next epoch forks its own, and on an
            # interrupt before it propagates (the traceback would keep this frame, and the
            # iterator with its workers, alive)
            batches = None
        if done:
            break
    interrupt.check()
    result.seconds = time.perf_counter() - t_start
    result.cpu_percent = meter.percent()
    return result
