"""Copying a folder of small files into a bucket: ``pipeflow.upload`` (with each backend
that uploads) against a hand-written boto3 loop (one ``upload_file`` per file, one thread), on
a local moto server started here.

    python -m benchmarks.upload --files 4000 --size 2048 --repeats 3

Prints one line per run: seconds and files/s. Server and client share the machine's cores,
so compare the two in one run, never across runs.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def _make_folder(root: str, files: int, size: int) -> None:
    for i in range(files):
        path = os.path.join(root, f"part-{i % 10}", f"{i:06d}.bin")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(os.urandom(size))


def _boto3_loop(server, root: str, bucket: str) -> None:
    client = server.client()
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            key = "boto3/" + os.path.relpath(path, root).replace(os.sep, "/")
            client.upload_file(path, bucket, key)


def main() -> None:
    import pipeflow as pf
    from pipeflow.testing.s3server import local_s3

    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--size", type=int, default=2048, help="bytes a file")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--backends", default="boto3,obstore",
                        help="comma-separated backends for pipeflow.upload (default boto3,obstore)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root, local_s3() as server:
        _make_folder(root, args.files, args.size)
        for repeat in range(args.repeats):
            bucket = server.make_bucket(f"upload-bench-{repeat}")
            t0 = time.perf_counter()
            _boto3_loop(server, root, bucket)
            loop_s = time.perf_counter() - t0
            line = (f"run {repeat}: {args.files} files of {args.size} B: boto3 loop {loop_s:.1f} s "
                    f"({args.files / loop_s:.0f} files/s)")
            for backend in args.backends.split(","):
                result = pf.upload(root, f"s3://{bucket}/{backend}", workers=args.workers,
                                   backend=backend)
                line += (f"; upload(backend={backend!r}, workers={args.workers}) "
                         f"{result.seconds:.1f} s ({result.uploaded / result.seconds:.0f} files/s, "
                         f"{loop_s / result.seconds:.2f}x)")
            print(line, flush=True)

if __name__ == "__main__":
    main()
