"""The fault suite's outage under ``torchrun`` with 2 ranks, for every S3 backend.

One launch: the ranks read their shares with every backend at once; once every backend on both
ranks has read something, the store goes down (connections refused) and comes back ``OUTAGE_S``
seconds after the last of them has gone on reading. Every object must be read exactly once
across the ranks by each backend, byte-identical, and each backend on both ranks must have met
the outage (retries counted in ``stats()``).
"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from pipeflow.testing.faults import OUTAGE_S, check_epoch, fault_objects
from pipeflow.testing.proxy import DelayProxy

from ._launch import torchrun
from .conftest import FIGURES

pytestmark = [pytest.mark.s3, pytest.mark.slow, pytest.mark.timeout(400)]

BACKENDS = ["obstore", "boto3", "s3fs", "fsspec", "iopath", "s3torchconnector", "s5cmd"]
#: objects in all: enough that each rank has many left to read when the store goes down
OBJECTS = 48


def _wait_for(out: str, step: str, stop: threading.Event) -> bool:
    """Until every backend on both ranks has written its ``step`` file (False: the test ended)."""
    paths = [os.path.join(out, f"{step}-{backend}-{r}") for backend in BACKENDS for r in (0, 1)]
    while not all(map(os.path.exists, paths)):
        if stop.wait(0.02):
            return False
    return True


def _conduct(out: str, proxy: DelayProxy, stop: threading.Event) -> None:
    """Once every backend on both ranks has read, take the store down and let them go on; bring
    it back OUTAGE_S after the last of them has gone on (14 readers in two busy processes may
    take a while to, and each must meet the outage)."""
    if not _wait_for(out, "started", stop):
        return
    proxy.down()
    try:
        open(os.path.join(out, "go"), "w").close()
        if _wait_for(out, "resumed", stop):
            time.sleep(OUTAGE_S)
    finally:
        proxy.up()


def test_an_outage_under_torchrun_loses_and_duplicates_nothing(s3, tmp_path):
    objects = fault_objects(OBJECTS)
    bucket = s3.make_bucket("faults-torchrun")
    urls = s3.put_many(bucket, objects)
    expected = dict(zip(urls, objects.values(), strict=True))
    (tmp_path / "urls.json").write_text(json.dumps(urls))
    stop = threading.Event()
    with DelayProxy(s3.endpoint, delay_ms=0) as proxy:
        conductor = threading.Thread(target=_conduct, args=(str(tmp_path), proxy, stop), daemon=True)
        conductor.start()
        started = time.monotonic()
        try:
            results = torchrun("faults_torchrun.py", tmp_path, proxy.url, *BACKENDS, timeout=360)
        finally:
            stop.set()
            conductor.join(30)
    assert results["world_size"] == 2
    for backend in BACKENDS:
        parts = results[backend]
        for rank, part in enumerate(parts):
            assert part["ok"], f"{backend}, rank {rank}: {part['error']}\n{part['traceback']}"
        got = [tuple(item) for part in parts for item in part["data"][0]]
        check_epoch(got, expected)  # type: ignore[arg-type]
        seen = [(len(part["data"][0]), part["data"][1]) for part in parts]
        assert all(part["data"][1] > 0 for part in parts), \
            f"{backend}: a rank never met the outage (items, retries per rank: {seen})"
        assert all(part["data"][0] for part in parts), f"{backend}: a rank read nothing"
    FIGURES["samples checked"] += len(BACKENDS) * len(expected)
    FIGURES["torchrun outage seconds"] += round(time.monotonic() - started)
