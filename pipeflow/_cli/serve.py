"""``pipeflow serve``: run a local S3-compatible server until Ctrl-C."""

from __future__ import annotations

import argparse
import shlex
import signal
import socket
import sys
import threading

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=None, help="TCP port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--bucket", action="append", default=[], metavar="NAME",
                        help="create this bucket at start (repeatable)")
    parser.add_argument("--examples", action="store_true",
                        help="fill s3://bucket/ and s3://my-bucket/ with the small dataset the "
                             "README's and docs' examples read, so each runs as written")


def port_problem(port: int) -> str | None:
    """Why the server could not listen on ``127.0.0.1:port``, or None when it can."""
    if not 0 < port < 65536:
        return f"--port must be between 1 and 65535, got {port}"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            return (f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc} "
                    "(another program uses it; pick another --port, or omit it for a free one)")
    return None


def run(args: argparse.Namespace) -> int:
    from ..backends.base import bucket_name_problem
    from ..errors import PipeflowError
    from ..testing import local_s3

    problem = None if args.port is None else port_problem(args.port)
    problem = problem or next(filter(None, map(bucket_name_problem, args.bucket)), None)
    if problem:
        print(f"pipeflow serve: {problem}", file=sys.stderr)
        return 2
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with local_s3(port=args.port, buckets=args.bucket, export_env=False) as server:
            print("# a local S3-compatible server (moto) is running; in another shell:")
            for key, value in server.env().items():
                print(f"export {key}={shlex.quote(value)}")
            for bucket in args.bucket:
                print(f"# bucket: s3://{bucket}/")
            if args.examples:
                from ..testing.examples import put_examples

                print(f"# the docs' examples read: {' '.join(put_examples(server))}")
            print("# press Ctrl-C to stop", flush=True)
            try:
                while not stop.wait(0.5):
                    if server.process is not None and server.process.poll() is not None:
                        print(f"# the server exited with code {server.process.returncode}")
                        return 1
            except KeyboardInterrupt:
                pass
    except PipeflowError as exc:
        print(f"pipeflow serve: {exc}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
    print("# stopped")
    return 0
