"""Shared fixtures: a real local S3 server for the whole session, a fresh bucket per test."""

from __future__ import annotations

import itertools
import multiprocessing.util
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeflow.testing import LocalS3, local_s3

_bucket_counter = itertools.count()


#: the system temp directory as it was before the suite pointed TMPDIR elsewhere
_SYSTEM_TMP = tempfile.gettempdir()
#: names of what processes started by the suite would leave there (multiprocessing's pymp-*,
#: torchrun's torchelastic_*, pipeflow's and s5cmd's staging, tempfile's tmp*)
_LEAK_PREFIXES = ("pymp-", "torchelastic_", "pipeflow-", "s5cmd-run-", "tmp")
_STARTED = time.time()
_BEFORE = set(os.listdir(_SYSTEM_TMP))
_LEAKED = pytest.StashKey[list]()
_OURS: set[str] = set()


def _new_in_system_tmp() -> list[str]:
    found = []
    for entry in os.scandir(_SYSTEM_TMP):
        if entry.name in _BEFORE or entry.name in _OURS or not entry.name.startswith(_LEAK_PREFIXES):
            continue
        try:
            created = entry.stat(follow_symlinks=False).st_mtime
        except FileNotFoundError:
            continue
        if created >= _STARTED:
            found.append(entry.name)
    return sorted(found)


@pytest.fixture(scope="session", autouse=True)
def private_temp_dir(tmp_path_factory) -> Iterator[Path]:
    """Every temporary file of the run, in this process and in every process it starts, goes
    under pytest's own temporary directory instead of the system one.

    Workers that end with ``os._exit`` (DataLoader workers, resume and crash tests) never remove
    multiprocessing's ``pymp-*`` folder, and torchrun leaves a ``torchelastic_*`` folder per
    launch: there they are removed with the rest of pytest's old temporary directories.
    """
    # this process's own multiprocessing folder stays in the system temp dir: this process exits
    # normally and removes it then, after pytest has released its temporary directory (which a
    # concurrent pytest run may then already have deleted)
    _OURS.add(os.path.basename(multiprocessing.util.get_temp_dir()))
    path = tmp_path_factory.mktemp("tmp", numbered=False)
    patch = pytest.MonkeyPatch()
    patch.setenv("TMPDIR", str(path))
    patch.setattr(tempfile, "tempdir", str(path))
    yield path
    patch.undo()


def pytest_sessionfinish(session, exitstatus):
    # other programs on the machine may create such names meanwhile, so this is a report; set
    # PIPEFLOW_STRICT_TMP=1 on a machine of its own to make it fail the run
    leaked = _new_in_system_tmp()
    session.config.stash[_LEAKED] = leaked
    if leaked and os.environ.get("PIPEFLOW_STRICT_TMP") and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    leaked = config.stash.get(_LEAKED, [])
    if leaked:
        terminalreporter.write_line(f"new entries in the system temp dir {_SYSTEM_TMP}: {leaked}",
                                    red=bool(os.environ.get("PIPEFLOW_STRICT_TMP")))


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
