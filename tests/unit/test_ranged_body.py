"""RangedBody: ranged requests that grow from one size to a cap, at most two ahead, consecutive
ones overlapping."""

from __future__ import annotations

import threading
import time

import pytest

from pipeflow.backends._ranged import RangedBody

W = 64 << 10


class PastEnd(Exception):
    pass


class Server:
    """Serves ranges of ``data`` in 4 KiB chunks, each request waiting ``delay`` s before its first
    byte and ``per_chunk`` s before each chunk; records every request and how many were open at
    once (from the request to its last byte)."""

    def __init__(self, data: bytes, delay: float = 0.0, per_chunk: float = 0.0) -> None:
        self.data, self.delay, self.per_chunk = data, delay, per_chunk
        self.requests: list[tuple[int, int]] = []
        self.open_now = 0
        self.most_open = 0
        self.lock = threading.Lock()

    def fetch(self, lo: int, hi: int):
        with self.lock:
            self.requests.append((lo, hi))
            self.open_now += 1
            self.most_open = max(self.most_open, self.open_now)
        started = time.monotonic()
        server = self

        class Body:
            def __iter__(self):
                try:
                    if lo >= len(server.data):
                        raise PastEnd(lo)
                    time.sleep(max(0.0, server.delay - (time.monotonic() - started)))
                    body = server.data[lo:hi]
                    for i in range(0, len(body), 4096):
                        time.sleep(server.per_chunk)
                        yield body[i:i + 4096]
                finally:
                    with server.lock:
                        server.open_now -= 1

        return Body()


def _body(server: Server, **kw) -> RangedBody:
    return RangedBody(server.fetch, start=kw.pop("start", 0), end=kw.pop("end", None), range_size=W,
                        read_timeout=10, is_past_end=lambda e: isinstance(e, PastEnd), **kw)


def _read_slowly(body: RangedBody, pause: float = 0.0) -> bytes:
    out = []
    while chunk := body.read(16 << 10):
        out.append(chunk)
        if pause:
            time.sleep(pause)
    return b"".join(out)


def test_an_object_inside_one_window_costs_one_request():
    server = Server(bytes(range(256)) * 100, delay=0.01)
    with _body(server) as body:
        assert _read_slowly(body, pause=0.005) == server.data
    assert server.requests == [(0, W)]


@pytest.mark.parametrize("size", [8 * W, 8 * W - 1000, 3 * W + 5])
def test_consecutive_windows_overlap_within_the_two_window_bound(size):
    data = bytes((i * 7) % 251 for i in range(size))
    # the network is the bottleneck (the reader takes each chunk as it comes): the case where a
    # request waiting for the previous one's last byte would cost a round trip per range
    server = Server(data, delay=0.03, per_chunk=0.001)
    with _body(server) as body:
        got = _read_slowly(body)
        peak = body.peak_buffered
    assert got == data
    # two requests were open at once (a range's request started while the one before arrived)
    assert server.most_open == 2, server.requests
    assert 0 < peak <= 2 * W, peak
    ranges = -(-size // W)
    starts = [lo for lo, _ in server.requests]
    assert starts[:ranges] == [i * W for i in range(ranges)]
    # at most one request past the end (the probe of an object whose size is not known)
    assert len(server.requests) <= ranges + 1


def test_a_known_end_sends_nothing_past_it():
    data = bytes(5 * W)
    server = Server(data, delay=0.02)
    with _body(server, start=W, end=4 * W) as body:
        assert _read_slowly(body, pause=0.002) == data[W:4 * W]
    assert server.requests == [(W, 2 * W), (2 * W, 3 * W), (3 * W, 4 * W)]


def test_a_reader_that_stops_keeps_the_pump_two_windows_ahead_at_most():
    data = bytes(16 * W)
    server = Server(data)
    body = _body(server)
    body.read(10)
    time.sleep(0.3)  # the pump runs ahead as far as the bound lets it
    assert body.peak_buffered <= 2 * W
    assert [lo for lo, _ in server.requests] == [0, W]
    body.close()


@pytest.mark.parametrize("size", [20 * W, 20 * W - 1000])
def test_ranges_double_up_to_the_cap_and_stay_within_two_caps(size):
    data = bytes((i * 13) % 251 for i in range(size))
    server = Server(data, delay=0.01, per_chunk=0.0005)
    with _body(server, max_range_size=4 * W) as body:
        got = _read_slowly(body)
        peak = body.peak_buffered
    assert got == data
    sizes = [hi - lo for lo, hi in server.requests]
    # W, 2W, then 4W each: 20W in 7 requests (+ at most one probe past the end), not 20
    assert sizes[:3] == [W, 2 * W, 4 * W], sizes
    assert all(s == 4 * W for s in sizes[2:]), sizes
    assert len(sizes) <= 8, sizes
    assert 0 < peak <= 2 * 4 * W, peak


def test_a_stopped_reader_of_growing_ranges_holds_two_ranges_at_most():
    server = Server(bytes(64 * W))
    body = _body(server, max_range_size=8 * W)
    _ = body.read(10)
    time.sleep(0.3)
    # nothing past the second range was asked for while the reader sits in the first
    assert [lo for lo, _ in server.requests] == [0, W]
    while body.read(64 << 10):
        pass
    assert body.peak_buffered <= 2 * 8 * W
    body.close()


def test_a_cap_below_the_first_range_keeps_the_ranges_fixed():
    data = bytes(5 * W)
    server = Server(data)
    with _body(server, max_range_size=W // 2) as body:
        assert _read_slowly(body) == data
    assert {hi - lo for lo, hi in server.requests} == {W}


def test_a_size_from_the_check_ends_the_ranges_at_the_object():
    data = bytes((i * 3) % 251 for i in range(5 * W + 100))
    server = Server(data)
    checks = []

    def check():
        checks.append(1)
        return len(data)

    with _body(server, max_range_size=2 * W, check=check) as body:
        assert _read_slowly(body) == data
    # W, then 2W ranges clipped at the object's end: no probe past it
    assert server.requests == [(0, W), (W, 3 * W), (3 * W, 5 * W), (5 * W, 5 * W + 100)]
    assert len(checks) == 4  # before each range after the first, once after the last


class Changed(Exception):
    pass


class Logged(Server):
    """Logs every request and version check, in order, in ``events``."""

    def __init__(self, data: bytes, **kw) -> None:
        super().__init__(data, **kw)
        self.events: list[str] = []

    def fetch(self, lo, hi):
        self.events.append(f"get {lo // W}")
        return super().fetch(lo, hi)


def test_later_checks_run_after_their_range_is_requested_the_first_one_before():
    data = bytes(5 * W + 100)
    server = Logged(data)

    def check():
        server.events.append("check")
        return len(data)

    with _body(server, max_range_size=2 * W, check=check) as body:
        assert _read_slowly(body) == data
    # the first check bounds range 2, so it comes first; the HEADs of ranges 3 and 4 follow
    # their requests, which wait for no round trip; one more check after the last range
    assert server.events == ["get 0", "check", "get 1", "get 3", "check", "get 5", "check", "check"]


@pytest.mark.parametrize("failing", [2, 3])
def test_a_change_seen_after_a_request_fails_the_read_before_that_range_is_handed_over(failing):
    data = bytes((i * 7) % 253 for i in range(7 * W))
    server = Logged(data)
    calls = []

    def check():
        calls.append(1)
        if len(calls) == failing:
            raise Changed
        return len(data)

    body = _body(server, max_range_size=2 * W, check=check)
    got = b""
    with pytest.raises(Changed):
        while chunk := body.read(16 << 10):
            got += chunk
    body.close()
    # check 2 runs after the request of the range at 3W, check 3 after the one at 5W: none of
    # that range's bytes reached the reader, and what did is the object's own prefix
    assert data.startswith(got)
    assert len(got) <= (3 * W if failing == 2 else 5 * W)


def test_a_range_cut_short_of_a_known_size_is_a_transient_incomplete_read():
    import http.client

    data = bytes(6 * W)

    class Cutting(Server):
        def fetch(self, lo, hi):  # the third range stops half-way, without an error
            return super().fetch(lo, hi if lo != 3 * W else lo + W // 2)

    server = Cutting(data)
    body = _body(server, max_range_size=2 * W, check=lambda: len(data))
    got = b""
    with pytest.raises(http.client.IncompleteRead):
        while chunk := body.read(16 << 10):
            got += chunk
    body.close()
    # every byte before the cut was delivered, in order: a resume starts there
    assert got == data[:3 * W + W // 2]
