"""The obstore backend's body reader: the first piece is pulled when the stream is opened,
a failure of that pull reaches the reader (where a broken body is resumed), and read-ahead
pulls pieces while the reader works, within its bound, on a thread that ends with the body."""

import gc
import threading
import time

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


def _wait_for(predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert predicate(), "the condition never held"


def _endless(log):
    while True:
        log.append(8)
        yield b"x" * 8


def _reader_threads():
    return [t for t in threading.enumerate() if t.name == "pipeflow-obstore-read-ahead" and t.is_alive()]


def test_read_ahead_pulls_while_nobody_reads_and_stops_at_its_bound():
    pulled = []
    body = _Body(_pieces(pulled, *[bytes([i]) * 10 for i in range(20)]), ahead=3)
    body.prefetch()
    _wait_for(lambda: len(pulled) >= 4)
    time.sleep(0.2)
    assert len(pulled) == 4  # three waiting, one in the thread's hand
    assert body.read(15) == bytes([0]) * 10
    assert body.read(15) == bytes([1]) * 10
    _wait_for(lambda: len(pulled) >= 6)
    assert body.readall() == b"".join(bytes([i]) * 10 for i in range(2, 20))
    assert body.read(1) == b""  # the end stays the end
    assert body.peak_buffered <= 5 * 10
    body.close()
    assert not _reader_threads()


def test_read_ahead_hands_a_mid_body_failure_to_the_reader_after_the_good_pieces():
    body = _Body(_pieces([], b"a" * 4, b"b" * 4, b"c" * 4, fail_at=2), ahead=2)
    body.prefetch()
    assert body.read(8) == b"a" * 4
    assert body.read(8) == b"b" * 4
    with pytest.raises(ConnectionResetError):
        body.read(8)
    body.close()
    assert not _reader_threads()


def test_closing_or_dropping_a_body_read_ahead_ends_its_thread():
    body = _Body(_endless([]), ahead=2)
    body.prefetch()
    assert body.read(4) == b"xxxx"
    body.close()
    assert not _reader_threads()
    pulled = []
    dropped = _Body(_endless(pulled), ahead=2)
    dropped.prefetch()
    _wait_for(lambda: len(pulled) >= 3)
    del dropped  # never closed: its finalizer stops the thread
    gc.collect()
    _wait_for(lambda: not _reader_threads())
