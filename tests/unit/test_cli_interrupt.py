"""The command's Ctrl-C handling: taken at the loop's next batch, ignored by forked workers,
raised where the loop waits when it misses its grace, and by a second Ctrl-C."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from pipeflow._cli._interrupt import DeferredInterrupt


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
