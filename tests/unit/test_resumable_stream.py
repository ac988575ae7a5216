"""ResumableStream's edges, where a slip loses or repeats bytes: exact read sizes, the end of the
object, consecutive failures and the resume budget (the survivors of a mutation run)."""

from __future__ import annotations

import io
import random

import pytest

from pipeflow.backends._resumable import ResumableStream
from pipeflow.backends._retry import RetryPolicy
from pipeflow.errors import RetryExhaustedError

DATA = random.Random(7).randbytes(10_000)


class _Body(io.RawIOBase):
    """Serves ``data`` from ``offset``, ``step`` bytes per read at most; raises a reset once it has
    delivered ``cut`` bytes (None: never); records whether it was closed."""

    def __init__(self, data: bytes, offset: int, *, step: int = 1 << 20, cut: int | None = None) -> None:
        self._data, self._pos, self._step, self._cut = data, offset, step, cut
        self.was_closed = False

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:  # type: ignore[override]
        if self._cut is not None and self._cut <= 0:
            raise ConnectionResetError("connection reset")
        n = min(len(buf), self._step, len(self._data) - self._pos)
        if self._cut is not None:
            n = min(n, self._cut)
            self._cut -= n
        buf[:n] = self._data[self._pos:self._pos + n]
        self._pos += n
        return n

    def close(self) -> None:
        self.was_closed = True
        super().close()


def _stream(opener, **kw) -> ResumableStream:
    kw.setdefault("policy", RetryPolicy(max_attempts=3, base_delay=0.0, max_delay=0.0, max_resumes=100))
    return ResumableStream(opener, size=len(DATA), sleep=lambda s: None, **kw)


@pytest.mark.parametrize("step", [1, 3, 4096])
@pytest.mark.parametrize("size", [1, 10, 2500])
def test_read_n_returns_exactly_n_bytes_from_a_body_that_trickles(step, size):
    stream = _stream(lambda off: _Body(DATA, off, step=step))
    got = []
    while chunk := stream.read(size):
        assert len(chunk) == size or stream.tell() == len(DATA), (len(chunk), stream.tell())
        got.append(chunk)
    assert b"".join(got) == DATA


def test_read1_returns_at_most_n_bytes():
    stream = _stream(lambda off: _Body(DATA, off))
    assert stream.read1(10) == DATA[:10]
    assert stream.tell() == 10


def test_reading_zero_bytes_reads_nothing():
    stream = _stream(lambda off: _Body(DATA, off))
    assert stream.read(0) == b""
    assert stream.read1(0) == b""
    assert stream.tell() == 0
    assert stream.read(5) == DATA[:5]


def test_a_cut_after_the_last_byte_does_not_reopen_past_the_end():
    offsets = []

    def opener(offset):
        offsets.append(offset)
        # the whole object arrives, then the connection breaks instead of a clean end
        return _Body(DATA, offset, cut=len(DATA) - offset)

    stream = _stream(opener)
    assert stream.read(len(DATA)) == DATA
    assert stream.read(10) == b""
    assert stream.read() == b""
    assert offsets == [0], "a complete object needs no second request"


def test_failures_count_only_while_no_byte_arrives():
    # every connection breaks after 100 bytes: 100 resumptions, each one after progress, so the
    # limit of 2 consecutive failures is never reached
    policy = RetryPolicy(max_attempts=2, base_delay=0.0, max_delay=0.0, max_resumes=1000)
    stream = _stream(lambda off: _Body(DATA, off, cut=100), policy=policy)
    assert stream.read() == DATA
    assert stream.resumes == len(DATA) // 100 - 1 + 1  # the last cut comes after the last byte


@pytest.mark.parametrize("max_resumes", [1, 3])
def test_max_resumes_allows_exactly_that_many(max_resumes):
    policy = RetryPolicy(max_attempts=10, base_delay=0.0, max_delay=0.0, max_resumes=max_resumes)
    piece = len(DATA) // (max_resumes + 1) + 1  # max_resumes cuts before the end, none after
    assert _stream(lambda off: _Body(DATA, off, cut=piece), policy=policy).read() == DATA

    smaller = len(DATA) // (max_resumes + 2) + 1  # one cut more than allowed
    with pytest.raises(RetryExhaustedError):
        _stream(lambda off: _Body(DATA, off, cut=smaller), policy=policy).read()


def test_a_broken_body_is_closed_before_the_resume():
    bodies = []

    def opener(offset):
        bodies.append(_Body(DATA, offset, cut=3000))
        return bodies[-1]

    stream = _stream(opener)
    assert stream.read() == DATA
    assert all(body.was_closed for body in bodies[:-1])
    stream.close()
    assert bodies[-1].was_closed


def test_a_permanent_error_without_translation_keeps_its_type():
    def opener(offset):
        raise KeyError("gone")

    stream = _stream(opener)
    with pytest.raises(KeyError):
        stream.read(10)
