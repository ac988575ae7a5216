"""``pipeflow bench --server s3rver``: the npm server starts on a free port, serves ranged GETs
and stops. Runs only where Node.js and an installed s3rver are already there (CI installs
neither); the missing-Node message is checked everywhere."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import s3rver  # noqa: E402


def _needs_s3rver() -> None:
    installed = s3rver.cache_dir() / "node_modules" / ".bin" / "s3rver"
    if not shutil.which("node") or not installed.exists():
        pytest.skip("needs Node.js and s3rver installed by a `pipeflow bench --server s3rver` run")


def test_without_node_the_error_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no node, no npm
    with pytest.raises(s3rver.NodeMissingError, match="Node.js and npm.*--server moto"):
        s3rver.ensure_installed(tmp_path / "s3rver", log=lambda _: None)
    assert not (tmp_path / "s3rver").exists()  # nothing half-installed


@pytest.mark.s3
@pytest.mark.timeout(120)
def test_s3rver_serves_ranges_and_stops():
    _needs_s3rver()
    import psutil

    from benchmarks import scenarios

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with scenarios._server("s3rver", log=lambda _: None) as url:
        scenarios._make_bucket(url)
        client = scenarios._client(url)
        client.put_object(Bucket=scenarios.BUCKET, Key="r/obj", Body=bytes(range(256)) * 40)
        part = client.get_object(Bucket=scenarios.BUCKET, Key="r/obj", Range="bytes=10-19")["Body"].read()
        assert part == bytes(range(10, 20))
        started = {p.pid for p in psutil.Process().children(recursive=True)} - before
        assert started
    survivors = [p for p in started if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert survivors == []


_KILLED_PARENT = """
import sys, time
sys.path.insert(0, sys.argv[1])
from benchmarks import s3rver
with s3rver.running(log=lambda _: None) as url:
    print(url, flush=True)
    time.sleep(600)
"""


@pytest.mark.s3
@pytest.mark.timeout(120)
def test_s3rver_dies_with_a_benchmark_killed_outright():
    _needs_s3rver()
    import signal
    import subprocess
    import time

    import psutil

    root = str(Path(__file__).resolve().parents[2])
    parent = subprocess.Popen([sys.executable, "-c", _KILLED_PARENT, root], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline().startswith("http://127.0.0.1:")
        server = psutil.Process(parent.pid).children(recursive=True)
        assert server
        parent.send_signal(signal.SIGKILL)  # no finally block, no atexit
        parent.wait()
        deadline = time.monotonic() + 15
        alive = server
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            time.sleep(0.1)
        assert alive == [], [p.cmdline() for p in alive]
    finally:
        parent.kill()
        parent.wait()
