"""Files pipeflow publishes: the usual permissions, and no temporary file outlives its writer.

``atomic_write`` and the local backend's ``upload`` (what ``write_shards`` publishes shards
with) write a temporary file and rename it into place. Its permissions are those of any file
the process writes (0666 less the umask, not ``mkstemp``'s 0600), and one left behind by a
writer killed with SIGKILL is removed by the next write into that directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import pipeflow as pf
from pipeflow._fs import atomic_write
from pipeflow.backends import get_backend


@pytest.fixture
def umask():
    def set_mask(mask: int) -> None:
        os.umask(mask)

    old = os.umask(0o022)
    yield set_mask
    os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_atomic_write_and_upload_honour_the_umask(tmp_path, umask, mask):
    umask(mask)
    atomic_write(str(tmp_path / "written"), b"x")
    src = tmp_path / "src"
    src.write_bytes(b"y")
    get_backend("local").upload(str(src), str(tmp_path / "out" / "uploaded"))
    for path in (tmp_path / "written", tmp_path / "out" / "uploaded"):
        assert os.stat(path).st_mode & 0o777 == 0o666 & ~mask, path


_KILLED_WRITER = textwrap.dedent("""
    import sys, threading, time
    from pipeflow.backends import get_backend
    fifo, dest = sys.argv[1], sys.argv[2]

    def feed():  # the source never ends: the upload stays inside its copy until killed
        with open(fifo, "wb") as f:
            f.write(b"z" * 1000)
            f.flush()
            time.sleep(3600)

    threading.Thread(target=feed, daemon=True).start()
    get_backend("local").upload(fifo, dest)
""")


def test_a_temporary_file_left_by_a_killed_writer_is_removed_by_the_next_write(tmp_path):
    out = tmp_path / "shards"
    out.mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(),
                                                                     os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(fifo), str(out / "x.tar")],
                            env=env)
    try:
        deadline = time.monotonic() + 60
        while not [p for p in os.listdir(out) if p.startswith(".upload-")]:
            if proc.poll() is not None:
                pytest.fail(f"the writer exited (status {proc.returncode}) before it made its temporary file")
            if time.monotonic() > deadline:
                pytest.fail("the writer made no temporary file within 60 s")
            time.sleep(0.05)
        assert proc.poll() is None, "the writer ended before it could be killed mid-upload"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = [p for p in os.listdir(out) if p.startswith(".upload-")]
    assert left, "the killed writer left nothing to clean up"
    samples = [{"__key__": f"s{i}", "bin": bytes([i]) * 100} for i in range(3)]
    pf.from_items(samples).write_shards(str(out))
    names = sorted(os.listdir(out))
    assert not [p for p in names if p.startswith(".upload-")], names
    assert "manifest.json" in names
