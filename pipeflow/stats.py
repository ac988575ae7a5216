"""Run statistics: what each stage of a pipeline did and where the time went.

:class:`Stats` collects, per stage label, counters (skips, retries, bytes, requests) and the
timings the stages measure themselves (items out, busy seconds, seconds waiting on the input,
seconds the output waited on the consumer). Inside DataLoader worker processes each process's
:class:`Stats` writes a small JSON snapshot now and then into a directory named by the
pipeline (:class:`StatsChannel`); the process that owns the pipeline sums them, so
``Pipeline.stats()`` in the main process sees the workers' numbers without any data crossing
twice. :class:`PipelineStats` is the summed view with a verdict: the stage that limits
throughput (or ``"consumer"``) and one line of advice.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from ._fs import pid_alive
from ._words import counted

__all__ = ["PipelineStats", "Stats", "StatsChannel", "merge_stages", "note", "take_turn"]

#: timing keys every stage reports
TIMING_KEYS = ("items", "busy_s", "wait_s", "blocked_s")
#: keys that describe a configuration, not an amount: the largest value wins within one
#: process (successive epochs), they add up across processes
#: (``actors``: the cluster workers whose numbers a stage under ``offload()`` sums)
_CONFIG_KEYS = ("workers", "lanes", "inflight", "latency_ms", "request_rate", "actors", "settle_s")
#: what a tuner decided, shown per process in the table's last column
_TUNED_KEYS = ("inflight", "latency_ms", "request_rate", "settle_s")
#: a tuner's decisions so far, counted over the life of its stage (not per epoch): within one
#: process the latest (largest) value wins, they add up across processes
_DECISION_KEYS = ("steps_up", "probes", "followed", "backoffs", "steady_errors", "slowdowns")
#: at most one snapshot file write per process this often
PUBLISH_EVERY_S = 0.5

_sink = threading.local()


def note(counter: str, n: float = 1) -> None:
    """Count ``counter`` for the stage whose work runs on this thread now (see
    :meth:`Stats.counting`); a no-op elsewhere. Backends call it for retries."""
    target = getattr(_sink, "target", None)
    if target is not None:
        target[0].incr(target[1], counter, n)


def take_turn(delay: float) -> None:
    """Before a retry that will wait ``delay`` seconds (its backoff): when the stage whose work
    runs on this thread paces its requests (a request-rate budget, see :meth:`Stats.counting`),
    wait further until the retry's turn under that budget, so that a retry counts against the
    budget like any request; the extra wait is counted as ``rate_wait_s``. A no-op elsewhere."""
    target = getattr(_sink, "target", None)
    if target is None or target[2] is None:
        return
    stats, stage, pace = target
    extra = pace(delay)
    if extra > 0.0:
        stats.incr(stage, "rate_wait_s", extra)


def merge_stages(into: dict[str, dict[str, float]], other: Mapping[str, Mapping[str, float]],
                 *, same_process: bool = False) -> dict[str, dict[str, float]]:
    """Add ``other``'s per-stage numbers to ``into`` (stage order: first seen first)."""
    for label, values in other.items():
        mine = into.setdefault(label, {})
        for key, value in values.items():
            if same_process and (key in _CONFIG_KEYS or key in _DECISION_KEYS):
                mine[key] = max(mine.get(key, 0), value)
            else:
                mine[key] = mine.get(key, 0) + value
    return into


class Stats:
    """Thread-safe counters and stage timings of one process, keyed by stage label.

    Stages count what they skip, retry or drop so nothing is lost silently, and measure
    their own time; ``Pipeline.stats()`` returns a snapshot after (or during) an epoch.
    """

    def __init__(self, channel: StatsChannel | None = None) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], float] = {}
        self._finished: dict[str, dict[str, float]] = {}
        self._live: dict[int, weakref.WeakMethod[Callable[[], dict[str, dict[str, float]]]]] = {}
        self.pid = os.getpid()
        #: where this process publishes its snapshot (a DataLoader worker), else None
        self.channel = channel
        self._file = f"{self.pid}-{uuid.uuid4().hex[:8]}.json"
        self._publisher: threading.Thread | None = None
        self._publish_lock = threading.Lock()

    # ---- recording -------------------------------------------------------------------------
    def incr(self, stage: str, counter: str, n: float = 1) -> None:
        """Add ``n`` to ``counter`` of ``stage`` (thread-safe)."""
        with self._lock:
            self._counts[(stage, counter)] = self._counts.get((stage, counter), 0) + n

    def count(self, stage: str, counter: str) -> float:
        """The value of one counter of ``stage`` in this process (0 when never counted)."""
        with self._lock:
            return self._counts.get((stage, counter), 0)

    def counting(self, stage: str, pace: Callable[[float], float] | None = None) -> _Counting:
        """A context in which :func:`note` counts into ``stage`` (on this thread), and
        :func:`take_turn` calls ``pace(delay)``: it waits for a retry's turn beyond its backoff
        of ``delay`` seconds, returning the seconds it waited."""
        return _Counting(self, stage, pace)

    def attach(self, key: int, measure: Callable[[], dict[str, dict[str, float]]]) -> None:
        """A running graph: ``measure()`` (a bound method, held weakly so the graph can still
        be garbage collected) returns its stages' timings, read on every snapshot."""
        with self._lock:
            self._live[key] = weakref.WeakMethod(measure)
            publisher = None
            if self.channel is not None and self._publisher is None:
                publisher = self._publisher = threading.Thread(
                    target=_publish_loop, args=(weakref.ref(self),), name="pipeflow-stats", daemon=True)
        if publisher is not None:
            publisher.start()

    def detach(self, key: int, final: dict[str, dict[str, float]]) -> None:
        """The graph stopped with ``final`` timings: they are kept, the graph is not read again."""
        with self._lock:
            if self._live.pop(key, None) is not None:
                merge_stages(self._finished, final, same_process=True)

    # ---- reading ---------------------------------------------------------------------------
    def snapshot(self) -> dict[str, dict[str, float]]:
        """``{stage: {counter or timing: value}}`` of this process, stages in pipeline order."""
        with self._lock:
            live = [ref() for ref in self._live.values()]
            out: dict[str, dict[str, float]] = {k: dict(v) for k, v in self._finished.items()}
            counts = sorted(self._counts.items())
        for measure in live:
            if measure is not None:
                merge_stages(out, measure(), same_process=True)
        for (stage, counter), value in counts:
            out.setdefault(stage, {})[counter] = value
        return out

    # ---- publishing (DataLoader workers) ---------------------------------------------------
    def publish(self) -> None:
        """Write this process's snapshot to the channel (atomically); never raises."""
        if self.channel is None:
            return
        with self._publish_lock:  # the periodic thread and the end of an epoch
            self.channel.write(self._file, {"pid": self.pid, "stages": self.snapshot()})


def _publish_loop(ref: weakref.ref[Stats]) -> None:
    # a thread, not a check in the item loop: a worker blocked on a slow consumer still
    # publishes, and iterating pays nothing for it
    while True:
        time.sleep(PUBLISH_EVERY_S)
        stats = ref()
        if stats is None:
            return
        stats.publish()
        del stats


class _Counting:
    __slots__ = ("previous", "target")

    def __init__(self, stats: Stats, stage: str, pace: Callable[[float], float] | None) -> None:
        self.target = (stats, stage, pace)
        self.previous: Any = None

    def __enter__(self) -> None:
        self.previous = getattr(_sink, "target", None)
        _sink.target = self.target

    def __exit__(self, *exc: Any) -> None:
        _sink.target = self.previous


# ---- the side channel -----------------------------------------------------------------------------
def _base_dir() -> str:
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return tempfile.gettempdir()


_PREFIX = "pipeflow-stats-"


class StatsChannel:
    """A directory named by a token (the owner's pid and a random part) where the processes
    iterating a pipeline publish their snapshots, one small JSON file each, replaced
    atomically. Only the owner creates, reads and removes it: it is created when the
    pipeline is about to leave the owner's process (pickled, or before a fork), and a writer
    never creates it, so a worker that publishes after the owner removed it (its last
    snapshot, racing the owner's garbage collection) leaves nothing behind.

    Picklable (it is a name), so it travels into DataLoader workers with the pipeline under
    every start method, and is inherited by forked ones.
    """

    __slots__ = ("__weakref__", "owner", "path")

    def __init__(self, owner: int | None = None, path: str | None = None) -> None:
        self.owner = os.getpid() if owner is None else owner
        self.path = path or os.path.join(_base_dir(), f"{_PREFIX}{self.owner}-{uuid.uuid4().hex[:12]}")

    def __getstate__(self) -> tuple[int, str]:
        return self.owner, self.path

    def __setstate__(self, state: tuple[int, str]) -> None:
        self.owner, self.path = state

    @property
    def is_owner(self) -> bool:
        return os.getpid() == self.owner

    def create(self) -> None:
        """Make the directory (owner only; once per channel), sweeping dead owners' first."""
        if not self.is_owner or os.path.isdir(self.path):
            return
        # no lock: this runs in a before-fork hook, and making the directory is idempotent
        try:
            if _swept[0] != os.getpid():
                _swept[0] = os.getpid()
                sweep_stale(os.path.dirname(self.path))
            os.makedirs(self.path, exist_ok=True)
        except OSError:  # statistics must never break a training run
            return
        _created.add(self)

    def write(self, name: str, payload: dict[str, Any]) -> None:
        try:
            if not os.path.isdir(self.path) or not pid_alive(self.owner):
                return  # removed by its owner, or nobody will read it: do not recreate it
            tmp = os.path.join(self.path, f".{name}.tmp")
            with open(tmp, "w") as f:
                json.dump(payload, f)
            os.replace(tmp, os.path.join(self.path, name))
        except OSError:  # statistics must never break a training run
            pass

    def read(self) -> Iterator[dict[str, Any]]:
        """Every published snapshot (files being replaced are read whole or not at all)."""
        try:
            names = os.listdir(self.path)
        except OSError:
            return
        for name in sorted(names):
            if name.startswith(".") or not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(self.path, name)) as f:
                    yield json.load(f)
            except (OSError, ValueError):
                continue

    def remove(self) -> None:
        """Delete the directory (owner only: a forked child must not remove it)."""
        if self.is_owner:
            shutil.rmtree(self.path, ignore_errors=True)


#: channels of pipelines alive in this process, made ready before each fork
_live: weakref.WeakSet[StatsChannel] = weakref.WeakSet()
_created: weakref.WeakSet[StatsChannel] = weakref.WeakSet()
_swept = [0]  # the pid that swept stale channels last


def track_channel(channel: StatsChannel) -> None:
    """Have ``channel``'s directory made before this process forks (a DataLoader worker
    forked from here publishes into it)."""
    _live.add(channel)


def _before_fork() -> None:
    for channel in list(_live):
        if channel not in _created:
            channel.create()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork)


def remove_channel(channel: StatsChannel) -> None:
    """Finaliser of a pipeline: removes its channel directory."""
    channel.remove()


def sweep_stale(base: str | None = None) -> list[str]:
    """Remove the channel directories whose owner process is gone; returns their paths."""
    base = base or _base_dir()
    removed: list[str] = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(_PREFIX):
            continue
        try:
            owner = int(name[len(_PREFIX):].split("-", 1)[0])
        except ValueError:
            continue
        if owner != os.getpid() and not pid_alive(owner):
            path = os.path.join(base, name)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


# ---- the summed view and its verdict -----------------------------------------------------------
_IO_KINDS = ("open", "cache", "fetch_batch")
_CPU_KINDS = ("map", "decode")
_STREAM_KINDS = ("untar", "read_tfrecord")


def _kind(label: str) -> str:
    return label.split("#", 1)[0]


class PipelineStats(Mapping[str, dict[str, float]]):
    """Per-stage statistics summed over processes (and ranks), with a verdict.

    ``stats[label]`` holds at least ``items`` (delivered), ``busy_s`` (time in the stage's own
    work, summed over its workers), ``wait_s`` (time waiting on its input) and ``blocked_s``
    (time its output waited on its consumer), plus the stage's counters (``skipped``,
    ``retries``, ``requests``, ``bytes``, ...) and ``workers`` where the stage has workers.

    Attributes:
        processes: how many processes' numbers are summed.
        names: what each stage is, by label (``map#2(decode_fn)``): the table, the verdict
            line and the advice show these; stages without one show their label.
        bottleneck: the label of the stage that limits throughput, ``"consumer"`` when the
            pipeline is faster than the code consuming it, or None before any item.
        advice: one line on what to change.
    """

    def __init__(self, stages: Mapping[str, Mapping[str, float]], processes: int = 1, *,
                 names: Mapping[str, str] | None = None) -> None:
        self._stages = {k: dict(v) for k, v in stages.items()}
        self.processes = max(1, processes)
        self.names = dict(names or {})
        self.bottleneck, self.advice = self._verdict()

    def name(self, label: str) -> str:
        """What the stage ``label`` is (``map#2(decode_fn)``), or the label itself."""
        return self.names.get(label, label)

    def __getitem__(self, label: str) -> dict[str, float]:
        return self._stages[label]

    def __iter__(self) -> Iterator[str]:
        return iter(self._stages)

    def __len__(self) -> int:
        return len(self._stages)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def combine(cls, parts: Iterable[tuple[Mapping[str, Mapping[str, float]], int]], *,
                names: Mapping[str, str] | None = None) -> PipelineStats:
        """Sum ``(stages, processes)`` parts (workers, ranks) into one view."""
        stages: dict[str, dict[str, float]] = {}
        processes = 0
        for part, n in parts:
            if part:
                merge_stages(stages, part)
                processes += n
        return cls(stages, processes, names=names)

    def counters(self, label: str) -> dict[str, float]:
        """A stage's counters (skips, retries, ...) without its timings and configuration."""
        return {k: v for k, v in self._stages[label].items()
                if k not in TIMING_KEYS and k not in _CONFIG_KEYS}

    # ---- verdict ------------------------------------------------------------------------------
    @property
    def consumer_s(self) -> float:
        """Seconds (per process) the pipeline's output waited on the code consuming it."""
        timed = [v for v in self._stages.values() if "blocked_s" in v]
        return timed[-1]["blocked_s"] / self.processes if timed else 0.0

    def load(self, label: str) -> float:
        """Busy seconds per lane of work (a worker, or the loader's thread) of one stage."""
        values = self._stages[label]
        return values.get("busy_s", 0.0) / max(1.0, values.get("lanes", self.processes))

    def _verdict(self) -> tuple[str | None, str]:
        timed = [k for k, v in self._stages.items() if "busy_s" in v]
        if not timed or not any(self._stages[k].get("items") for k in timed):
            return None, "no items measured yet"
        worst = max(timed, key=self.load)
        if self.consumer_s >= self.load(worst):
            return "consumer", ("nothing to do: the pipeline is faster than the code consuming it "
                                "(the training step)")
        return worst, self._advice(worst)

    def _advice(self, key: str) -> str:
        values, kind, label = self._stages[key], _kind(key), self.name(key)
        workers = int(round(values.get("workers", 0) / self.processes))
        if values.get("actors"):
            return self._cluster_advice(label, kind, int(round(values["actors"] / self.processes)))
        if values.get("rate_wait_s", 0.0) > 0.5 * values.get("busy_s", 0.0) and kind in _IO_KINDS:
            rate = values.get("request_rate", 0.0)
            return (f"the request-rate budget paces {label}: its requests waited "
                    f"{values['rate_wait_s']:.1f} s for their turn (open(request_rate={rate:g}) for the "
                    f"job); raise it if the store allows more requests per second for this prefix")
        if values.get("backoffs") and kind in _IO_KINDS:
            return (f"the store pushed back: {label} had {counted(int(values.get('retries', 0)), 'request')} "
                    f"retried (503 SlowDown, throttling, errors) and its tuner lowered the requests in "
                    f"flight {counted(int(values['backoffs']), 'time')}; the store's request rate is the "
                    f"limit: "
                    f"spread the data over more prefixes, or ask for a higher rate")
        if "inflight" in values and kind in _IO_KINDS + _CPU_KINDS:
            return self._tuned_advice(label, kind, workers, int(round(values["inflight"] / self.processes)))
        if kind in _IO_KINDS:
            more = max(8, 2 * workers)
            return (f"more requests in flight: {kind}(workers={more}) (now {workers}); each "
                    f"request waits on latency, not on the CPU")
        if kind in _CPU_KINDS:
            more = max(2, 2 * workers)
            return (f"more workers for {label}: {kind}(workers={more}) (now {workers}), "
                    f"method='process' if it holds the GIL, or more DataLoader workers")
        if kind in _STREAM_KINDS:
            return (f"{label} reads its streams as it parses them: a bigger read size (the "
                    f"backend's part/buffer size) or more DataLoader workers to read shards in parallel")
        return (f"{label} runs in the loader's thread: more DataLoader workers, or move its "
                f"work into a map(workers=N)")

    @staticmethod
    def _cluster_advice(label: str, kind: str, actors: int) -> str:
        # a stage on the cluster: the training process cannot help it, the cluster can
        inside = (f", or more workers inside each ({kind}(workers=N) with offload(cpus=N))"
                  if kind in _IO_KINDS + _CPU_KINDS else "")
        return (f"{label} runs on the cluster and limits the pipeline: more cluster workers per "
                f"rank (offload(workers={max(2, 2 * actors)}), now {actors}) if the cluster has "
                f"free CPUs{inside}")

    @staticmethod
    def _tuned_advice(label: str, kind: str, workers: int, inflight: int) -> str:
        # a tuned stage already tried more and found no gain: the limit is elsewhere
        if kind in _IO_KINDS:
            return (f"more requests in flight did not deliver more: {label} tunes itself "
                    f"(workers='auto', now {inflight} in flight); the storage or this process's CPU "
                    f"is the limit: more DataLoader workers spread the requests over more cores")
        return (f"more workers for {label} need more cores: it tunes itself (workers='auto', now "
                f"{workers}) within this process's share of the cores; more DataLoader workers on a "
                f"machine with more cores, or method='process' if it holds the GIL")

    # ---- display ------------------------------------------------------------------------------
    def table(self) -> str:
        width = max([18, *(len(self.name(k)) for k in self._stages)])
        head = (f"{'stage':<{width}} {'items':>9} {'busy s':>9} {'wait s':>9} {'blocked s':>9} "
                f"{'workers':>7}  other")
        lines = [head]
        for label, v in self._stages.items():
            other = ", ".join([*(f"{k}={_fmt(n)}" for k, n in v.items()
                                 if k not in TIMING_KEYS and k not in _CONFIG_KEYS),
                               *self._tuned(v)])
            workers = v.get("workers")
            lines.append(f"{self.name(label):<{width}} {int(v.get('items', 0)):>9} "
                         f"{v.get('busy_s', 0):>9.2f} "
                         f"{v.get('wait_s', 0):>9.2f} {v.get('blocked_s', 0):>9.2f} "
                         f"{'-' if workers is None else int(workers):>7}  {other}".rstrip())
        return "\n".join(lines)

    def _tuned(self, values: Mapping[str, float]) -> list[str]:
        """A tuned stage's decisions per process (``inflight=12/process``)."""
        n = self.processes
        return [f"{k}={_fmt(round(values[k] / n, 3 if k == 'latency_ms' else 1))}"
                + ("/process" if n > 1 else "") for k in _TUNED_KEYS if k in values]

    def __str__(self) -> str:
        shown = "summed over " + (f"{self.processes} processes" if self.processes > 1 else "1 process")
        verdict = f"bottleneck: {self.name(self.bottleneck)}" if self.bottleneck else "bottleneck: unknown"
        return f"{self.table()}\n({shown})\n{verdict}\nadvice: {self.advice}"

    def __repr__(self) -> str:
        return f"PipelineStats({self._stages!r}, processes={self.processes}, names={self.names!r})"

    def as_dict(self) -> dict[str, dict[str, float]]:
        return {k: dict(v) for k, v in self._stages.items()}


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.3g}"
