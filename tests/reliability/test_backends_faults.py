"""Every S3 backend runs the fault suite that ships with pipeflow.

The suite is :mod:`pipeflow.testing.faults` (outage, 503 storm, body reset and clean close,
stalls before and inside a body, the outage under DataLoader workers); each backend is one
subclass here, with its default options. The outage under ``torchrun`` with 2 ranks is
``test_faults_torchrun.py``.
"""

from __future__ import annotations

import pytest

from pipeflow.testing.faults import BackendFaults

pytestmark = [pytest.mark.s3, pytest.mark.timeout(120)]


class TestObstore(BackendFaults):  # the default backend for s3:// URLs
    backend_name = "obstore"
    fork_safe = False  # its runtime does not survive a fork


class TestBoto3(BackendFaults):
    backend_name = "boto3"


class TestS3fs(BackendFaults):
    backend_name = "s3fs"


class TestFsspec(BackendFaults):
    backend_name = "fsspec"


class TestIopath(BackendFaults):
    backend_name = "iopath"
    backend_options = {"chunk_size": 4096}  # several ranged GETs per object


class TestS3TorchConnector(BackendFaults):
    backend_name = "s3torchconnector"


class TestS5cmd(BackendFaults):
    backend_name = "s5cmd"
