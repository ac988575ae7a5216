"""The delay-line proxy against a tiny local HTTP/1.1 server."""

from __future__ import annotations

import http.client
import http.server
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from pipeflow.testing.proxy import DelayProxy, Faults, ProxyProcess, RequestInfo


def _body(n: int) -> bytes:
    return bytes(range(256)) * (n // 256) + bytes(range(n % 256))


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: Counter[str]

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.seen[self.command] += 1
        if "list-type=" in self.path:
            self.send_response(200)
            self.send_header("Content-Length", "19")
            self.end_headers()
            self.wfile.write(b"<ListBucketResult/>")
            return
        if self.path.startswith("/chunked/"):
            n = int(self.path.rsplit("/", 1)[1])
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            data = _body(n)
            for i in range(0, n, 1000):
                piece = data[i:i + 1000]
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        n = int(self.path.rsplit("/", 1)[1])
        self.send_response(200)
        self.send_header("Content-Length", str(n))
        self.end_headers()
        self.wfile.write(_body(n))

    def do_HEAD(self) -> None:
        self.seen[self.command] += 1
        self.send_response(200)
        self.send_header("Content-Length", "12345")
        self.end_headers()

    def do_PUT(self) -> None:
        self.seen[self.command] += 1
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            total = 0
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                total += len(self.rfile.read(size))
                self.rfile.readline()
        else:
            total = len(self.rfile.read(int(self.headers["Content-Length"])))
        body = str(total).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Counter[str]]]:
    seen: Counter[str] = Counter()
    handler = type("H", (_Handler,), {"seen": seen})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    srv.handle_error = lambda *a: None  # type: ignore[method-assign]  # resets are on purpose
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    srv.shutdown()
    srv.server_close()
    thread.join()


def _conn(proxy: DelayProxy) -> http.client.HTTPConnection:
    port = int(proxy.url.rsplit(":", 1)[1])
    return http.client.HTTPConnection("127.0.0.1", port, timeout=10)


def _get(conn: http.client.HTTPConnection, path: str, method: str = "GET") -> tuple[int, bytes]:
    conn.request(method, path)
    resp = conn.getresponse()
    return resp.status, resp.read()


def test_relays_bodies_intact_over_keep_alive(server):
    url, _ = server
    with DelayProxy(url, delay_ms=1) as proxy:
        conn = _conn(proxy)
        for n in (0, 1, 1000, 300_000, 3_000_000):
            assert _get(conn, f"/obj/{n}") == (200, _body(n))
        assert _get(conn, "/chunked/5500") == (200, _body(5500))
        assert _get(conn, "/obj/7", "HEAD") == (200, b"")
        assert _get(conn, "/obj/10") == (200, _body(10))
        assert _get(conn, "/bucket?list-type=2&prefix=a/b") == (200, b"<ListBucketResult/>")
        conn.close()
        assert proxy.counts() == {"GET": 8, "HEAD": 1}
        assert proxy.stats()["lists"] == 1
        assert proxy.stats()["connections"] == 1


def test_counts_put_with_length_and_chunked_bodies(server):
    url, _ = server
    with DelayProxy(url, delay_ms=0) as proxy:
        conn = _conn(proxy)
        conn.request("PUT", "/obj/a", body=_body(70_000))
        assert conn.getresponse().read() == b"70000"
        conn.request("PUT", "/obj/b", body=iter([b"x" * 10, b"y" * 20]), encode_chunked=True)
        assert conn.getresponse().read() == b"30"
        assert _get(conn, "/obj/3") == (200, _body(3))
        conn.close()
        assert proxy.counts() == {"PUT": 2, "GET": 1}


def test_delays_the_first_byte_of_every_response(server):
    url, _ = server
    with DelayProxy(url, delay_ms=150) as proxy:
        conn = _conn(proxy)
        for _ in range(2):
            start = time.perf_counter()
            assert _get(conn, "/obj/100") == (200, _body(100))
            # the behaviour under test is the injected delay itself; a lower bound cannot fail
            # because the machine is slow, only if the proxy does not delay
            assert time.perf_counter() - start >= 0.14
        conn.close()


def _read_responses(sock: socket.socket, expected: list[tuple[str, int]]) -> list[tuple[int, bytes]]:
    """Reads pipelined responses from a raw socket; expected is (method, body length)."""
    f = sock.makefile("rb")
    out = []
    for method, _ in expected:
        status_line = f.readline()
        status = int(status_line.split()[1])
        length = 0
        while (line := f.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        out.append((status, b"" if method == "HEAD" else f.read(length)))
    f.close()
    return out


def test_pipelined_requests_are_counted_and_answered_in_order(server):
    url, _ = server
    with DelayProxy(url, delay_ms=5) as proxy:
        port = int(proxy.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            reqs = [("GET", 10), ("HEAD", 0), ("GET", 2000), ("GET", 0)]
            sock.sendall(b"".join(f"{m} /obj/{n} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for m, n in reqs))
            got = _read_responses(sock, reqs)
        assert got == [(200, _body(10)), (200, b""), (200, _body(2000)), (200, b"")]
        assert proxy.counts() == {"GET": 3, "HEAD": 1}


def test_injected_slowdown_is_an_s3_error_and_never_reaches_the_server(server):
    url, seen = server
    before = seen["GET"]
    with DelayProxy(url, delay_ms=0, hook=lambda r: "error503" if r.index == 1 else None) as proxy:
        conn = _conn(proxy)
        assert _get(conn, "/obj/5") == (200, _body(5))
        status, body = _get(conn, "/bucket/key?x=1")
        assert status == 503
        assert b"<Code>SlowDown</Code>" in body and b"<Resource>/bucket/key</Resource>" in body
        assert _get(conn, "/obj/6") == (200, _body(6))  # the connection is still usable
        conn.close()
        assert proxy.counts() == {"GET": 3}
        assert proxy.stats()["faults"] == {"error": 1}
    assert seen["GET"] - before == 2


def test_injected_500_on_a_pipelined_connection_keeps_order(server):
    url, _ = server
    with DelayProxy(url, delay_ms=2, hook=lambda r: "error500" if r.index == 1 else None) as proxy:
        port = int(proxy.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            reqs = [("GET", 50_000), ("GET", 1), ("GET", 3)]
            sock.sendall(b"".join(f"{m} /obj/{n} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for m, n in reqs))
            got = _read_responses(sock, reqs)
        assert got[0] == (200, _body(50_000))
        assert got[1][0] == 500 and b"<Code>InternalError</Code>" in got[1][1]
        assert got[2] == (200, _body(3))


def test_injected_error_swallows_the_request_body(server):
    url, seen = server
    before = seen["PUT"]
    with DelayProxy(url, delay_ms=0, faults=Faults(error_rate=1.0, methods=frozenset({"PUT"}))) as proxy:
        conn = _conn(proxy)
        conn.request("PUT", "/obj/a", body=b"z" * 5000)
        resp = conn.getresponse()
        assert resp.status == 503
        resp.read()
        assert _get(conn, "/obj/4") == (200, _body(4))
        conn.close()
    assert seen["PUT"] == before


def test_error_rate_is_seeded(server):
    url, _ = server

    def statuses() -> list[int]:
        with DelayProxy(url, delay_ms=0, faults=Faults(error_rate=0.5, seed=7)) as proxy:
            conn = _conn(proxy)
            out = [_get(conn, "/obj/1")[0] for _ in range(20)]
            conn.close()
        return out

    first = statuses()
    assert first == statuses()
    assert 200 in first and 503 in first


def test_rate_limit_refuses_what_exceeds_the_rate_and_lets_the_rate_through(server):
    # 20 GETs/s with a burst of 2: of 12 sent back to back, at most the burst plus what the rate
    # refilled while they were sent pass; requests sent at 10/s all pass
    url, seen = server
    with DelayProxy(url, delay_ms=0, faults=Faults(rate_limit=20.0)) as proxy:
        conn = _conn(proxy)
        t0 = time.monotonic()
        burst = [_get(conn, "/obj/1")[0] for _ in range(12)]
        allowed = 2 + 20.0 * (time.monotonic() - t0)
        paced = []
        for _ in range(6):
            time.sleep(0.1)
            paced.append(_get(conn, "/obj/1")[0])
        conn.close()
        refused = proxy.stats()["faults"]["error"]
    assert 1 <= burst.count(200) <= allowed and 503 in burst, (burst, allowed)
    assert paced == [200] * 6
    assert refused == burst.count(503) and seen["GET"] >= 7


def test_reset_mid_body_after_n_bytes(server):
    url, _ = server
    with DelayProxy(url, delay_ms=0, faults=Faults(reset_rate=1.0, reset_after=4096)) as proxy:
        conn = _conn(proxy)
        conn.request("GET", "/obj/1000000")
        resp = conn.getresponse()
        assert resp.status == 200
        chunks = []
        # the response announces its length, so a cut shows as an error, never as a quiet EOF
        with pytest.raises((http.client.IncompleteRead, ConnectionResetError)):
            while chunk := resp.read(1024):
                chunks.append(chunk)
        assert len(b"".join(chunks)) <= 4096
        conn.close()
        assert proxy.stats()["faults"] == {"reset": 1}


def test_reset_of_a_bodiless_response_drops_the_connection(server):
    url, _ = server
    with DelayProxy(url, delay_ms=0, hook=lambda r: "reset" if r.method == "HEAD" else None) as proxy:
        conn = _conn(proxy)
        with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
            _get(conn, "/obj/1", "HEAD")
        conn.close()


def test_stall_holds_the_response(server):
    url, _ = server
    calls: list[RequestInfo] = []

    def hook(info: RequestInfo):
        calls.append(info)
        return "stall" if info.index == 0 else None

    with DelayProxy(url, delay_ms=0, faults=Faults(stall_s=0.3), hook=hook) as proxy:
        conn = _conn(proxy)
        start = time.perf_counter()
        assert _get(conn, "/obj/10") == (200, _body(10))
        assert time.perf_counter() - start >= 0.29  # the stall was applied (a lower bound only)
        assert _get(conn, "/obj/11") == (200, _body(11))
        conn.close()
        assert proxy.stats()["faults"] == {"stall": 1}
    assert [(c.index, c.method, c.path, c.connection) for c in calls] == [
        (0, "GET", "/obj/10", 0), (1, "GET", "/obj/11", 0)]


def test_set_faults_and_reset_counts(server):
    url, _ = server
    with DelayProxy(url, delay_ms=0) as proxy:
        conn = _conn(proxy)
        assert _get(conn, "/obj/1")[0] == 200
        proxy.set_faults(Faults(error_rate=1.0, error_status=500))
        time.sleep(0.05)  # applied on the proxy's loop
        assert _get(conn, "/obj/1")[0] == 500
        proxy.reset_counts()
        assert proxy.counts() == {}
        conn.close()


def test_stop_joins_the_thread_and_closes_the_port(server):
    url, _ = server
    threads_before = set(threading.enumerate())
    proxy = DelayProxy(url, delay_ms=50).start()
    port = int(proxy.url.rsplit(":", 1)[1])
    conn = _conn(proxy)
    conn.request("GET", "/obj/10")  # left in flight on purpose
    proxy.stop()
    assert not any(t.name == "pipeflow-delay-proxy" for t in threading.enumerate())
    proxy.stop()
    conn.close()
    # the test server's handler thread for the proxy's upstream connection ends when it reads
    # the EOF the proxy sent; give it a moment rather than racing it
    deadline = time.monotonic() + 5
    while set(threading.enumerate()) - threads_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(threading.enumerate()) - threads_before == set()  # nothing started here survives
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_unreachable_upstream_closes_the_client():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # nothing listens once closed
    with DelayProxy(f"http://127.0.0.1:{dead}", delay_ms=0) as proxy:
        conn = _conn(proxy)
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            _get(conn, "/obj/1")
        conn.close()


@pytest.mark.parametrize("bad", [
    {"error_rate": 1.5}, {"reset_rate": -0.1}, {"error_status": 404}, {"stall_s": -1},
    {"rate_limit": -1.0}, {"rate_limit": float("inf")},
])
def test_fault_options_are_validated(bad):
    with pytest.raises(ValueError):
        Faults(**bad)


def test_rejects_non_http_upstream():
    with pytest.raises(ValueError):
        DelayProxy("https://127.0.0.1:9000")
    with pytest.raises(ValueError):
        DelayProxy("http://127.0.0.1:9000", delay_ms=-1)


def test_subprocess_mode_serves_stats(server):
    url, _ = server
    with ProxyProcess(url, delay_ms=1, faults=Faults(error_rate=0.0)) as proxy:
        port = int(proxy.url.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        assert _get(conn, "/obj/9") == (200, _body(9))
        assert _get(conn, "/obj/9", "HEAD")[0] == 200
        conn.close()
        assert proxy.counts() == {"GET": 1, "HEAD": 1}
        assert proxy.stats()["delay_ms"] == 1.0
        proxy.reset_counts()
        assert proxy.counts() == {}
        proc = proxy._proc
    assert proc is not None and proc.returncode == 0


_PARENT_OF_A_PROXY = """
import sys, time
from pipeflow.testing.proxy import ProxyProcess
with ProxyProcess("http://127.0.0.1:9", delay_ms=1) as proxy:
    print(proxy.pid, flush=True)
    time.sleep(600)
"""


@pytest.mark.timeout(60)
def test_a_proxy_process_dies_with_a_parent_killed_outright():
    import os
    import signal
    import subprocess
    import sys

    parent = subprocess.Popen([sys.executable, "-c", _PARENT_OF_A_PROXY], stdout=subprocess.PIPE, text=True)
    pid = 0
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        parent.send_signal(signal.SIGKILL)  # no finally block, no atexit
        parent.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        assert not _alive(pid), "the proxy outlived its parent"
    finally:
        parent.kill()
        parent.wait()
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_connection_accepted_as_the_proxy_goes_down_is_reset(server):
    # A stopped server leaves no connection open. Connections accepted in the same turn of the
    # proxy's loop as down() once escaped it (their transport was made for a server already
    # closed): never served, closed only by the garbage collector, so their client waited out
    # its read timeout (30 s; the obstore outage test took 30 s in 2 runs of 6).
    import gc
    import selectors

    with DelayProxy(server, delay_ms=0) as proxy:
        port = int(proxy.url.rsplit(":", 1)[1])
        loop = proxy._loop
        assert loop is not None
        gc.disable()
        try:
            loop.call_soon_threadsafe(time.sleep, 0.5)  # the proxy's loop is busy for a moment
            time.sleep(0.1)
            # queued by the kernel meanwhile; down()'s request reaches the loop first, so the
            # loop accepts them all in the turn that starts going down
            clients = [socket.create_connection(("127.0.0.1", port), timeout=2) for _ in range(20)]
            going = threading.Thread(target=proxy.down)
            going.start()
            going.join()
            # closed or reset sockets are readable (EOF, or the error)
            with selectors.DefaultSelector() as sel:
                for sock in clients:
                    sel.register(sock, selectors.EVENT_READ)
                left, deadline = set(clients), time.monotonic() + 2.0
                while left and time.monotonic() < deadline:
                    for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
                        sel.unregister(key.fileobj)
                        left.discard(key.fileobj)  # type: ignore[arg-type]
            for sock in clients:
                sock.close()
            assert not left, f"{len(left)} of {len(clients)} connections left open after down()"
        finally:
            gc.enable()
