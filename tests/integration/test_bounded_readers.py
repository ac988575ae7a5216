"""Every S3 reader holds a bounded part of an object, whatever its size.

Each test streams a 64 MB object from the local server in 1 MiB reads and watches the reader's
own buffer (not the process's RSS): the bytes it holds, or has requested and not yet handed out.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest

from pipeflow.backends import get_backend

pytestmark = [pytest.mark.s3, pytest.mark.timeout(180)]

SIZE = 64 << 20
READ = 1 << 20


@pytest.fixture(scope="module")
def big(s3):
    bucket = s3.make_bucket("bounded-readers")
    data = os.urandom(1 << 20) * (SIZE >> 20)
    return s3.put(bucket, "big.bin", data), hashlib.sha256(data).hexdigest()


def _stream(stream, held) -> tuple[str, int]:
    """Read to the end; returns the digest and the largest ``held(raw)`` seen."""
    digest = hashlib.sha256()
    peak = 0
    with stream:
        while True:
            chunk = stream.read(READ)
            if not chunk:
                break
            digest.update(chunk)
            raw = stream._raw  # the SDK's reader under pipeflow's resumable wrapper
            if raw is not None:
                peak = max(peak, held(raw))
    return digest.hexdigest(), peak


def _fsspec_cache(raw) -> int:
    cache = raw.cache  # fsspec's read-ahead cache of the open file
    return len(getattr(cache, "cache", b"") or b"")


@pytest.mark.parametrize("backend", ["s3fs", "fsspec"])
def test_fsspec_readers_hold_one_block(big, backend):
    url, expected = big
    block = 8 << 20
    digest, peak = _stream(get_backend(backend, block_size=block).open(url), _fsspec_cache)
    assert digest == expected
    assert 0 < peak <= block + READ, peak


def test_fsspec_default_block_is_bounded_too(big):
    url, expected = big
    digest, peak = _stream(get_backend("s3fs").open(url), _fsspec_cache)
    assert digest == expected
    assert 0 < peak <= (50 << 20) + READ < SIZE, peak  # s3fs's 50 MiB block, not the object


def test_iopath_reads_chunks_not_the_whole_object(big):
    url, expected = big
    be = get_backend("iopath")
    digest, peak = _stream(be.open(url), lambda raw: len(raw.buffer.getbuffer()))
    assert digest == expected
    # iopath's chunk ranges are inclusive at both ends: one byte more than chunk_size
    assert 0 < peak <= be.options.chunk_size + 1, peak


def test_obstore_holds_one_piece(big):
    pytest.importorskip("obstore")
    url, expected = big
    be = get_backend("obstore", chunk_size=1 << 20)
    digest, peak = _stream(be.open(url), lambda raw: raw.peak_buffered)
    assert digest == expected
    # object_store hands over pieces of at least chunk_size, grown by at most one network read
    assert 0 < peak <= 4 << 20, peak


def test_obstore_stream_has_its_first_piece_when_open_returns(big):
    # open() runs on a pool thread ahead of the reader: the first piece is pulled there, so a
    # shard opened ahead is ready to parse when the reader reaches it (and it stays one piece)
    pytest.importorskip("obstore")
    url, expected = big
    stream = get_backend("obstore", chunk_size=1 << 20).open(url)
    held = stream._raw.peak_buffered
    assert 1 << 20 <= held <= 4 << 20, held
    digest, _ = _stream(stream, lambda raw: raw.peak_buffered)
    assert digest == expected


def _wait_for(predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("ahead", [1, 2])
def test_obstore_read_ahead_keeps_pulling_while_the_reader_works_within_its_bound(big, ahead):
    # the connection is read ahead of the reader (a socket left unread makes the sender stop and
    # the next read wait for it), but no further than read_ahead pieces
    pytest.importorskip("obstore")
    url, expected = big
    be = get_backend("obstore", read_ahead=ahead)
    chunk = be.options.chunk_size
    stream = be.open(url)
    raw = stream._raw
    # nobody reads: pieces are pulled all the same (more than the first, which open() pulls),
    # up to read_ahead + 1 (one in the thread's hand)
    assert _wait_for(lambda: raw.pulled >= 2), raw.pulled
    time.sleep(0.3)
    assert raw.pulled == ahead + 1, raw.pulled
    digest, peak = _stream(stream, lambda r: r.peak_buffered)
    assert digest == expected
    # the documented bound: read_ahead + 2 pieces, each chunk_size grown by at most one network read
    assert chunk <= peak <= (ahead + 2) * (chunk + (1 << 20)), peak
    assert not [t for t in threading.enumerate() if t.name == "pipeflow-obstore-read-ahead" and t.is_alive()]


def test_crt_holds_two_windows(big):
    pytest.importorskip("s3torchconnector")
    url, expected = big
    be = get_backend("s3torchconnector")
    digest, peak = _stream(be.open(url), lambda raw: raw.peak_buffered)
    assert digest == expected
    assert 0 < peak <= 2 * be.options.effective_max_range_size, peak
    assert peak < SIZE, peak  # ranges grow to the cap, never to the object
