"""The obstore reader's own resume of a body cut mid-object.

object_store retries a cut body inside the request it is reading, so pipeflow's reopen (a
ranged GET from the last byte the reader got) only runs once those retries are spent. A policy
whose budget is shorter than object_store's first backoff gives object_store no retry at all
(``max_retries=0``) and leaves the cut to pipeflow: the test reaches the reopen every time.
"""

from __future__ import annotations

import os

import pytest

from pipeflow.backends import get_backend
from pipeflow.backends._retry import RetryPolicy
from pipeflow.testing.proxy import DelayProxy, Faults

pytest.importorskip("obstore")
pytestmark = pytest.mark.s3

SIZE = 102_400
CUT = 30_000  # body bytes the first GET delivers before its connection is reset
#: object_store's attempts come from the budget and the backoff: here one, no retry
NO_SDK_RETRY = RetryPolicy(budget=0.3, base_delay=10, max_delay=10)


def _cut_first_get(gets: list[str]):
    def hook(info):
        if info.method != "GET":
            return None
        gets.append(info.path)
        return "reset" if len(gets) == 1 else None
    return hook


@pytest.fixture(scope="module")
def blob(s3):
    data = os.urandom(SIZE)
    return s3.put(s3.make_bucket("obstore-reopen"), "blob.bin", data), data


@pytest.mark.parametrize("read_ahead", [0, 1], ids=["reader", "read-ahead"])
@pytest.mark.parametrize("start,end", [(0, None), (1_000, None), (1_000, 90_000)])
def test_a_body_cut_mid_object_is_reopened_at_the_byte_reached(s3, blob, read_ahead, start, end):
    url, data = blob
    gets: list[str] = []
    with DelayProxy(s3.endpoint, delay_ms=0, hook=_cut_first_get(gets),
                    faults=Faults(reset_after=CUT)) as proxy:
        backend = get_backend("obstore", endpoint=proxy.url, retry=NO_SDK_RETRY, chunk_size=4096,
                              read_ahead=read_ahead)
        stream = backend._stream(url, start, end)
        got = stream.read()
        resumes = stream.resumes
        stream.close()
    expected = data[start:end]
    assert len(got) == len(expected)
    assert got == expected
    assert resumes == 1, "pipeflow's own reopen ran (object_store did not retry the cut itself)"
    assert len(gets) == 2
