"""Shared fixtures: a real local S3 server for the whole session, a fresh bucket per test."""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeflow.testing import LocalS3, local_s3

_bucket_counter = itertools.count()


@pytest.fixture(scope="session")
def s3() -> Iterator[LocalS3]:
    """moto's server in a child process on a free loopback port, for the whole session.

    While it runs, ``AWS_ENDPOINT_URL``, ``S3_ENDPOINT_URL``, dummy credentials, the region and
    ``AWS_EC2_METADATA_DISABLED`` are exported, so every backend finds it with no options.
    """
    with local_s3() as server:
        yield server


@pytest.fixture
def s3_bucket(s3: LocalS3) -> str:
    """A new, empty bucket with a unique name, created for this test."""
    name = f"t{os.getpid()}-{next(_bucket_counter)}-{uuid.uuid4().hex[:8]}"
    return s3.make_bucket(name)


@pytest.fixture
def local_dir(tmp_path: Path) -> Path:
    """An empty directory for local-backend data (removed by pytest's tmp_path handling)."""
    path = tmp_path / "data"
    path.mkdir()
    return path
