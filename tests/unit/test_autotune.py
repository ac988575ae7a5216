"""``"auto"`` concurrency: the controller against simulated workloads (a fake clock), and the
stages that use it on real threads and processes. Behaviour only, never speed."""

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import pipeflow as pf
from pipeflow.backends.local import LocalBackend
from pipeflow.errors import ConfigError
from pipeflow.executor import autotune, intraop
from pipeflow.executor import window as window_module
from pipeflow.executor.autotune import BufferTuner, Tuner
from pipeflow.executor.window import Window, WindowOptions
from pipeflow.stages.map import WindowedOptions

from ._autotune_helpers import fake_clock, held
from ._core_helpers import double, slow_double


@pytest.fixture
def clock(monkeypatch):
    return fake_clock(monkeypatch)


class Counting:
    """A source of 0, 1, 2, ... with a position (what a window pulls from)."""

    def __init__(self, n):
        self.i, self.n = 0, n

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i - 1

    def state_dict(self):
        return {"index": self.i}


def _drive(tuner, clock, rate_at, seconds=20.0, nbytes=0):
    """Deliver items at ``rate_at(limit)`` per second for ``seconds``; the limits seen."""
    seen = []
    end = clock.now + seconds
    while clock.now < end:
        clock.now += 1.0 / rate_at(tuner.value)
        tuner.delivered(nbytes)
        seen.append(tuner.value)
    return seen


def test_controller_climbs_to_where_more_stops_helping(clock):
    tuner = Tuner(1, 64, 1)
    seen = _drive(tuner, clock, lambda n: 100.0 * min(n, 12))
    assert 12 <= held(seen) <= 16, seen
    assert max(seen) <= 64


def test_a_plain_climb_holds_where_the_process_has_no_idle_core(clock, monkeypatch):
    # more calls at once would seem to deliver more (one interval's rate, a warm-up in the
    # first), but the process already uses its two cores: more could only share them
    monkeypatch.setattr(autotune, "cpu_budget", lambda: 2)
    cores_used = [1.9]
    monkeypatch.setattr(autotune, "process_time", lambda: clock.now * cores_used[0])
    tuner = Tuner(1, 8, 2)
    seen = _drive(tuner, clock, lambda n: 100.0 * min(n, 8), seconds=3 * autotune.PROBE_EVERY * 0.25)
    assert set(seen) == {2}, seen  # not even a probe while the cores stay busy
    assert tuner.settled and tuner.steps_up == 0
    # a core left idle (the calls wait on something): it climbs as before, and stops where the
    # cores are busy
    cores_used[0] = 1.0
    tuner = Tuner(1, 8, 2)
    seen = _drive(tuner, clock, lambda n: 100.0 * min(n, 8), seconds=1.0)
    assert max(seen) == 8, seen
    cores_used[0] = 1.9
    tuner = Tuner(1, 8, 1)
    seen = _drive(tuner, clock, lambda n: 100.0 * min(n, 8), seconds=5.0)
    assert held(seen) == 1 and max(seen) == 1, seen  # busy from the first interval on


def test_controller_stays_low_when_more_does_not_help(clock):
    tuner = Tuner(1, 64, 1)
    seen = _drive(tuner, clock, lambda n: 500.0)
    assert held(seen) == 1
    assert max(seen) <= 2


def test_controller_backs_off_when_more_hurts(clock):
    tuner = Tuner(1, 64, 1)
    seen = _drive(tuner, clock, lambda n: 1000.0 / (1 + abs(n - 4)))
    assert held(seen) == 4


def test_controller_backs_off_when_the_store_pushes_back(clock):
    # more requests would deliver more, but above 8 in flight the store answers some with
    # 503 SlowDown (retried: a count that grows); the tuner halves and holds instead of climbing
    retried = [0]
    tuner = Tuner(1, 64, 4)
    tuner.watch(lambda: retried[0])

    def rate_at(n):
        if n > 8:
            retried[0] += 1
        return 100.0 * n

    seen = _drive(tuner, clock, rate_at, seconds=30.0)
    assert tuner.backoffs >= 1
    assert held(seen) <= 8, seen
    # without the push-back the same workload climbs past 8
    free = Tuner(1, 64, 4)
    assert held(_drive(free, clock, lambda n: 100.0 * n, seconds=30.0)) > 8
    assert free.backoffs == 0


def test_controller_ignores_retries_from_before_it_watched(clock):
    tuner = Tuner(1, 64, 4)
    tuner.watch(lambda: 5)  # counted in an earlier epoch: no new push-back
    _drive(tuner, clock, lambda n: 100.0 * min(n, 12), seconds=5.0)
    assert tuner.backoffs == 0


def test_controller_never_leaves_its_range(clock):
    tuner = Tuner(3, 6, 1)
    seen = _drive(tuner, clock, lambda n: 100.0 * n)
    assert min(seen) >= 3 and max(seen) <= 6
    assert tuner.value == 6


def test_controller_keeps_bytes_in_flight_under_the_memory_budget(clock):
    tuner = Tuner(1, 64, 1, byte_budget=10 << 20)
    seen = _drive(tuner, clock, lambda n: 100.0 * n, nbytes=1 << 20)
    assert max(seen[20:]) <= 10
    assert tuner.value == 10


def test_controller_probes_again_when_more_starts_to_help(clock):
    tuner = Tuner(1, 64, 1)
    assert held(_drive(tuner, clock, lambda n: 100.0 * min(n, 4))) == 4
    assert held(_drive(tuner, clock, lambda n: 100.0 * min(n, 16), seconds=60.0)) >= 16


def _drive_late(tuner, clock, rate_at, seconds, lag=0.3):
    """:func:`_drive`, where the rate follows the limit ``lag`` seconds late: results delivered
    in order, the items in flight when the limit moved come out first (the window turns over)."""
    seen, history = [], [(clock.now, tuner.value)]
    end = clock.now + seconds
    while clock.now < end:
        before = [v for t, v in history if t <= clock.now - lag]
        clock.now += 1.0 / rate_at(before[-1] if before else history[0][1])
        tuner.delivered()
        if tuner.value != history[-1][1]:
            history.append((clock.now, tuner.value))
        seen.append(tuner.value)
    return seen


def test_a_probe_is_measured_twice_before_it_counts_as_a_failure(clock):
    # the interval right after a probe's step up still delivers at the old limit's rate (the
    # window turns over); judged on that interval alone, every probe failed and held the old
    # limit for PROBE_EVERY intervals, so a stage that more would now help never climbed
    # (the late rate makes the climb overshoot a little: four would do, it holds up to 16)
    tuner = Tuner(1, 64, 1)
    assert held(_drive_late(tuner, clock, lambda n: 100.0 * min(n, 4), seconds=20.0)) <= 16
    assert held(_drive_late(tuner, clock, lambda n: 100.0 * min(n, 48), seconds=60.0)) >= 48


def test_cpu_budget_is_shared_among_dataloader_workers(monkeypatch):
    monkeypatch.setattr(autotune.os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(autotune, "dataloader_workers", lambda: 1)
    assert autotune.cpu_budget() == 8
    assert autotune.bounds("cpu") == (1, 8)
    assert autotune.bounds("thread") == (8, 32)  # a thread map starts at the cores
    monkeypatch.setattr(autotune, "dataloader_workers", lambda: 3)
    assert autotune.cpu_budget() == 2
    assert autotune.bounds("io") == (4, 64 // 3)


def _budget_seen(x):
    return autotune.dataloader_workers(), autotune.cpu_budget()


def test_dataloader_workers_each_get_a_share_of_the_cores():
    from torch.utils.data import DataLoader

    pipe = pf.from_items(range(8)).map(_budget_seen)
    seen = {tuple(x) for x in DataLoader(pipe, batch_size=None, num_workers=2)}
    assert seen == {(2, max(1, len(os.sched_getaffinity(0)) // 2))}
    assert _budget_seen(0) == (1, len(os.sched_getaffinity(0)))  # the main process: all of them


def test_buffer_grows_only_when_both_sides_wait(clock):
    steady = BufferTuner()
    for _ in range(200):  # the consumer waits, the producer never does: it is just slower
        clock.now += 0.01
        steady.got(waited=True)
    assert steady.value == 2
    bursty = BufferTuner(high=16)
    for i in range(400):
        clock.now += 0.01
        if i % 4 == 0:
            bursty.full()
        bursty.got(waited=i % 3 == 0)
    assert bursty.value == 16


# ---- stages ------------------------------------------------------------------------------
def _sleepy(x):
    time.sleep(0.02)
    return x


_lock = threading.Lock()


def _locked(x):
    with _lock:  # only one call makes progress at a time, whatever the concurrency
        time.sleep(0.01)
    return x


def test_map_grows_under_latency_bound_work():
    pipe = pf.from_items(range(300)).map(_sleepy, workers="auto")
    assert list(pipe) == list(range(300))  # in order
    numbers = pipe.stats()["map"]
    assert numbers["inflight"] > 2 and numbers["workers"] > 1


def test_map_does_not_grow_when_more_does_not_help(monkeypatch):
    monkeypatch.setattr(autotune, "cpu_budget", lambda: 2)
    pipe = pf.from_items(range(300)).map(_locked, workers="auto")
    assert list(pipe) == list(range(300))
    # calls at once start at the 2 cores and may reach 8 (four threads per core): a tuner that
    # grows without a gain reaches 8 within two intervals and stays there; on a loaded machine
    # noise may pass for a gain once or twice (a doubling that is doubted, then the step
    # between: 6), never all the way
    numbers = pipe.stats()["map"]
    assert numbers["workers"] < 8, numbers
    assert numbers["inflight"] == 2 * numbers["workers"]  # each call has the next item queued


def _most_at_once(seconds):
    """A function that sleeps ``seconds`` per call, and a one-item list holding the most calls
    that ran at once."""
    active, most, guard = [0], [0], threading.Lock()

    def call(x):
        with guard:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(seconds)
        with guard:
            active[0] -= 1
        return x

    return call, most


def test_map_stays_within_the_cpu_budget(monkeypatch):
    monkeypatch.setattr(autotune, "cpu_budget", lambda: 1)
    counted, most = _most_at_once(0.01)
    pipe = pf.from_items(range(300)).map(counted, workers="auto")
    assert list(pipe) == list(range(300))
    assert 1 < most[0] <= 4  # four threads per core for a thread map
    numbers = pipe.stats()["map"]
    assert numbers["workers"] <= 4 and numbers["inflight"] <= 8


def test_gate_runs_at_most_the_tuned_number_of_calls_at_once():
    tuner = Tuner(1, 8, 2)
    gate = autotune.Gate(tuner)
    work, most = _most_at_once(0.02)
    with ThreadPoolExecutor(8) as pool:

        def run(n):
            futures = [gate.submit(pool.submit, work, i) for i in range(n)]
            assert [f.result(timeout=10.0) for f in futures] == list(range(n))

        run(8)
        assert most[0] == 2  # six items waited in the gate's queue, and each ran in its turn
        tuner.value, most[0] = 4, 0
        run(8)
        assert most[0] == 4


def test_gate_hands_no_item_from_one_thread_to_another():
    # a thread that ends a call takes the next queued item itself: with 2 at once, 40 items run
    # on 2 threads of a pool of 8 (each item used to wait on a thread of its own: 8 threads)
    tuner = Tuner(1, 8, 2)
    gate = autotune.Gate(tuner)
    names: set[str] = set()

    def work(x):
        names.add(threading.current_thread().name)
        time.sleep(0.002)
        return x

    with ThreadPoolExecutor(8) as pool:
        futures = [gate.submit(pool.submit, work, i) for i in range(40)]
        assert [f.result(timeout=10.0) for f in futures] == list(range(40))
    assert len(names) <= 2, names


def test_gate_skips_what_was_cancelled_and_a_refused_start_leaves_nothing_queued():
    tuner = Tuner(1, 8, 1)
    gate = autotune.Gate(tuner)
    release = threading.Event()
    ran: list[int] = []

    def work(x):
        release.wait(10.0)
        ran.append(x)
        return x

    with ThreadPoolExecutor(2) as pool:
        first = gate.submit(pool.submit, work, 0)
        queued = gate.submit(pool.submit, work, 1)
        last = gate.submit(pool.submit, work, 2)
        assert queued.cancel()  # still in the gate's queue
        release.set()
        assert first.result(timeout=10.0) == 0 and last.result(timeout=10.0) == 2
    assert ran == [0, 2]
    pool.shutdown()

    def refuse(runner):
        raise RuntimeError("cannot schedule new futures after shutdown")

    with pytest.raises(RuntimeError, match="after shutdown"):
        gate.submit(refuse, work, 3)
    assert not gate._queue and gate._runners == 0


def test_a_tuned_thread_map_keeps_the_next_item_queued_and_shows_its_climb(monkeypatch):
    monkeypatch.setattr(autotune, "cpu_budget", lambda: 2)
    pipe = pf.from_items(range(300)).map(_sleepy, workers="auto")
    assert list(pipe) == list(range(300))
    numbers = pipe.stats()["map"]
    # sleeping calls gain from more at once: it climbed from the 2 cores, step by step
    assert numbers["workers"] > 2 and numbers["steps_up"] >= 1, numbers
    assert numbers["inflight"] == 2 * numbers["workers"], numbers
    assert "steps_up=" in str(pipe.stats())


def test_unordered_auto_map_delivers_everything_once():
    pipe = pf.from_items(range(200)).map(slow_double, workers="auto", in_order=False)
    assert sorted(pipe) == [2 * x for x in range(200)]


def test_process_map_auto_uses_processes_within_the_cores():
    pipe = pf.from_items(range(50)).map(double, workers="auto", method="process")
    assert list(pipe) == [2 * x for x in range(50)]
    assert 1 <= pipe.stats()["map"]["workers"] <= autotune.cpu_budget()


def _process_rate(limit):
    """Items/s of a JPEG decode on a pool of two processes (as measured on 2 cores under load):
    a process with one item in flight idles while the consumer's process turns each result
    around, and two items on two processes idle both the same way (within the 8% margin);
    two items per process keep them busy."""
    return {1: 620.0, 2: 650.0, 3: 900.0}.get(limit, 1300.0)


@pytest.mark.parametrize("what, kind", [("map", None), ("decode", "cpu")])
def test_a_tuned_process_pool_starts_at_the_cores_and_climbs_past_the_plateau(clock, monkeypatch,
                                                                               what, kind):
    monkeypatch.setattr(autotune, "cpu_budget", lambda: 2)
    options = WindowedOptions(what, workers="auto", method="process", kind=kind)
    _, tuner = options.window(what)
    assert tuner is not None and tuner.value == 2  # one item per core, not one in all
    seen = _drive(tuner, clock, _process_rate)
    assert held(seen) == 4, seen  # two items per process: the best of the pool


def test_a_tuned_pool_on_threads_keeps_its_start(monkeypatch):
    monkeypatch.setattr(autotune, "cpu_budget", lambda: 2)
    decode = WindowedOptions("decode", workers="auto", method="thread", kind="cpu")
    thread_map = WindowedOptions("map", workers="auto", method="thread")
    assert decode.window("decode")[1].value == 1  # a GIL to share: from one, and grows if it pays
    assert thread_map.window("map")[1].value == 2


def test_explicit_numbers_are_not_tuned():
    pipe = pf.from_items(range(100)).map(_sleepy, workers=3, max_inflight=5).prefetch(3)
    assert list(pipe) == list(range(100))
    stats = pipe.stats()
    assert stats["map"]["workers"] == 3 and "inflight" not in stats["map"]
    assert "inflight" not in stats["prefetch"]


def test_max_inflight_auto_stays_between_workers_and_four_times_workers():
    pipe = pf.from_items(range(300)).map(_sleepy, workers=2, max_inflight="auto")
    assert list(pipe) == list(range(300))
    numbers = pipe.stats()["map"]
    assert numbers["workers"] == 2 and 2 <= numbers["inflight"] <= 8


def test_explain_and_stats_show_auto():
    pipe = (pf.from_items(range(100)).map(_sleepy, workers="auto").prefetch("auto"))
    text = pipe.explain()
    assert "workers='auto'" in text and "prefetch('auto')" in text
    list(pipe)
    stats = pipe.stats()
    assert stats["map"]["inflight"] >= 1 and stats["prefetch"]["inflight"] >= 2
    assert "map" in str(stats)


def _numbered_files(folder, count=40):
    """``count`` small files, the i-th holding ``str(i)``; their paths in order."""
    paths = []
    for i in range(count):
        path = folder / f"{i:03d}.txt"
        path.write_text(str(i))
        paths.append(str(path))
    return paths


def test_open_and_decode_take_auto(tmp_path):
    paths = _numbered_files(tmp_path)
    pipe = pf.from_items(paths).open(workers="auto", read=True, max_inflight="auto")
    assert [r.data for r in pipe] == [str(i).encode() for i in range(40)]
    assert pipe.stats()["open"]["inflight"] >= 1
    samples = [{"__key__": str(i), "txt": str(i).encode()} for i in range(30)]
    decoded = pf.from_items(samples).decode(workers="auto")
    assert [s["txt"] for s in decoded] == [str(i) for i in range(30)]


def test_dataloader_workers_of_a_tuned_open_share_one_row_of_limits(tmp_path):
    # the workers forked from this process find each other's settled limits under one name
    # (the pipeline's and the stage's); outside a DataLoader nothing is shared
    import torch.utils.data

    pipe = pf.from_items(_numbered_files(tmp_path)).open(read=True)
    name = f"{pipe._channel.path}/open"
    assert [r.data for r in pipe] == [str(i).encode() for i in range(40)]
    assert autotune.BOARD.limits(name) is None  # one process: no row
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    assert sorted(r.data for r in loader) == sorted(str(i).encode() for i in range(40))
    limits = autotune.BOARD.limits(name)
    assert limits is not None and not any(limits[2:]), limits  # two workers' slots, no more


class _OpenLog(LocalBackend):
    """A local backend that signals each open, so a test can see which objects were opened."""

    name = "open-log"

    def __init__(self) -> None:
        super().__init__()
        self.opened = {}

    def open(self, url, *, start=0):
        stream = super().open(url, start=start)
        self.opened.setdefault(url, threading.Event()).set()
        return stream

    def was_opened(self, url, timeout):
        return self.opened.setdefault(url, threading.Event()).wait(timeout)


def test_auto_open_of_streams_opens_the_next_object_while_one_is_read(tmp_path):
    # the next shard's round trip to its first byte overlaps the reading of the current one
    # from the first shard on, not only once the tuner has measured a step
    paths = []
    for i in range(6):
        path = tmp_path / f"{i}.bin"
        path.write_bytes(bytes([i]) * 100)
        paths.append(str(path))
    backend = _OpenLog()
    it = iter(pf.from_items(paths).open(backend))
    for i in range(5):
        opened = next(it)
        assert opened.url == paths[i]
        assert backend.was_opened(paths[i + 1], timeout=10.0), f"{paths[i + 1]} not opened ahead"
        assert opened.stream.read() == bytes([i]) * 100
        opened.stream.close()
    assert [o.url for o in it] == paths[5:]


def test_auto_open_of_whole_objects_and_explicit_limits_keep_their_start(tmp_path):
    paths = [str(tmp_path / f"{i}.bin") for i in range(3)]
    for p in paths:
        open(p, "wb").close()
    backend = _OpenLog()
    it = iter(pf.from_items(paths).open(backend, max_inflight=1))
    next(it).stream.close()
    assert not backend.was_opened(paths[1], timeout=0.3)  # max_inflight=1 caps the start
    reads = pf.from_items(paths).open(workers="auto", read=True)
    assert [r.data for r in reads] == [b"", b"", b""]


_NONNEG = "must be 'auto' or a non-negative int, got"
_POS = "must be 'auto' or a positive int, got"


@pytest.mark.parametrize(("build", "message"), [
    (lambda p: p.map(double, workers="autox"), f"map(workers=...) {_NONNEG} 'autox'"),
    (lambda p: p.map(double, workers=-1), f"map(workers=...) {_NONNEG} -1"),
    (lambda p: p.map(double, workers=2, max_inflight=0), f"map(max_inflight=...) {_POS} 0"),
    (lambda p: p.map(double, max_inflight="auto"), "map(max_inflight='auto') needs workers > 0"),
    (lambda p: p.open(workers="Auto"), f"open(workers=...) {_NONNEG} 'Auto'"),
    (lambda p: p.decode(workers=-1), f"decode(workers=...) {_NONNEG} -1"),
    (lambda p: p.prefetch(0), f"prefetch(size=...) {_POS} 0"),
    (lambda p: p.prefetch("autox"), f"prefetch(size=...) {_POS} 'autox'"),
    (lambda p: p.map(double, workers=True), f"map(workers=...) {_NONNEG} True"),
])
def test_invalid_values_are_config_errors(build, message):
    with pytest.raises(ConfigError) as info:
        build(pf.from_items(range(3)))
    assert message in str(info.value)


def test_verdict_of_a_tuned_stage_says_more_did_not_help():
    # the planted limit is a lock held while sleeping: more calls at once cannot help, and it
    # leaves the CPU (and the GIL) to everyone else, so on a loaded machine the consumer's
    # thread still takes each result at once (a function spinning on the GIL made the
    # consumer's own time between items, spent waiting for the GIL, compete with it)
    pipe = pf.from_items(range(150)).map(_locked, workers="auto").batch(4)
    assert sum(len(b) for b in pipe) == 150
    stats = pipe.stats()
    assert stats.bottleneck == "map", str(stats)
    assert "tunes itself (workers='auto'" in stats.advice, stats.advice
    assert stats["map"]["busy_s"] >= 150 * 0.01 * 0.9  # the lock's time is the map's own work


def test_a_tuned_decode_on_threads_keeps_the_next_sample_queued(monkeypatch):
    # one core (a DataLoader worker's share of two): one decode at a time, and the next sample
    # already in flight, as decode(workers=1) keeps two; never a thread idle while the consumer
    # takes the last result
    monkeypatch.setattr(autotune, "cpu_budget", lambda: 1)
    samples = [{"__key__": str(i), "txt": str(i).encode()} for i in range(60)]
    decoded = pf.from_items(samples).decode(workers="auto")
    assert [s["txt"] for s in decoded] == [str(i) for i in range(60)]
    numbers = decoded.stats()["decode"]
    assert numbers["workers"] == 1 and numbers["inflight"] == 2, numbers


def test_a_decode_settled_at_one_call_runs_in_the_consumers_thread(monkeypatch):
    # two cores, but no step counts as a gain: the tuner tries two decodes at once, finds no
    # gain twice and settles at one (after ~0.75 s); from then on a decode thread would only add
    # a hand-off per sample, so the samples are decoded in the thread that iterates, in order,
    # counted and resumable as before
    monkeypatch.setattr(autotune, "cpu_budget", lambda: 2)
    monkeypatch.setattr(autotune, "GAIN", 100.0)
    consumer, threads = threading.get_ident(), []

    def slow_txt(data):
        threads.append(threading.get_ident())
        time.sleep(0.01)
        return data.decode()

    samples = [{"__key__": str(i), "txt": str(i).encode()} for i in range(200)]
    decoded = pf.from_items(samples).decode(workers="auto", handlers={"txt": slow_txt})
    out = {}

    def consume():  # as a loader's thread: torch operators on this thread alone
        nonlocal consumer
        consumer = threading.get_ident()
        intraop.one_intraop_thread()
        it = iter(decoded)
        out["first"] = [next(it)["txt"] for _ in range(170)]
        out["state"] = it.state_dict()
        out["rest"] = [s["txt"] for s in it]

    _in_a_thread(consume)
    first, state, rest = out["first"], out["state"], out["rest"]
    assert first + rest == [str(i) for i in range(200)]
    assert threads[0] != consumer  # climbing: on the pool
    assert set(threads[-20:]) == {consumer}, threads  # settled at one: inline
    numbers = decoded.stats()["decode"]
    assert numbers["workers"] == 1 and numbers["inflight"] == 1 and numbers["steps_up"] == 1, numbers
    assert numbers["items"] == 200 and numbers["busy_s"] >= 200 * 0.01 * 0.5, numbers
    resumed = iter(pf.from_items(samples).decode(workers="auto", handlers={"txt": slow_txt}))
    resumed.load_state_dict(state)
    assert [s["txt"] for s in resumed] == rest


def _in_a_thread(fn):
    """Run ``fn`` in a fresh thread (its torch intra-op setting its own) and re-raise its error."""
    errors = []

    def run():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    if errors:
        raise errors[0]


def test_a_consumer_whose_torch_runs_a_team_of_threads_keeps_the_decode_threads(clock):
    # the training thread iterating a pipeline itself: a resize there would run on its team of
    # intra-op threads, which on busy cores wait on each other; a decode thread runs it alone
    import torch  # noqa: F401 - OpenMP is found once torch loaded it (and the lookup is cached)

    setter = intraop._omp_set_num_threads()
    if setter is None:
        pytest.skip("torch without OpenMP: one intra-op thread everywhere")
    tuner = Tuner(1, 2, 1)
    _drive(tuner, clock, lambda n: 100.0, seconds=2.0)
    assert tuner.settled and tuner.value == 1
    window = Window(double, WindowOptions(workers=2, gated=True, solo_inline=True), tuner=tuner)
    seen = {}

    def team_of(n):
        def check():
            intraop.one_intraop_thread()
            if n > 1:
                setter(n)
            seen[n] = window.solo
        return check

    try:
        _in_a_thread(team_of(1))
        _in_a_thread(team_of(2))
    finally:
        window.shutdown()
    assert seen == {1: True, 2: False}


class _Interrupt(BaseException):
    """Not an ``Exception``, as ``KeyboardInterrupt`` (which would stop the test run if it escaped)."""


def test_a_window_runs_in_the_consumers_thread_only_while_its_tuner_holds_one(clock, monkeypatch):
    monkeypatch.setattr(window_module, "single_intraop_thread", lambda: True)  # as a loader's thread
    tuner = Tuner(1, 2, 1)
    _drive(tuner, clock, lambda n: 100.0, seconds=2.0)  # two at once gained nothing: settled at one
    assert tuner.settled and tuner.value == 1
    threads = []

    def record(x):
        threads.append(threading.get_ident())
        return 2 * x

    window = Window(record, WindowOptions(workers=2, gated=True, solo_inline=True), tuner=tuner)
    source = Counting(30)
    window.restart()

    def take(n):
        out = []
        for _ in range(n):
            task = window.next_task(source)
            out.append(window.wait(task))
            window.complete(task)
        return out

    try:
        assert take(10) == [2 * i for i in range(10)] and window.limit == 1
        assert set(threads) == {threading.get_ident()}
        assert window.position(source) == ({"index": 10}, [])
        tuner.value = 2  # a probe one step up: back to the pool, four in flight
        assert take(10) == [2 * i for i in range(10, 20)] and window.limit == 4
        assert threading.get_ident() not in set(threads[10:])
        assert window.position(source) == ({"index": 20}, [])
    finally:
        window.shutdown()
    def fail_on_3(x):
        if x == 3:
            raise ValueError("bad item")
        if x == 5:
            raise _Interrupt
        return x

    tuner.value = 1  # the probe did not pay: back at one
    window = Window(fail_on_3, WindowOptions(workers=2, gated=True, solo_inline=True), tuner=tuner)
    source = Counting(10)
    window.restart()
    try:
        assert window.solo and take(3) == [0, 1, 2]
        task = window.next_task(source)
        with pytest.raises(ValueError, match="bad item"):  # through the task, as from a thread
            window.wait(task)
        assert window.position(source) == ({"index": 3}, [])  # still before the failed item
        window.complete(task)  # skipped
        assert take(1) == [4]
        task = window.next_task(source)
        with pytest.raises(_Interrupt):
            window.wait(task)
        assert window.position(source) == ({"index": 5}, [])  # an interrupt loses nothing
    finally:
        window.shutdown()
    one_core = Tuner(1, 1, 1)  # one call is all it may run: the threads keep overlapping
    _drive(one_core, clock, lambda n: 100.0, seconds=2.0)
    assert one_core.settled
    assert not Window(record, WindowOptions(workers=1, gated=True, solo_inline=True), tuner=one_core).solo


def test_only_cpu_bound_work_on_gated_threads_may_run_in_the_consumers_thread():
    # a thread map's function may wait (I/O): its one thread overlaps the wait with the consumer
    assert WindowedOptions(what="decode", workers="auto", kind="cpu").window("d")[0].solo_inline
    assert not WindowedOptions(what="map", workers="auto").window("m")[0].solo_inline
    assert not WindowedOptions(what="decode", workers=2, kind="cpu").window("d")[0].solo_inline
    assert not WindowedOptions(what="decode", workers="auto", kind="cpu",
                               method="process").window("d")[0].solo_inline
