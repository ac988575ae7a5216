"""The local S3 server's log (a temporary file while it runs): what it says when it fails, never a
line per request, which a long benchmark or `pipeflow serve` would grow without bound."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from pipeflow.errors import PipeflowError
from pipeflow.testing import local_s3

pytestmark = [pytest.mark.s3,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]


def test_requests_leave_no_line_in_the_servers_log(s3, s3_bucket):
    log = os.readlink(f"/proc/{s3.process.pid}/fd/1")   # the server's stdout and stderr
    client = s3.client()
    for i in range(20):
        client.put_object(Bucket=s3_bucket, Key=f"k{i}", Body=b"x")
        client.get_object(Bucket=s3_bucket, Key=f"k{i}")["Body"].read()
    client.list_objects_v2(Bucket=s3_bucket)
    with open(log, errors="replace") as f:
        text = f.read()
    assert '"GET ' not in text and '"PUT ' not in text, text[-2000:]


def test_a_server_that_cannot_start_still_says_why():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PipeflowError, match=rf"exited with code 1:\n(.|\n)*Port {port} is in use"):
            with local_s3(port=port, export_env=False):
                pass
