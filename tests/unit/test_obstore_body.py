"""The obstore backend's body reader: the first piece is pulled when the stream is opened,
and a failure of that pull reaches the reader (where a broken body is resumed)."""

import pytest

from pipeflow.backends.obstore import _Body


def _pieces(log, *parts, fail_at=None):
    for i, part in enumerate(parts):
        if i == fail_at:
            raise ConnectionResetError("connection reset mid-body")
        log.append(part)
        yield part


def test_prefetch_pulls_the_first_piece_and_no_more():
    pulled = []
    body = _Body(_pieces(pulled, b"a" * 10, b"b" * 10))
    body.prefetch()
    assert pulled == [b"a" * 10]
    assert body.peak_buffered == 10
    assert body.read(4) == b"aaaa"
    assert body.readall() == b"a" * 6 + b"b" * 10
    assert pulled == [b"a" * 10, b"b" * 10]


def test_a_failed_first_piece_is_raised_by_the_first_read_not_by_prefetch():
    body = _Body(_pieces([], b"a", fail_at=0))
    body.prefetch()  # the open itself succeeds: the response headers arrived
    with pytest.raises(ConnectionResetError):
        body.read(1)


def test_an_empty_body_reads_as_empty_after_prefetch():
    body = _Body(_pieces([]))
    body.prefetch()
    assert body.read(10) == b""
