"""A warm fork server: multiprocessing's fork server, forked from this process instead of started
as a fresh interpreter.

multiprocessing's ``forkserver`` start method runs a new interpreter that imports the mapped
function's module (torch, numpy, PIL: 1.3-1.9 s of CPU on the 2-core machines) before it forks
the first worker; a bare ``ProcessPoolExecutor`` with ``fork`` pays nothing, because it forks a
parent that has imported all of that already. Here the server itself is a fork of this process,
taken while this process has no other thread, and runs multiprocessing's own server loop: its
workers start as warm as forked ones, and as safely as the fork server's, because the process
they are forked from runs one thread, which never runs a torch operator or an S3 client.

What the fork copies is this process at that moment: modules imported later are imported by
each worker when it unpickles what needs them. A fork of a process that already ran torch's
OpenMP team leaves the team's threads behind; torch in a worker then runs on one intra-op
thread (:func:`~pipeflow.executor.intraop.one_intraop_thread`, as in a DataLoader worker), which
never touches that team.

The server is one per process lifetime, shared by every pool and epoch, as multiprocessing's
is, and ends as that one does: when the last holder of the "alive" pipe's write end (this
process and the workers) is gone. It is not killed with this process: a worker whose owner died
first removes the owner's shared memory (:mod:`.lifetime`), which a kill of its parent, the
server, would cut short. Like any fork, the server holds the files this process had open when it
was forked until then. When this process runs other threads, or the interpreter's fork server has a layout
this module does not know (it reads and sets the private attributes of
``multiprocessing.forkserver``, checked below; Python 3.11-3.13), nothing happens here and the
fresh-interpreter fork server starts as before.
"""

from __future__ import annotations

import inspect
import os
import signal
import socket
import sys
import threading
from multiprocessing import connection, forkserver, resource_tracker, util
from typing import Any

__all__ = ["server_pid", "start_warm_server"]

_SERVER_ATTRS = ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid", "_lock")
_MAIN_PARAMS = ["listener_fd", "alive_r", "preload", "main_path", "sys_path"]
#: the pid of the warm server this process started (0: none)
_started = [0]
#: the parts of multiprocessing used here that it does not declare (checked by _layout_known)
_mp_connection: Any = connection
_mp_util: Any = util


def _layout_known() -> bool:
    server = getattr(forkserver, "_forkserver", None)
    if server is None or not all(hasattr(server, a) for a in _SERVER_ATTRS):
        return False
    if not all(hasattr(_mp_util, f) for f in ("_flush_std_streams", "is_abstract_socket_namespace")):
        return False
    if not hasattr(_mp_connection, "arbitrary_address"):
        return False
    return list(inspect.signature(forkserver.main).parameters) == _MAIN_PARAMS


def _alone() -> bool:
    """No other Python thread: none holds a lock the fork would copy locked. Native pools
    (OpenBLAS's, torch's OpenMP team) may idle; see the module's docstring."""
    return threading.active_count() == 1 and threading.current_thread() is threading.main_thread()


def server_pid() -> int:
    """The pid of the warm fork server this process started, 0 if none (or it is gone)."""
    pid = _started[0]
    if pid and _running(pid):
        return pid
    return 0


def _running(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False


def start_warm_server() -> bool:
    """Fork the warm fork server now if this process may (no other thread, no fork server yet,
    a known ``multiprocessing.forkserver``); True if the fork server that runs is a warm one."""
    if not _layout_known():
        return False
    server: Any = forkserver._forkserver
    with server._lock:
        if server._forkserver_pid is not None:
            return server._forkserver_pid == _started[0] and _running(_started[0])
        if not _alone():
            return False
        resource_tracker.ensure_running()  # the workers inherit its pipe, as the server's do
        address, alive_w, pid = _fork_server()
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid
        _started[0] = pid
    return True


def _fork_server() -> tuple[str, int, int]:
    listener = socket.socket(socket.AF_UNIX)
    address = _mp_connection.arbitrary_address("AF_UNIX")
    listener.bind(address)
    if not _mp_util.is_abstract_socket_namespace(address):
        os.chmod(address, 0o600)
    listener.listen()
    alive_r, alive_w = os.pipe()
    _mp_util._flush_std_streams()  # or the server's workers print this process's unflushed output
    pid = os.fork()
    if pid == 0:  # the server
        os.close(alive_w)  # only the clients hold the write end: the server ends with them
        _serve(listener.detach(), alive_r)
    listener.close()
    os.close(alive_r)
    return address, alive_w, pid


def _serve(listener_fd: int, alive_r: int) -> None:
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # nothing to preload: the modules are here already; the workers' preparation data
        # (sys.path, cwd, the main module) still comes with each of them
        forkserver.main(listener_fd, alive_r, [], None, None)
        code = 0
    except SystemExit:
        code = 0
    except BaseException:  # noqa: BLE001 - the server's last words, then out without atexit
        sys.excepthook(*sys.exc_info())
    finally:
        os._exit(code)  # never this process's atexit handlers: they belong to the owner
