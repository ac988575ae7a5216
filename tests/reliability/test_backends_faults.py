"""Every S3 backend runs the fault suite that ships with pipeflow.

The suite is :mod:`pipeflow.testing.faults` (outage, 503 storm, body reset and clean close,
stalls before and inside a body, run side by side once per backend; the outage under DataLoader
workers); each backend is one subclass here, with its default options. The outage under
``torchrun`` with 2 ranks is ``test_faults_torchrun.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeflow.pipeline import from_items
from pipeflow.testing.faults import (
    CUT_AT,
    QUICK_RETRY,
    BackendFaults,
    FirstGets,
    assert_met_outage,
    check_epoch,
    digest,
    through_outage,
)
from pipeflow.testing.proxy import DelayProxy, Faults

pytestmark = [pytest.mark.s3, pytest.mark.timeout(120)]

#: the outage of the batched s5cmd case: as long as the one that outlasted its retries when the
#: budget was a count of them
BATCH_OUTAGE_S = 3.0


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

    def test_batched_run_outlives_an_outage_longer_than_its_retries(
            self, fault_data: dict[str, bytes], s3: Any, tmp_path: Any) -> None:
        # fetch_batch's `s5cmd run` makes no retries of its own: its files are retried in rounds
        # until the budget's deadline. A 10 s budget once became a count of s5cmd retries that
        # a 3 s outage outlasted; the budget is time now, and an outage that long fits in it.
        pipe = through_outage(
            lambda url: from_items(sorted(fault_data)).fetch_batch(
                "s5cmd", batch_size=4, to=str(tmp_path),
                options={"endpoint": url, "retry": {"budget": 10.0}}).map(digest),
            s3, fault_data, at=1, seconds=BATCH_OUTAGE_S)  # batches 0 and 1 are in; 2 meets it
        assert_met_outage(pipe.stats().counters("fetch_batch"))

    @pytest.mark.parametrize("action", ["reset", "close"])
    def test_batched_run_fetches_again_the_bodies_cut_mid_object(
            self, fault_data: dict[str, bytes], s3: Any, tmp_path: Any, action: str) -> None:
        # the first GET of every object is cut after CUT_AT bytes: s5cmd's record for the file
        # is Go's own network error ("unexpected EOF", "... connection reset by peer"), with no
        # S3 code; it once ended the epoch as a final BackendError
        hook = FirstGets(action, limit=len(fault_data))  # type: ignore[arg-type]
        with DelayProxy(s3.endpoint, delay_ms=0, hook=hook, faults=Faults(reset_after=CUT_AT)) as proxy:
            pipe = from_items(sorted(fault_data)).fetch_batch(
                "s5cmd", batch_size=4, to=str(tmp_path),
                options={"endpoint": proxy.url, "retry": QUICK_RETRY}).map(digest)
            check_epoch(list(pipe), fault_data)
            assert proxy.stats()["faults"].get(action, 0) == len(fault_data)
