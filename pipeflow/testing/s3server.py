"""A real S3-compatible HTTP server on loopback, for tests, demos and benchmarks.

:func:`local_s3` starts moto's server mode (``python -m moto.server``) as a separate process on a
free ``127.0.0.1`` port, waits until it answers, exports the endpoint and dummy credentials into
``os.environ`` (so every backend, and tools such as s5cmd, find it with no options) and, on exit,
restores the environment and stops and reaps the process.

Example::

    from pipeflow.testing import local_s3

    with local_s3(buckets=["data"]) as s3:
        s3.put("data", "a.bin", b"hello")
        ...  # any S3 client now talks to s3.endpoint
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._parent import PR_SET_PDEATHSIG
from .._parent import prctl as _prctl
from ..backends.base import bucket_name_problem
from ..errors import ConfigError, MissingDependencyError, PipeflowError
from ._lifeline import start_tethered

__all__ = ["LocalS3", "death_signal_hook", "free_port", "local_s3"]

ACCESS_KEY = "testing"
SECRET_KEY = "testing"  # moto accepts any credentials; these are dummies, not secrets
REGION = "us-east-1"

#: variables that would make clients look elsewhere (a profile, a session) while the server runs
_CLEARED = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL_S3",
            "AWS_DEFAULT_PROFILE")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LocalS3:
    """A running local S3 server.

    Attributes:
        endpoint: ``http://127.0.0.1:PORT``.
        port: the TCP port.
        access_key, secret_key, region: the dummy credentials it accepts.
        process: the server process.
    """

    endpoint: str
    port: int
    access_key: str = ACCESS_KEY
    secret_key: str = field(default=SECRET_KEY, repr=False)
    region: str = REGION
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _client: Any = field(default=None, repr=False)

    def env(self) -> dict[str, str]:
        """The environment variables that point every backend at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "S3_ENDPOINT_URL": self.endpoint,  # s5cmd ignores AWS_ENDPOINT_URL
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self) -> Any:
        """A boto3 S3 client for this server (path-style addressing)."""
        if self._client is None:
            try:
                import boto3
                from botocore.config import Config
            except ImportError as exc:
                raise MissingDependencyError("boto3", "server") from exc
            self._client = boto3.client(
                "s3", endpoint_url=self.endpoint, region_name=self.region,
                aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
                config=Config(s3={"addressing_style": "path"}, max_pool_connections=32))
        return self._client

    def make_bucket(self, name: str) -> str:
        """Create a bucket (no error if it exists); returns its name."""
        client = self.client()
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        return name

    def put(self, bucket: str, key: str, data: bytes) -> str:
        """Upload one object; returns its ``s3://`` URL."""
        self.client().put_object(Bucket=bucket, Key=key, Body=data)
        return f"s3://{bucket}/{key}"

    def put_many(self, bucket: str, objects: Mapping[str, bytes]) -> list[str]:
        """Upload several objects; returns their URLs in the order given.

        Many are sent from 4 threads: the client's work on one request then overlaps the
        server's on others (2,018 empty objects to moto: 5.4 s, against 27.7 s one by one)."""
        items = list(objects.items())
        if len(items) < 64:
            return [self.put(bucket, key, data) for key, data in items]
        self.client()  # made once, before the threads share it
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(4, thread_name_prefix="pipeflow-put") as pool:
            return list(pool.map(lambda kv: self.put(bucket, kv[0], kv[1]), items))

    def put_dir(self, bucket: str, directory: str, prefix: str = "") -> list[str]:
        """Upload every file below ``directory`` under ``prefix``; returns the URLs, sorted."""
        urls = []
        for root, _, files in os.walk(directory):
            for fname in files:
                path = os.path.join(root, fname)
                key = prefix + os.path.relpath(path, directory).replace(os.sep, "/")
                with open(path, "rb") as fh:
                    self.client().put_object(Bucket=bucket, Key=key, Body=fh)
                urls.append(f"s3://{bucket}/{key}")
        return sorted(urls)

    def url(self, bucket: str, key: str = "") -> str:
        return f"s3://{bucket}/{key}"


def _wait_until_up(proc: subprocess.Popen[bytes], endpoint: str, log_path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            with open(log_path, errors="replace") as fh:
                log = fh.read()[-2000:]
            raise PipeflowError(f"the local S3 server exited with code {proc.returncode}:\n{log}")
        try:
            with urllib.request.urlopen(endpoint + "/moto-api/", timeout=1.0) as resp:
                if resp.status < 500:
                    return
        except urllib.error.HTTPError as exc:  # any HTTP answer means it is serving
            if exc.code < 500:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise PipeflowError(f"the local S3 server did not answer on {endpoint} within {timeout:.0f} s")
        time.sleep(0.1)


def death_signal_hook() -> Callable[[], None] | None:
    """The ``preexec_fn`` for the server process: on Linux, when called from the main thread
    (which lives as long as the process), a hook that makes the child get SIGTERM at once if the
    process that started it dies without cleaning up (SIGKILL); else None.

    PR_SET_PDEATHSIG fires when the parent *thread* that forked the child exits, not the
    process: a server started by a worker thread would die with that thread, so none is set
    there (``_stop()`` still reaps it, and from any thread the lifeline, ``_lifeline.py``, ends
    the server when the process dies). ``prctl`` is looked up here, in the parent: the hook runs
    between fork and exec, where importing a module or loading a library could wait forever on
    a lock another of the parent's threads held at the fork; it only makes the one call."""
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None  # the thread may exit long before the server should; _stop() still reaps it
    prctl = _prctl()
    if prctl is None:
        return None
    signum = int(signal.SIGTERM)

    def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
        prctl(PR_SET_PDEATHSIG, signum)

    return die_with_parent


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@contextlib.contextmanager
def _exported(env: Mapping[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in (*env, *_CLEARED)}
    try:
        for key in _CLEARED:
            os.environ.pop(key, None)
        os.environ.update(env)
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def local_s3(*, port: int | None = None, buckets: Iterable[str] = (), export_env: bool = True,
             timeout: float = 60.0) -> Iterator[LocalS3]:
    """Run moto's S3 server in a child process for the duration of the ``with`` block.

    Args:
        port: the port to listen on (default: a free one).
        buckets: buckets to create up front.
        export_env: export the endpoint and credentials (:meth:`LocalS3.env`) into
            ``os.environ`` while the block runs, restoring the previous values afterwards.
        timeout: seconds to wait for the server to answer.

    Yields:
        a :class:`LocalS3` with the endpoint, credentials and upload helpers.

    Raises:
        MissingDependencyError: moto's server extra is not installed.
        ConfigError: a name in ``buckets`` is not a valid bucket name (before anything starts).
    """
    buckets = list(buckets)
    problem = next(filter(None, map(bucket_name_problem, buckets)), None)
    if problem:
        raise ConfigError(problem)
    try:
        import moto.server  # noqa: F401  (only to fail early with the install hint)
    except ImportError as exc:
        raise MissingDependencyError("moto[server]", "server") from exc
    port = port or free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log_fd, log_path = tempfile.mkstemp(prefix="pipeflow-moto-", suffix=".log")
    child_env = dict(os.environ)
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    try:
        # tethered: the server ends with this process even when a thread that has since ended
        # started it and this process is then killed outright (see _lifeline.py)
        # the log holds what the server says when it fails (shown then), not a line per request
        # (werkzeug's, at INFO): a long benchmark or `pipeflow serve` sends millions
        tether = start_tethered("moto.server", ["-H", "127.0.0.1", "-p", str(port)], quiet=("werkzeug",),
                                stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd, env=child_env,
                                preexec_fn=death_signal_hook())
    finally:
        os.close(log_fd)
    proc = tether.process
    try:
        _wait_until_up(proc, endpoint, log_path, timeout)
        server = LocalS3(endpoint=endpoint, port=port, process=proc)
        for bucket in buckets:
            server.make_bucket(bucket)
        with _exported(server.env()) if export_env else contextlib.nullcontext():
            yield server
    finally:
        _stop(proc)
        tether.release()
        with contextlib.suppress(OSError):
            os.unlink(log_path)
