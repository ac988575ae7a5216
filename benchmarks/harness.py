"""Runs one benchmark case in a fresh child process and measures it from the outside.

Every case (pipeflow or a peer, one configuration) runs in its own interpreter, so imports,
memory and worker processes of one case never affect the next. The parent samples the child's
whole process tree with psutil (CPU time, RSS, and PSS, which counts memory shared by forked
DataLoader workers once) only between the child's ``START`` and ``END`` markers; the child
reports samples, times and the request counts it reads from the delay proxy.

A case's factory is ``"module:function"``; ``function(**kwargs)`` returns an iterable of
batches, or ``(iterable, count)`` where ``count(batch)`` is the number of samples in a batch.

    python -m benchmarks.harness '<case as JSON>'      # the child side
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROXY_ENV = "PIPEFLOW_BENCH_PROXY"


@dataclass
class Case:
    """One measurement.

    Attributes:
        scenario: ``"s1"`` ... ``"s5"``.
        group: the comparison group inside the scenario (same data, same latency), e.g.
            ``"png pairs, T=20 ms"``; ratios are computed within a group.
        library: what is measured (``"pipeflow"``, ``"boto3 map-style"``, ...).
        factory: ``"module:function"`` building the iterable of batches.
        kwargs: arguments of the factory (JSON-serialisable).
        workers: DataLoader workers (or worker threads/processes), for the tables.
        bytes_per_sample: stored bytes of one sample, for MB/s.
        max_samples: stop an epoch after this many samples (once ``min_seconds`` have passed).
        max_seconds: stop an epoch after this long, whatever the minimums.
        min_samples: keep going (another pass over the data) until at least this many samples...
        min_seconds: ...and at least this long, so a small data set still shows steady state.
        epochs: epochs to run (each is measured separately).
        python: the interpreter (another venv for the DataPipes peer).
        env: extra environment variables.
        extra: free-form labels copied into the result (shard size, decode, ...).
    """

    scenario: str
    group: str
    library: str
    factory: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    workers: int = 0
    bytes_per_sample: float = 0.0
    max_samples: int = 10**9
    max_seconds: float = 30.0
    min_samples: int = 0
    min_seconds: float = 0.0
    epochs: int = 1
    python: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


# ---- child side ---------------------------------------------------------------------------------
def count_batch(batch: Any) -> int:
    """Samples in a batch: a collated dict / tuple of columns, a list of samples or a tensor."""
    if isinstance(batch, dict):
        return count_batch(next(iter(batch.values()))) if batch else 0
    if isinstance(batch, tuple):
        return count_batch(batch[0]) if batch else 0
    if isinstance(batch, list):
        return len(batch)
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    return 1


def _proxy_stats() -> dict[str, Any]:
    url = os.environ.get(PROXY_ENV)
    if not url:
        return {}
    with urllib.request.urlopen(url + "/__proxy__/stats", timeout=10) as resp:
        return json.loads(resp.read())


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, int]:
    if not after:
        return {}
    a, b = after.get("requests", {}), before.get("requests", {})
    out = {m: a.get(m, 0) - b.get(m, 0) for m in set(a) | set(b)}
    out["LIST"] = after.get("lists", 0) - before.get("lists", 0)
    out["GET_OBJECT"] = out.get("GET", 0) - out["LIST"]
    return {k: v for k, v in sorted(out.items()) if v}


def _load(factory: str) -> Callable[..., Any]:
    module, _, name = factory.partition(":")
    return getattr(importlib.import_module(module), name)


def _one_epoch(case: Case, iterable: Any, count: Callable[[Any], int]) -> dict[str, Any]:
    """Iterate until the data ends and the minimums are met, or a maximum is reached.

    A pass that ends before ``min_samples``/``min_seconds`` is followed by another pass over the
    same iterable (a new iterator: DataLoader workers start again, and that is counted).
    """
    t0 = time.perf_counter()
    n = first_n = passes = 0
    t_first = t_last = None
    done = False
    while not done:
        passes += 1
        it = iter(iterable)
        got = 0
        for batch in it:
            now = time.perf_counter()
            got += 1
            n += count(batch)
            if t_first is None:
                t_first, first_n = now, n
            t_last = now
            elapsed = now - t0
            if elapsed >= case.max_seconds or (n >= case.max_samples and elapsed >= case.min_seconds):
                done = True
                break
        del it  # shut DataLoader workers down before the next pass or epoch
        elapsed = time.perf_counter() - t0
        if got == 0 or (n >= case.min_samples and elapsed >= case.min_seconds):
            done = True
    steady = (t_last - t_first) if t_first is not None and t_last is not None else 0.0
    total = (t_last - t0) if t_last is not None else time.perf_counter() - t0
    return {
        "samples": n, "seconds": round(total, 4), "passes": passes,
        "first_batch_s": round(t_first - t0, 4) if t_first is not None else None,
        # the whole epoch, start-up included (it is also reported alone as first_batch_s)
        "samples_per_s": round(n / total, 2) if total > 0 else 0.0,
        "steady_samples_per_s": round((n - first_n) / steady, 2) if steady > 0 else None,
    }


def child_main(spec: dict[str, Any]) -> None:
    case = Case(**spec)
    made = _load(case.factory)(**case.kwargs)
    iterable, count = (made if isinstance(made, tuple) else (made, count_batch))
    epochs = []
    print("START", flush=True)
    for epoch in range(case.epochs):
        if hasattr(iterable, "set_epoch"):
            iterable.set_epoch(epoch)
        before = _proxy_stats()
        measured = _one_epoch(case, iterable, count)
        after = _proxy_stats()
        epochs.append({"epoch": epoch, **measured, "requests": _delta(after, before)})
    print("END", flush=True)
    print("RESULT " + json.dumps({"epochs": epochs}), flush=True)
    _close(iterable)


def _close(obj: Any) -> None:
    closer = getattr(obj, "close", None)
    if callable(closer):
        try:
            closer()
        except Exception:
            pass


# ---- parent side --------------------------------------------------------------------------------
def _pss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _tree(root: Any) -> list[Any]:
    """``root`` and every process below it (empty once ``root`` is gone)."""
    import psutil

    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _tree_cpu_s(root: Any) -> float:
    """User + system seconds of the live tree under ``root`` and of every child its processes
    reaped (the kernel adds a reaped child's time to its parent's children times)."""
    import psutil

    total = 0.0
    for p in _tree(root):
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class _Monitor:
    """CPU time and memory of a process tree while a window is open.

    CPU is read at the window's two ends as the tree's total: each live process's own time
    plus the time of the children it has reaped (the kernel adds a child's time, and that of
    its own reaped children, to its parent when the parent waits for it). So a process that
    starts and ends between two samples (a pool worker, a DataLoader worker at the end of a
    pass, an ``s5cmd`` child) is counted whole, and one that ends after the window opened is
    counted up to its last instruction, not to the last sample. Memory is sampled.
    """

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        import psutil

        self.psutil = psutil
        self.root = psutil.Process(pid)
        self.interval = interval
        self.active = False
        self.cpu_s = 0.0
        self.window_s = 0.0
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_procs = 0
        self.seen: dict[int, Any] = {}
        self._cpu_open = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._t_open = 0.0

    def start(self) -> None:
        self._thread.start()

    def open(self) -> None:
        self._sample(count=False)
        self._cpu_open = self.tree_cpu_s()
        self._t_open = time.perf_counter()
        self.active = True

    def close(self) -> None:
        if self.active:
            self._sample(count=True)
            self.window_s = time.perf_counter() - self._t_open
            self.cpu_s = max(0.0, self.tree_cpu_s() - self._cpu_open)
        self.active = False

    def tree_cpu_s(self) -> float:
        """User + system seconds of the live tree and of every child its processes reaped."""
        return _tree_cpu_s(self.root)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def procs(self) -> list[Any]:
        return _tree(self.root)

    def _sample(self, count: bool, pss: bool = False) -> None:
        rss = pss_total = 0
        procs = self.procs()
        for p in procs:
            try:
                rss += p.memory_info().rss
                self.seen[p.pid] = p
                if pss:
                    pss_total += (_pss_kb(p.pid) or 0) * 1024
            except self.psutil.Error:
                continue
        if count:
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_pss = max(self.peak_pss, pss_total)
            self.peak_procs = max(self.peak_procs, len(procs))

    def _loop(self) -> None:
        tick = 0
        while not self._stop.wait(self.interval):
            if self.active:
                tick += 1
                self._sample(count=True, pss=tick % 5 == 1)


class _Others:
    """CPU time of processes outside the case (the server, the proxy) over the same window:
    on a small machine they share the cores with the client, which bounds what it can reach."""

    def __init__(self, pids: dict[str, int]) -> None:
        import psutil

        self.procs = {}
        for name, pid in pids.items():
            try:
                self.procs[name] = psutil.Process(pid)
            except psutil.Error:
                continue
        self.start: dict[str, float] = {}
        self.used: dict[str, float] = {}
        self.t0 = 0.0
        self.window_s = 0.0

    def open(self) -> None:
        self.start = {name: _tree_cpu_s(p) for name, p in self.procs.items()}
        self.t0 = time.perf_counter()

    def close(self) -> None:
        if self.start and not self.window_s:
            self.window_s = time.perf_counter() - self.t0
            self.used = {name: _tree_cpu_s(p) - self.start[name] for name, p in self.procs.items()}

    def percent(self) -> dict[str, float]:
        if not self.window_s:
            return {}
        return {name: round(100.0 * used / self.window_s, 1) for name, used in self.used.items()}


def child_path(pipeflow_from: str | None, pythonpath: str | None) -> tuple[str, str]:
    """A child's ``PYTHONPATH`` and working directory. ``pipeflow_from``: a directory whose
    packages the child imports before this tree's; to measure another checkout's ``pipeflow``
    with this tree's benchmark code, one holding only a link to that checkout's ``pipeflow``
    (a whole checkout would bring its own ``benchmarks`` too). The child runs there, since
    ``-m`` puts the working directory first on the path."""
    first = [pipeflow_from] if pipeflow_from else []
    return os.pathsep.join(filter(None, [*first, str(ROOT), pythonpath])), pipeflow_from or str(ROOT)


def run_case(case: Case, *, proxy_url: str | None = None, env: dict[str, str] | None = None,
             timeout: float | None = None, log: Callable[[str], None] = print,
             others: dict[str, int] | None = None, pipeflow_from: str | None = None) -> dict[str, Any]:
    """Run ``case`` in a child process; returns its result row (``error`` set if it failed).
    ``others`` names processes (the server, the proxy) whose CPU over the case's window goes
    into the row as ``others_cpu_pct``; ``pipeflow_from``: see :func:`child_path`."""
    child_env = dict(os.environ)
    child_env.update(env or {})
    child_env.update(case.env)
    child_env["PYTHONPATH"], cwd = child_path(pipeflow_from, child_env.get("PYTHONPATH"))
    child_env.setdefault("PYTHONWARNINGS", "ignore")
    if proxy_url:
        child_env[PROXY_ENV] = proxy_url
    python = case.python or sys.executable
    spec = json.dumps(dataclasses.asdict(case))
    row: dict[str, Any] = {
        "scenario": case.scenario, "group": case.group, "library": case.library, "workers": case.workers,
        **case.extra,
    }
    timeout = timeout or (case.max_seconds * case.epochs + 180)
    from pipeflow.testing.s3server import death_signal_hook

    # the case ends with this process however it ends: a runner killed (SIGTERM, SIGKILL) runs
    # no finally, and its case went on waiting for a server that was gone
    proc = subprocess.Popen([python, "-m", "benchmarks.harness", spec], cwd=cwd, env=child_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=death_signal_hook())
    monitor = _Monitor(proc.pid)
    outside = _Others(others or {})
    monitor.start()
    result: dict[str, Any] = {}
    stderr: list[str] = []
    err_thread = threading.Thread(target=lambda: stderr.extend(proc.stderr or []), daemon=True)
    err_thread.start()
    deadline = time.monotonic() + timeout
    timer = threading.Timer(timeout, lambda: _kill_tree(monitor, proc))
    timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line == "START":
                monitor.open()
                outside.open()
            elif line == "END":
                monitor.close()
                outside.close()
            elif line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
        proc.wait()
    finally:
        timer.cancel()
        monitor.close()
        monitor.stop()
        _kill_tree(monitor, proc)  # leftovers (a peer's background s5cmd, say)
        err_thread.join(timeout=5)
    if not result:
        why = "timed out" if time.monotonic() >= deadline else f"exit code {proc.returncode}"
        row["error"] = f"{why}: " + "".join(stderr)[-3000:].strip()
        log(f"  ! {case.library} ({case.group}): {row['error'][-1200:]}")
        return row
    epochs = result["epochs"]
    first = epochs[0]
    row.update({
        "samples": first["samples"],
        "samples_per_s": first["samples_per_s"],
        "steady_samples_per_s": first["steady_samples_per_s"],
        "mb_per_s": round(first["samples_per_s"] * case.bytes_per_sample / 1e6, 2),
        "first_batch_s": first["first_batch_s"],
        "cpu_pct": round(100.0 * monitor.cpu_s / monitor.window_s, 1) if monitor.window_s else None,
        "cpu_s_per_sample": round(monitor.cpu_s / _all_samples(epochs), 6) if _all_samples(epochs) else None,
        "passes": first.get("passes", 1),
        "peak_rss_mb": round(monitor.peak_rss / 2**20, 1),
        "peak_pss_mb": round(monitor.peak_pss / 2**20, 1) if monitor.peak_pss else None,
        "processes": monitor.peak_procs,
        "others_cpu_pct": outside.percent(),
        "requests": first["requests"],
        "epochs": epochs,
    })
    log(f"  {case.library:<34} {case.group:<28} {row['samples_per_s']:>9.1f} samples/s "
        f"cpu {row['cpu_pct']}% first batch {row['first_batch_s']} s requests {row['requests']}")
    return row


def _all_samples(epochs: list[dict[str, Any]]) -> int:
    return sum(e["samples"] for e in epochs)


def _kill_tree(monitor: _Monitor, proc: subprocess.Popen[str]) -> None:
    for p in list(monitor.seen.values())[::-1]:
        try:
            if p.pid != proc.pid and p.is_running():
                p.kill()
        except monitor.psutil.Error:
            pass
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def run_cases(cases: Iterable[Case], **kwargs: Any) -> list[dict[str, Any]]:
    return [run_case(c, **kwargs) for c in cases]


if __name__ == "__main__":
    child_main(json.loads(sys.argv[1]))
