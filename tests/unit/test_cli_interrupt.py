"""The command's Ctrl-C handling: taken at the loop's next batch, ignored by forked workers,
raised where the loop waits when it misses its grace, and by a second Ctrl-C."""

from __future__ import annotations

import multiprocessing.context
import os
import signal
import threading
import time

import pytest

from pipeflow._cli._interrupt import DeferredInterrupt
from pipeflow._fs import pid_alive


def _ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)  # the handler runs at the next bytecode of the main thread


def test_the_interrupt_waits_for_the_loops_check():
    with DeferredInterrupt(grace=30) as interrupt:
        _ctrl_c()  # no KeyboardInterrupt here
        assert interrupt.requested
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()


def test_no_interrupt_no_raise_and_the_previous_handler_is_back():
    before = signal.getsignal(signal.SIGINT)
    with DeferredInterrupt(grace=30) as interrupt:
        assert signal.getsignal(signal.SIGINT) is not before
        interrupt.check()
    assert signal.getsignal(signal.SIGINT) is before
    if before is signal.default_int_handler:
        with pytest.raises(KeyboardInterrupt):
            _ctrl_c()


def test_a_second_ctrl_c_raises_at_once():
    with DeferredInterrupt(grace=30):
        _ctrl_c()
        with pytest.raises(KeyboardInterrupt):
            _ctrl_c()


def test_a_loop_that_misses_its_grace_is_interrupted_where_it_waits():
    with DeferredInterrupt(grace=0.3):
        _ctrl_c()
        with pytest.raises(KeyboardInterrupt):  # a wait that ran out would raise nothing
            threading.Event().wait(60)  # a loop blocked on a store that stopped answering


def test_the_grace_timer_does_not_fire_after_the_loop_raised():
    with DeferredInterrupt(grace=0.2) as interrupt:
        _ctrl_c()
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()
        time.sleep(0.5)  # past the grace: nothing more is raised


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_worker_ignores_ctrl_c_and_is_ended_by_the_command():
    with DeferredInterrupt(grace=30):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker: a Ctrl-C to it must not end it
            try:
                os.close(read)
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.1)
                os.write(write, b"alive")
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            said = pipe.read()
        _, status = os.waitpid(pid, 0)
    assert said == b"alive"
    assert os.waitstatus_to_exitcode(status) == 0


def test_outside_the_main_thread_it_does_nothing():
    before = signal.getsignal(signal.SIGINT)
    seen = []

    def run() -> None:
        with DeferredInterrupt() as interrupt:
            seen.append(signal.getsignal(signal.SIGINT))
            interrupt.check()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [before]


class _InterruptedFork(multiprocessing.context.ForkProcess):
    """A DataLoader worker process whose start is followed by Ctrl-C twice: the second raises
    at once, between the fork and the DataLoader iterator recording the worker."""

    forked: list[int] = []

    def start(self) -> None:
        super().start()
        assert self.pid is not None
        self.forked.append(self.pid)
        if len(self.forked) == 1:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)


class _InterruptedForkContext(multiprocessing.context.ForkContext):
    Process = _InterruptedFork  # type: ignore[assignment]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_an_interrupt_while_the_epoch_forks_its_workers_leaves_no_worker_behind():
    import pipeflow as pf
    from pipeflow._cli._measure import measure

    _InterruptedFork.forked = []
    try:
        with pytest.raises(KeyboardInterrupt):
            measure(pf.from_items(range(1000)), batch_size=2, num_workers=2,
                    loader_kwargs={"multiprocessing_context": _InterruptedForkContext()})
        forked = list(_InterruptedFork.forked)
        assert forked, "no worker was started"
        # the DataLoader joined every worker it started as the interrupt came through
        deadline = time.monotonic() + 10
        while any(pid_alive(pid) for pid in forked) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in forked if pid_alive(pid)] == []
    finally:
        for pid in _InterruptedFork.forked:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
