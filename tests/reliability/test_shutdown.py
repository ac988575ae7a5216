"""Clean shutdown with real S3 backends, s5cmd subprocesses and fetch_batch staging dirs:
``break``, an exception in a user function, KeyboardInterrupt and garbage collection leave no
thread, child process, open file descriptor or staging file behind."""

from __future__ import annotations

import gc
import threading
import time
from pathlib import Path

import psutil
import pytest

import pipeflow as pf
from pipeflow.executor import warm

from . import _data

pytestmark = [pytest.mark.s3, pytest.mark.timeout(120)]

BACKENDS = ["boto3", "s3fs", "s3torchconnector", "s5cmd"]
HOW = ["break", "exception", "keyboard-interrupt", "gc"]

#: long-lived, process-wide threads that libraries start once on purpose (not leaks)
_SINGLETON_THREADS = ("fsspecIO", "asyncio_", "pipeflow-delay-proxy")


class Boom(Exception):
    pass


def _explode_on_5(sample):
    if sample["__key__"].endswith("-005"):
        raise Boom(sample["__key__"])
    return sample


def _interrupt_on_5(sample):
    if sample["__key__"].endswith("-005"):
        raise KeyboardInterrupt
    return sample


def _threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if not t.name.startswith(_SINGLETON_THREADS)}


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess):  # exited meanwhile, or a zombie
        return ""


def _children() -> set[int]:
    out = set()
    for p in psutil.Process().children(recursive=True):
        cmd = _cmdline(p)
        infra = p.pid == warm.server_pid()  # the warm fork server, a fork of this process
        if not infra and not any(i in cmd for i in ("moto.server", "forkserver", "resource_tracker")):
            out.add(p.pid)
    return out


def _fds() -> int:
    return psutil.Process().num_fds()


def _settle(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    return check()


@pytest.fixture(scope="module")
def shards(s3):
    bucket = s3.make_bucket("reliability-shutdown")
    return s3.put_many(bucket, _data.tar_dataset(4, 12))


def _run(pipe, how):
    if how == "break":
        it = iter(pipe)
        for i, _ in enumerate(it):
            if i == 6:
                break
        it.close()  # what a for-loop's frame exit does for a generator; plus GC below
        del it
    elif how == "gc":
        it = iter(pipe)
        for i, _ in enumerate(it):
            if i == 6:
                break
        del it  # no close(): the finaliser must clean up
    elif how == "exception":
        with pytest.raises(Boom):
            list(pipe.map(_explode_on_5))
    else:
        with pytest.raises(KeyboardInterrupt):
            list(pipe.map(_interrupt_on_5))


def _check_clean(threads, children, fds, where):
    assert _settle(lambda: _threads() <= threads), f"{where}: threads left: {_threads() - threads}"
    assert _settle(lambda: _children() <= children), f"{where}: processes left: {_children() - children}"
    # a client's connection pool may keep sockets; they must be released with the pipeline
    assert _settle(lambda: _fds() <= fds), f"{where}: fds {fds} -> {_fds()}"


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("backend", BACKENDS)
def test_streaming_open_shuts_down_cleanly(shards, backend, how):
    pipe = (pf.from_items(shards).open(backend, workers=2).untar().group_pairs()
            .map(_data.check_sample if how in ("break", "gc") else (lambda s: s)).prefetch(2))
    list(pf.from_items(shards[:1]).open(backend).untar())  # warm up: SDK imports, lazy singletons
    gc.collect()
    threads, children, fds = _threads(), _children(), _fds()
    _run(pipe, how)
    gc.collect()
    _check_clean(threads, children, fds, f"{backend}/{how}")


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("backend", ["s5cmd", "boto3"])
def test_fetch_batch_removes_its_staging_files(shards, backend, how, tmp_path: Path):
    staging_parent = tmp_path / "staging"
    staging_parent.mkdir()
    urls = [f"{u}" for u in shards]
    pipe = (pf.from_items(urls * 3).fetch_batch(backend, batch_size=2, to=str(staging_parent))
            .map(lambda rec: {"__key__": f"x-{len(rec.data):03d}", "data": rec.data}))
    gc.collect()
    threads, children, fds = _threads(), _children(), _fds()
    if how in ("exception", "keyboard-interrupt"):
        exc = Boom if how == "exception" else KeyboardInterrupt

        seen = []

        def fail(item):
            seen.append(item)
            if len(seen) == 3:
                raise exc("stop")
            return item

        with pytest.raises(exc):
            list(pipe.map(fail))
    else:
        _run(pipe, how)
    gc.collect()
    _check_clean(threads, children, fds, f"fetch_batch/{backend}/{how}")
    assert _settle(lambda: not any(staging_parent.iterdir())), list(staging_parent.rglob("*"))


def test_no_temp_files_left_in_the_system_temp_dir(shards):
    import tempfile

    tmp = Path(tempfile.gettempdir())

    def ours():
        return {p.name for p in tmp.iterdir() if p.name.startswith(("pipeflow-", "s5cmd-run-"))}

    before = ours()
    during = set()
    for how in ("break", "exception"):
        pipe = pf.from_items(shards * 2).fetch_batch("s5cmd", batch_size=3)
        if how == "break":
            for i, _ in enumerate(pipe):
                if i == 2:
                    during = ours() - before
                    break
        else:
            with pytest.raises(Boom):
                list(pipe.map(_explode_on_rec_3))
    assert during, "the staging files were expected in the temp dir while the epoch ran"
    gc.collect()
    assert _settle(lambda: ours() <= before), ours() - before


_count = {"n": 0}


def _explode_on_rec_3(rec):
    _count["n"] += 1
    if _count["n"] % 3 == 0:
        raise Boom(rec.url)
    return rec
