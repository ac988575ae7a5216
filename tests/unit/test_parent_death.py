"""A forked child that calls ``end_with_parent`` (a DataLoader worker starting a pipeline's pass)
ends when the process that forked it dies, also when that happened before the call."""

from __future__ import annotations

import os
import select
import signal
import sys

import pytest

from pipeflow._parent import end_with_parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the parent-death signal is Linux's")


def _orphan(arm_first: bool) -> tuple[int, int]:
    """Fork a parent that forks a child and exits, after the child called end_with_parent()
    (``arm_first``) or before. Returns the child's pid and the read end of a pipe whose only
    write end the child holds: it reads end-of-file once the child has ended."""
    done_r, done_w = os.pipe()
    pid_r, pid_w = os.pipe()
    parent = os.fork()
    if parent == 0:  # the parent: forks the worker, exits
        try:
            os.close(done_r)
            os.close(pid_r)
            sync_r, sync_w = os.pipe()  # the parent's end of sync_w closes when it exits
            child = os.fork()
            if child == 0:  # the worker
                try:
                    os.close(pid_w)
                    if arm_first:
                        end_with_parent()
                        os.close(sync_w)  # armed: the parent may go
                    else:
                        os.close(sync_w)
                        os.read(sync_r, 1)  # end-of-file: the parent is gone
                        end_with_parent()
                    select.select([], [], [], 30)  # idle, as on a DataLoader's index queue
                finally:
                    os._exit(0)
            os.close(done_w)
            os.write(pid_w, str(child).encode())
            os.close(pid_w)
            if arm_first:
                os.close(sync_w)
                os.read(sync_r, 1)  # the worker armed itself
        finally:
            os._exit(0)
    os.close(done_w)
    os.close(pid_w)
    with os.fdopen(pid_r, "rb") as f:
        child = int(f.read() or 0)
    os.waitpid(parent, 0)
    return child, done_r


@pytest.mark.parametrize("arm_first", [False, True], ids=["parent-gone-before", "parent-gone-after"])
def test_a_forked_worker_ends_with_its_parent(arm_first):
    child, done = _orphan(arm_first)
    try:
        ready, _, _ = select.select([done], [], [], 10)
        assert ready, "the worker outlived its parent by 10 s"
        assert os.read(done, 1) == b""
    finally:
        os.close(done)
        if child:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_nothing_happens_in_a_process_that_was_not_forked():
    end_with_parent()  # the test process itself: no death signal, no exit
