"""The second benchmark server: s3rver (npm), whose ranged GETs cost what the range costs.

moto copies the whole object on every GET, ranged ones included, so a client that splits a
256 MB object into 8 MB ranges makes moto copy 256 MB per part. s3rver serves a range with a
file stream over that range only, which is closer to what S3 charges a client in time.

The npm package is installed once into a user cache directory
(``$XDG_CACHE_HOME/pipeflow/s3rver`` or ``~/.cache/pipeflow/s3rver``) and started on a free
loopback port with a fresh data directory; it is stopped (and its directory removed) on exit.
Node.js and npm must be on ``PATH``; nothing else in pipeflow or its tests needs them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from pipeflow.testing.s3server import death_signal_hook, free_port

PACKAGE = "s3rver@3"
#: s3rver accepts exactly this key pair (and signs nothing else)
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER"}


class NodeMissingError(RuntimeError):
    """Node.js or npm is not installed, so the s3rver server cannot run."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "pipeflow" / "s3rver"


def _require(tool: str) -> str:
    found = shutil.which(tool)
    if not found:
        raise NodeMissingError(
            f"--server s3rver needs Node.js and npm on PATH ({tool!r} was not found); install "
            "Node.js (e.g. 'apt-get install nodejs npm') or use --server moto"
        )
    return found


def ensure_installed(directory: Path | None = None, *, log=print) -> Path:
    """Install s3rver into ``directory`` unless it is there already; returns its executable."""
    directory = directory or cache_dir()
    exe = directory / "node_modules" / ".bin" / "s3rver"
    if exe.exists():
        _require("node")
        return exe
    npm = _require("npm")
    _require("node")
    directory.mkdir(parents=True, exist_ok=True)
    log(f"installing {PACKAGE} into {directory} (once)")
    done = subprocess.run(
        [npm, "install", "--prefix", str(directory), "--no-audit", "--no-fund", "--silent", PACKAGE],
        capture_output=True, text=True, timeout=600,
    )
    if done.returncode != 0 or not exe.exists():
        raise RuntimeError(f"npm install {PACKAGE} failed ({done.returncode}): {done.stderr[-1500:]}")
    return exe


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"s3rver exited with code {proc.returncode} before it answered")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # any HTTP answer (403 for an unsigned request) means it is listening
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"s3rver did not answer on {url} within {timeout:g} s")


@contextlib.contextmanager
def running(*, directory: Path | None = None, timeout: float = 30.0, log=print) -> Iterator[str]:
    """Start s3rver on a free loopback port; yields its endpoint URL, stops it on exit."""
    exe = ensure_installed(directory, log=log)
    data = Path(tempfile.mkdtemp(prefix="pipeflow-s3rver-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # its own process group, so the node process and anything it spawns stop together
    proc = subprocess.Popen(
        [str(exe), "-d", str(data), "-a", "127.0.0.1", "-p", str(port), "--silent"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        # s3rver 3 makes its continuation tokens with a cipher OpenSSL 3 (Node >= 17) keeps in
        # the legacy provider: without it, any listing of more than one page fails (500)
        env={**os.environ, "NODE_OPTIONS": "--openssl-legacy-provider"},
        preexec_fn=death_signal_hook(),  # a benchmark killed outright takes its server along
    )
    try:
        _wait_ready(url, proc, timeout)
        yield url
    finally:
        _stop(proc)
        shutil.rmtree(data, ignore_errors=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.stderr:
        proc.stderr.close()
