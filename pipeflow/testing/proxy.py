"""A delay-line HTTP proxy on loopback that adds object-store latency, counts requests and
injects faults.

A local S3 server answers in well under a millisecond, which hides what dominates on real S3:
tens of milliseconds before the first byte of every request. :class:`DelayProxy` sits between
the clients and the server and delivers every chunk the server sends ``delay_ms`` after it
arrived. It is a *delay line*, not a throttle: chunks keep their order, many are in flight at
once, and bandwidth is not capped. Each request therefore waits about ``delay_ms`` longer for
its first byte, as on S3.

The proxy frames HTTP/1.1 messages in both directions (it never looks at bodies), so it can

* count requests by method (``GET``, ``HEAD``, ``PUT``, ...), correctly with keep-alive and
  pipelined requests;
* answer a seeded fraction of requests itself with ``503 SlowDown`` or ``500 InternalError``
  (an S3 XML error body, the request never reaches the server);
* reset a fraction of connections in the middle of a response body, after ``reset_after``
  bytes (a TCP RST, as a dropped connection looks to the client), or close them cleanly there
  (a FIN: the body just ends short of its announced length);
* stall a fraction of responses for ``stall_s`` seconds before their first byte, or inside the
  body after ``reset_after`` bytes;
* go down and come back (:meth:`DelayProxy.down`, :meth:`DelayProxy.up`): while down, every
  connection is refused, as a server that is not running looks.

Use it in-process (it runs its event loop in a background thread)::

    with DelayProxy("http://127.0.0.1:9000", delay_ms=20) as proxy:
        client = boto3.client("s3", endpoint_url=proxy.url, ...)
        ...
        proxy.counts()   # {"GET": 800, "HEAD": 0, ...}

or as a separate process, which keeps its CPU out of the measured process tree::

    python -m pipeflow.testing.proxy http://127.0.0.1:9000 --delay-ms 20
    # prints http://127.0.0.1:PORT on its first line; GET /__proxy__/stats returns the counters

(:class:`ProxyProcess` wraps that). The proxy speaks plain HTTP only (no TLS).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import math
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal
from urllib.parse import urlsplit

from ._lifeline import Tethered, start_tethered
from .s3server import death_signal_hook

__all__ = ["Action", "DelayProxy", "Faults", "ProxyProcess", "RequestInfo", "main"]

#: What a fault hook may ask the proxy to do with one request.
Action = Literal["error503", "error500", "error403", "reset", "close", "stall", "stall_body"]

_STATS_PATH = b"/__proxy__/"
_MAX_HEAD = 64 * 1024


@dataclass(frozen=True)
class Faults:
    """Seeded fault injection; every rate is a probability per request in ``[0, 1]``.

    Attributes:
        error_rate: fraction of requests answered by the proxy with ``error_status``.
        error_status: 503 (S3 ``SlowDown``), 500 (S3 ``InternalError``) or 403 (``AccessDenied``,
            a permanent error: clients must not retry it).
        reset_rate: fraction of responses whose connection is reset mid-body.
        reset_after: body bytes delivered before a reset, a clean close or a stall inside the
            body (at most the body length - 1; a response without a body is reset or closed
            before its first byte).
        close_rate: fraction of responses whose connection is closed cleanly mid-body.
        stall_rate: fraction of responses held back ``stall_s`` seconds before the first byte.
        body_stall_rate: fraction of responses held back ``stall_s`` seconds after
            ``reset_after`` body bytes.
        stall_s: length of a stall.
        methods: methods the faults apply to.
        seed: seeds the random choices (made in the order requests reach the proxy).
        rate_limit: requests of ``methods`` per second the proxy lets through (0: no limit);
            beyond it, it answers ``error_status`` as a store limiting a prefix's request rate
            does: a token bucket refilled at that rate, holding a tenth of a second's worth
            (at least one), so the share refused grows with the rate sent, not with time.
    """

    error_rate: float = 0.0
    error_status: int = 503
    reset_rate: float = 0.0
    reset_after: int = 1024
    close_rate: float = 0.0
    stall_rate: float = 0.0
    body_stall_rate: float = 0.0
    stall_s: float = 5.0
    methods: frozenset[str] = frozenset({"GET"})
    seed: int = 0
    rate_limit: float = 0.0

    def __post_init__(self) -> None:
        for name in ("error_rate", "reset_rate", "close_rate", "stall_rate", "body_stall_rate"):
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"Faults.{name} must be in [0, 1], got {rate}")
        if self.error_status not in _ERRORS:
            raise ValueError(f"Faults.error_status must be one of {sorted(_ERRORS)}, got {self.error_status}")
        if self.reset_after < 0 or self.stall_s < 0:
            raise ValueError("Faults.reset_after and Faults.stall_s must be >= 0")
        if not 0.0 <= self.rate_limit < math.inf:
            raise ValueError(f"Faults.rate_limit must be a finite number >= 0, got {self.rate_limit}")
        object.__setattr__(self, "methods", frozenset(m.upper() for m in self.methods))

    def decide(self, rng: random.Random, info: RequestInfo) -> Action | None:
        """Draw the fault for one request (``None``: forward it untouched)."""
        if info.method not in self.methods:
            return None
        if self.error_rate and rng.random() < self.error_rate:
            return f"error{self.error_status}"  # type: ignore[return-value]
        if self.reset_rate and rng.random() < self.reset_rate:
            return "reset"
        if self.close_rate and rng.random() < self.close_rate:
            return "close"
        if self.stall_rate and rng.random() < self.stall_rate:
            return "stall"
        if self.body_stall_rate and rng.random() < self.body_stall_rate:
            return "stall_body"
        return None


class _RateLimit:
    """A token bucket: ``take()`` is True while requests stay within ``rate`` per second (with
    a burst of a tenth of a second's worth); a refused request takes no token."""

    def __init__(self, rate: float) -> None:
        self.rate, self.burst = rate, max(1.0, rate / 10.0)
        self.tokens, self.last = self.burst, time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


@dataclass(frozen=True)
class RequestInfo:
    """A request as the fault hook sees it.

    Attributes:
        index: 0-based number of the request among all the proxy has seen (since the last
            :meth:`DelayProxy.reset_counts`).
        method: upper-case HTTP method.
        path: the request target, e.g. ``/bucket/key?partNumber=1``.
        connection: 0-based number of the client connection it came on.
    """

    index: int
    method: str
    path: str
    connection: int


#: ``hook(request) -> action or None``; when given it replaces the random draw of ``Faults``.
FaultHook = Callable[[RequestInfo], "Action | None"]

_ERRORS = {
    503: ("Slow Down", "SlowDown", "Please reduce your request rate."),
    500: ("Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
    403: ("Forbidden", "AccessDenied", "Access Denied"),
}


def _error_response(status: int, method: str, path: str, request_id: str, close: bool) -> bytes:
    reason, code, message = _ERRORS[status]
    resource = path.split("?", 1)[0]
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{_xml_escape(resource)}</Resource><RequestId>{request_id}</RequestId></Error>"
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Content-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"x-amz-request-id: {request_id}\r\n"
        f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
    ).encode()
    return head if method == "HEAD" else head + body


def _json_response(payload: dict[str, Any]) -> bytes:
    body = json.dumps(payload, sort_keys=True).encode()
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    )


def _xml_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# ---- HTTP/1.1 framing ---------------------------------------------------------------------------
class _Head:
    __slots__ = ("raw", "start", "headers")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        lines = raw.decode("latin-1").split("\r\n")
        self.start = lines[0]
        self.headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                self.headers[name.strip().lower()] = value.strip()


class _Framer:
    """Incremental framing of HTTP/1.1 messages (heads, body bytes, ends) in one direction.

    ``body_mode(head)`` returns how the body of a message is delimited: ``("length", n)``,
    ``("chunked", 0)`` or ``("close", 0)`` (until the connection closes).
    """

    _HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _TRAILER, _CLOSE = range(7)

    def __init__(self, body_mode: Callable[[_Head], tuple[str, int]]) -> None:
        self._body_mode = body_mode
        self._state = self._HEAD
        self._buf = bytearray()
        self._remaining = 0

    def feed(self, data: bytes) -> Iterator[tuple[str, Any]]:
        """Split ``data`` into events ``("head", _Head)``, ``("body", bytes)``, ``("end", None)``.

        A generator: how a response body is delimited may depend on the end of the previous
        response (which request it answered), so the caller handles each event before the
        next is framed.
        """
        pos = 0
        while pos < len(data):
            state = self._state
            if state == self._HEAD:
                data, pos = yield from self._head(data, pos)
            elif state in (self._LENGTH, self._CHUNK_DATA, self._CHUNK_CRLF):
                pos = yield from self._counted(data, pos)
            elif state == self._CLOSE:
                yield ("body", data[pos:])
                pos = len(data)
            else:
                pos = yield from self._line(data, pos)

    def _head(self, data: bytes, pos: int) -> Generator[tuple[str, Any], None, tuple[bytes, int]]:
        """Buffer a message head; once complete, emit it and return the bytes after it."""
        self._buf += data[pos:]
        if self._buf.startswith(b"\r\n"):  # tolerate stray CRLFs between messages
            del self._buf[:2]
            rest = bytes(self._buf)
            self._buf.clear()
            return rest, 0
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > _MAX_HEAD:
                raise ValueError("HTTP head larger than 64 KiB")
            return b"", 0
        head = _Head(bytes(self._buf[: end + 4]))
        rest = bytes(self._buf[end + 4:])
        self._buf.clear()
        yield ("head", head)
        mode, length = self._body_mode(head)
        if mode == "length":
            if length == 0:
                yield ("end", None)
            else:
                self._state, self._remaining = self._LENGTH, length
        elif mode == "chunked":
            self._state = self._CHUNK_SIZE
        else:
            self._state = self._CLOSE
        return rest, 0

    def _counted(self, data: bytes, pos: int) -> Generator[tuple[str, Any], None, int]:
        """Pass on body bytes of a known count: a sized body, a chunk, or a chunk's CRLF."""
        state = self._state
        take = min(self._remaining, len(data) - pos)
        yield ("body", data[pos:pos + take])
        pos += take
        self._remaining -= take
        if self._remaining == 0:
            if state == self._LENGTH:
                self._state = self._HEAD
                yield ("end", None)
            elif state == self._CHUNK_DATA:
                self._state, self._remaining = self._CHUNK_CRLF, 2
            else:
                self._state = self._CHUNK_SIZE
        return pos

    def _line(self, data: bytes, pos: int) -> Generator[tuple[str, Any], None, int]:
        """A line of the chunked encoding: a chunk size, or a trailer line."""
        nl = data.find(b"\n", pos)
        stop = len(data) if nl < 0 else nl + 1
        self._buf += data[pos:stop]
        yield ("body", data[pos:stop])
        if nl < 0:
            if len(self._buf) > _MAX_HEAD:
                raise ValueError("chunked-encoding line larger than 64 KiB")
            return stop
        line = bytes(self._buf).strip()
        self._buf.clear()
        if self._state == self._CHUNK_SIZE:
            size = int(line.split(b";", 1)[0], 16)
            if size == 0:
                self._state = self._TRAILER
            else:
                self._state, self._remaining = self._CHUNK_DATA, size
        elif not line:  # the empty line that ends the trailer
            self._state = self._HEAD
            yield ("end", None)
        return stop

    def eof(self) -> list[tuple[str, Any]]:
        """The peer closed: a body delimited by the close ends here."""
        if self._state == self._CLOSE:
            self._state = self._HEAD
            return [("end", None)]
        return []


def _request_body_mode(head: _Head) -> tuple[str, int]:
    if "chunked" in head.headers.get("transfer-encoding", "").lower():
        return ("chunked", 0)
    return ("length", int(head.headers.get("content-length", "0") or 0))


# ---- one proxied connection ----------------------------------------------------------------------
@dataclass
class _Pending:
    """A request waiting for its response, in request order."""

    method: str
    action: Action | None = None
    synthetic: bytes | None = None  # the proxy answers itself with these bytes
    close_after: bool = False


_RESET = object()
_CLOSE = object()


class _Connection:
    """Relays one client connection to one upstream connection through the delay line."""

    def __init__(self, proxy: _ProxyCore, number: int) -> None:
        self.proxy = proxy
        self.number = number
        self.loop = asyncio.get_running_loop()
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self._to_upstream: list[bytes] = []  # held until the upstream connection is up
        self._pending: collections.deque[_Pending] = collections.deque()
        self._req = _Framer(_request_body_mode)
        self._resp = _Framer(self._response_body_mode)
        self._forwarding_body = True  # False while the current request's body is swallowed
        self._line: collections.deque[tuple[float, Any]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None
        self._last_due = 0.0
        self._body_sent = 0
        self._reset_at: int | None = None
        self._cut: str | None = None  # what happens at _reset_at: "reset", "close", "stall_body"
        self._stall = 0.0
        self._final = True
        self._closed = False

    # -- client side --
    def client_data(self, data: bytes) -> None:
        try:
            for kind, value in self._req.feed(data):
                if kind == "head":
                    self._request_head(value)
                elif kind == "body":
                    if self._forwarding_body:
                        self._send_upstream(value)
                else:  # end of a request
                    self._forwarding_body = True
        except ValueError:  # not HTTP/1.1 as we know it
            self.close()
            return
        self._flush_synthetic()

    def _request_head(self, head: _Head) -> None:
        parts = head.start.split(" ")
        method = parts[0].upper()
        path = parts[1] if len(parts) > 1 else "/"
        if path.encode("latin-1").startswith(_STATS_PATH):
            self._forwarding_body = False
            self._pending.append(_Pending(method, synthetic=self.proxy.control(path)))
            return
        info = self.proxy.record(method, path, self.number)
        action = self.proxy.decide(info)
        if action in ("error503", "error500", "error403"):
            # The body is swallowed; a client waiting for "100 Continue" never sends it, so the
            # connection cannot be reused after such an answer.
            expects = "100-continue" in head.headers.get("expect", "").lower()
            status = int(action[len("error"):])
            rid = f"pipeflow-proxy-{info.index}"
            self._forwarding_body = False
            self._pending.append(_Pending(method, action, _error_response(status, method, path, rid, expects),
                                          close_after=expects))
            return
        self._pending.append(_Pending(method, action))
        self._send_upstream(head.raw)

    def _send_upstream(self, data: bytes) -> None:
        if not data:
            return
        if self.upstream is None:
            self._to_upstream.append(bytes(data))
        else:
            self.upstream.write(data)

    def upstream_connected(self, transport: asyncio.Transport) -> None:
        self.upstream = transport
        if self._closed:
            transport.close()
            return
        for data in self._to_upstream:
            transport.write(data)
        self._to_upstream.clear()

    # -- upstream side --
    def _response_body_mode(self, head: _Head) -> tuple[str, int]:
        status = int(head.start.split(" ", 2)[1])
        if 100 <= status < 200 or status in (204, 304):
            return ("length", 0)
        if self._pending and self._pending[0].method == "HEAD":
            return ("length", 0)
        if "chunked" in head.headers.get("transfer-encoding", "").lower():
            return ("chunked", 0)
        if "content-length" in head.headers:
            return ("length", int(head.headers["content-length"]))
        return ("close", 0)

    def upstream_data(self, data: bytes) -> None:
        try:
            self._relay(self._resp.feed(data))
        except ValueError:
            self.close()

    def upstream_eof(self) -> None:
        self._relay(self._resp.eof())
        self._enqueue(_CLOSE)

    def _relay(self, events: Iterable[tuple[str, Any]]) -> None:
        for kind, value in events:
            if kind == "head":
                status = int(value.start.split(" ", 2)[1])
                final = not (100 <= status < 200)
                self._final = final
                current = self._pending[0] if self._pending else _Pending("GET")
                self._body_sent, self._reset_at, self._stall, self._cut = 0, None, 0.0, None
                if final and current.action == "stall":
                    self._stall = self.proxy.faults.stall_s
                    self.proxy.count_fault("stall")
                if final and current.action in ("reset", "close", "stall_body"):
                    length = self._response_body_mode(value)
                    if length[0] == "length" and length[1] == 0 and current.action != "stall_body":
                        self.proxy.count_fault(current.action)
                        self._enqueue(_RESET if current.action == "reset" else _CLOSE)
                        self._pending.clear()
                        return
                    after = self.proxy.faults.reset_after
                    self._reset_at = min(after, max(length[1] - 1, 0)) if length[0] == "length" else after
                    self._cut = current.action
                    self.proxy.count_fault(current.action)
                self._enqueue(value.raw)
            elif kind == "body":
                if self._reset_at is not None and self._body_sent + len(value) > self._reset_at:
                    split = self._reset_at - self._body_sent
                    head, value = value[:split], value[split:]
                    self._enqueue(bytes(head))
                    self._body_sent += len(head)
                    self._reset_at = None
                    if self._cut != "stall_body":
                        self._enqueue(_RESET if self._cut == "reset" else _CLOSE)
                        self._pending.clear()
                        return
                    self._stall = self.proxy.faults.stall_s  # the rest waits stall_s longer
                self._body_sent += len(value)
                self._enqueue(value)
            elif self._final:  # the end of a final response (not of a "100 Continue")
                if self._pending:
                    self._pending.popleft()
                self._stall = 0.0
                self._flush_synthetic()

    def _flush_synthetic(self) -> None:
        # Answers made up by the proxy go out when every earlier response has been relayed.
        while self._pending and self._pending[0].synthetic is not None and self._resp_idle():
            entry = self._pending.popleft()
            if entry.action is not None:
                self.proxy.count_fault(entry.action)
            self._enqueue(entry.synthetic)
            if entry.close_after:
                self._enqueue(_CLOSE)
                self._pending.clear()

    def _resp_idle(self) -> bool:
        return self._resp._state == _Framer._HEAD and not self._resp._buf

    # -- the delay line --
    def _enqueue(self, item: Any) -> None:
        if self._closed:
            return
        due = max(self.loop.time() + self.proxy.delay + self._stall, self._last_due)
        self._last_due = due
        self._line.append((due, item))
        if self._timer is None:
            self._timer = self.loop.call_at(due, self._deliver)

    def _deliver(self) -> None:
        self._timer = None
        now = self.loop.time()
        line = self._line
        while line and line[0][0] <= now:
            item = line.popleft()[1]
            if item is _RESET:
                self._abort()
                return
            if item is _CLOSE:
                self.close()
                return
            if self.client is not None and not self._closed:
                self.client.write(item)
                self.proxy.bytes_down += len(item)
        if line:
            self._timer = self.loop.call_at(line[0][0], self._deliver)

    # -- shutdown --
    def _abort(self) -> None:
        if self.client is not None and not self._closed:
            sock = self.client.get_extra_info("socket")
            if sock is not None:
                try:  # linger 0: close() sends a TCP RST, as a dropped connection looks
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
            self.client.abort()
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._line.clear()
        if self.client is not None:
            self.client.close()
        if self.upstream is not None:
            self.upstream.close()
        self.proxy.connections.discard(self)

    def client_closed(self) -> None:
        # Responses still in the delay line cannot be delivered any more.
        self.close()


class _ClientProtocol(asyncio.Protocol):
    def __init__(self, proxy: _ProxyCore) -> None:
        self.proxy = proxy
        self.conn: _Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.conn = self.proxy.open_connection(transport)

    def data_received(self, data: bytes) -> None:
        assert self.conn is not None
        self.conn.client_data(data)

    def eof_received(self) -> bool:
        if self.conn is not None and self.conn.upstream is not None and self.conn.upstream.can_write_eof():
            self.conn.upstream.write_eof()  # half-close: responses may still come back
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.conn.client_closed()

    def pause_writing(self) -> None:  # the client reads slowly: stop reading the server
        if self.conn is not None and self.conn.upstream is not None:
            self.conn.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.conn is not None and self.conn.upstream is not None and not self.conn._closed:
            self.conn.upstream.resume_reading()


class _UpstreamProtocol(asyncio.Protocol):
    def __init__(self, conn: _Connection) -> None:
        self.conn = conn

    def data_received(self, data: bytes) -> None:
        self.conn.upstream_data(data)

    def eof_received(self) -> bool:
        self.conn.upstream_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self.conn.upstream_eof()

    def pause_writing(self) -> None:
        if self.conn.client is not None:
            self.conn.client.pause_reading()

    def resume_writing(self) -> None:
        if self.conn.client is not None and not self.conn._closed:
            self.conn.client.resume_reading()


class _ProxyCore:
    """State shared by the connections of one proxy; lives on the proxy's event loop."""

    def __init__(self, upstream: tuple[str, int], delay_ms: float, faults: Faults,
                 hook: FaultHook | None) -> None:
        self.upstream = upstream
        self.delay = delay_ms / 1000.0
        self.faults = faults
        self.hook = hook
        self.rng = random.Random(faults.seed)
        self.limit = _RateLimit(faults.rate_limit) if faults.rate_limit else None
        self.lock = threading.Lock()
        self.requests: collections.Counter[str] = collections.Counter()
        self.fault_counts: collections.Counter[str] = collections.Counter()
        self.n_requests = 0
        self.n_connections = 0
        self.lists = 0
        self.bytes_down = 0
        self.connections: set[_Connection] = set()

    def open_connection(self, client: asyncio.Transport) -> _Connection:
        conn = _Connection(self, self.n_connections)
        self.n_connections += 1
        conn.client = client
        self.connections.add(conn)
        sock = client.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        task = conn.loop.create_task(self._connect_upstream(conn))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)
        return conn

    async def _connect_upstream(self, conn: _Connection) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_connection(lambda: _UpstreamProtocol(conn), *self.upstream)
        except OSError:
            conn.close()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        assert isinstance(transport, asyncio.Transport)
        conn.upstream_connected(transport)

    def record(self, method: str, path: str, connection: int) -> RequestInfo:
        with self.lock:
            info = RequestInfo(self.n_requests, method, path, connection)
            self.n_requests += 1
            self.requests[method] += 1
            if method == "GET" and "/" not in path.split("?", 1)[0].strip("/"):
                self.lists += 1  # a GET on a bucket (path-style) is a LIST, not an object read
        return info

    def decide(self, info: RequestInfo) -> Action | None:
        if self.hook is not None:
            return self.hook(info)
        faults, limit = self.faults, self.limit
        if limit is not None and info.method in faults.methods and not limit.take():
            return f"error{faults.error_status}"  # type: ignore[return-value]
        return faults.decide(self.rng, info)

    def count_fault(self, action: str) -> None:
        with self.lock:
            self.fault_counts["error" if action.startswith("error") else action] += 1

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                "requests": dict(self.requests),
                "lists": self.lists,
                "faults": dict(self.fault_counts),
                "connections": self.n_connections,
                "bytes_down": self.bytes_down,
                "delay_ms": self.delay * 1000.0,
            }

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.fault_counts.clear()
            self.n_requests = 0
            self.lists = 0
            self.bytes_down = 0

    def control(self, path: str) -> bytes:
        if path.startswith("/__proxy__/reset"):
            self.reset()
        return _json_response(self.stats())


def _parse_upstream(upstream: str | tuple[str, int]) -> tuple[str, int]:
    if isinstance(upstream, tuple):
        return upstream
    parts = urlsplit(upstream if "//" in upstream else "http://" + upstream)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"the proxy forwards plain http:// only, got {upstream!r}")
    return parts.hostname, parts.port or 80


# ---- public API ----------------------------------------------------------------------------------
class DelayProxy:
    """A delay-line proxy to an HTTP server, running on a background thread.

    Args:
        upstream: the server, ``"http://127.0.0.1:9000"`` or ``("127.0.0.1", 9000)``.
        delay_ms: every chunk from the server reaches the client this much later (0: none).
        faults: seeded fault injection (none by default).
        hook: ``hook(RequestInfo) -> action or None`` decides faults instead of ``faults``'s
            random draw (``faults.stall_s`` and ``faults.reset_after`` still apply); it runs
            on the proxy's thread.
        host: the address to listen on.
        port: the port to listen on (0: a free one).

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self, upstream: str | tuple[str, int], *, delay_ms: float = 20.0,
                 faults: Faults | None = None, hook: FaultHook | None = None,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        if delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, got {delay_ms}")
        self._core = _ProxyCore(_parse_upstream(upstream), delay_ms, faults or Faults(), hook)
        self._host, self._port = host, port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` of the proxy (valid once started)."""
        if self._server is None:
            raise RuntimeError("the proxy is not running")
        return f"http://{self._host}:{self._port}"

    @property
    def delay_ms(self) -> float:
        return self._core.delay * 1000.0

    def start(self) -> DelayProxy:
        """Start listening; returns self."""
        if self._thread is not None:
            raise RuntimeError("the proxy is already running")
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="pipeflow-delay-proxy",
                                        daemon=True)
        self._thread.start()
        ready.wait()
        if self._error is not None:
            self._thread.join()
            self._thread = None
            raise self._error
        return self

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(
                loop.create_server(lambda: _ClientProtocol(self._core), self._host, self._port, backlog=512))
            self._port = self._server.sockets[0].getsockname()[1]
        except BaseException as exc:  # reported to start()
            self._error = exc
            loop.close()
            ready.set()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            # joins the resolver threads (getaddrinfo for upstream connections): close() alone
            # leaves them to finish on their own, after stop() has returned
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    def stop(self) -> None:
        """Close the listener and every connection, and join the thread. Idempotent."""
        if self._thread is None or self._loop is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        fut.result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = None
        self._server = None

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        for conn in list(self._core.connections):
            conn.close()
        await self._server.wait_closed()
        # let pending connect tasks see the closed connections
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def down(self) -> None:
        """Go down: stop listening (new connections are refused) and reset every open
        connection, as a server that stopped looks. :meth:`up` comes back on the same port."""
        assert self._loop is not None and self._server is not None, "the proxy is not running"
        asyncio.run_coroutine_threadsafe(self._go_down(), self._loop).result(timeout=10)

    async def _go_down(self) -> None:
        assert self._server is not None
        loop = asyncio.get_running_loop()
        # shutdown() acts on the socket, not on this process's descriptor: processes forked
        # since (DataLoader workers) hold copies that would keep it listening (and the port
        # bound) with nobody accepting, and keep its connections open. The kernel resets the
        # connections it had queued but nobody accepted.
        listening = list(getattr(self._server, "sockets", ()))
        for sock in listening:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            loop.remove_reader(sock.fileno())
        # Connections the loop accepted in this turn get their transport (and join
        # ``connections``) a turn or two later, and only while the server is open: closed
        # first, they escaped, never served nor closed, and their clients waited out a read
        # timeout. Let them in, so they are reset with the others.
        for _ in range(3):
            await asyncio.sleep(0)
        for conn in list(self._core.connections):
            sock = conn.client.get_extra_info("socket") if conn.client else None
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._server.close()
        for conn in list(self._core.connections):
            conn._abort()
        await self._server.wait_closed()

    def up(self) -> None:
        """Come back after :meth:`down`: listen again on the same port."""
        assert self._loop is not None, "the proxy is not running"

        async def listen() -> asyncio.AbstractServer:
            return await self._loop.create_server(  # type: ignore[union-attr]
                lambda: _ClientProtocol(self._core), self._host, self._port, backlog=512)

        self._server = asyncio.run_coroutine_threadsafe(listen(), self._loop).result(timeout=10)

    def counts(self) -> dict[str, int]:
        """Requests seen by method, e.g. ``{"GET": 800, "HEAD": 2}`` (answered or forwarded)."""
        return dict(self._core.stats()["requests"])

    def stats(self) -> dict[str, Any]:
        """Requests by method, ``lists`` (GETs on a bucket, included in ``GET``), injected
        faults by kind, connections, and bytes sent to clients."""
        return self._core.stats()

    def reset_counts(self) -> None:
        """Zero the counters (and the request index seen by fault hooks)."""
        self._core.reset()

    def set_faults(self, faults: Faults | None = None, *, hook: FaultHook | None = None) -> None:
        """Replace the fault configuration for the requests that arrive from now on."""
        faults = faults or Faults()
        core = self._core

        def apply() -> None:
            core.faults, core.hook, core.rng = faults, hook, random.Random(faults.seed)
            core.limit = _RateLimit(faults.rate_limit) if faults.rate_limit else None

        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(apply)
        else:
            apply()


class ProxyProcess:
    """:class:`DelayProxy` in a child process (``python -m pipeflow.testing.proxy``).

    Its CPU time stays out of the caller's process tree, which is what a benchmark measuring
    a client's CPU needs. Arguments are those of :class:`DelayProxy`.
    """

    def __init__(self, upstream: str, *, delay_ms: float = 20.0, faults: Faults | None = None,
                 port: int = 0, python: str = sys.executable) -> None:
        self.upstream = upstream
        self.delay_ms = delay_ms
        self.faults = faults or Faults()
        self.port = port
        self.python = python
        self.url = ""
        self._proc: subprocess.Popen[str] | None = None
        self._tether: Tethered | None = None

    def start(self) -> ProxyProcess:
        f = self.faults
        args = [self.upstream, "--delay-ms", str(self.delay_ms),
                "--port", str(self.port), "--error-rate", str(f.error_rate),
                "--error-status", str(f.error_status), "--reset-rate", str(f.reset_rate),
                "--reset-after", str(f.reset_after), "--stall-rate", str(f.stall_rate),
                "--stall-s", str(f.stall_s), "--methods", ",".join(sorted(f.methods)), "--seed", str(f.seed),
                "--rate-limit", str(f.rate_limit)]
        # a parent killed outright (SIGKILL) takes its proxy along, as it does its server, from
        # whichever thread it was started
        self._tether = start_tethered("pipeflow.testing.proxy", args, python=self.python,
                                       stdout=subprocess.PIPE, text=True, preexec_fn=death_signal_hook())
        self._proc = self._tether.process
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().strip()
        if not line.startswith("http://"):
            self.stop()
            raise RuntimeError(f"the proxy process did not start (said {line!r})")
        self.url = line
        return self

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def stats(self) -> dict[str, Any]:
        """The counters (see :meth:`DelayProxy.stats`), fetched over HTTP."""
        with urllib.request.urlopen(self.url + "/__proxy__/stats", timeout=10) as resp:
            return json.loads(resp.read())

    def counts(self) -> dict[str, int]:
        return dict(self.stats()["requests"])

    def reset_counts(self) -> None:
        with urllib.request.urlopen(self.url + "/__proxy__/reset", timeout=10) as resp:
            resp.read()

    def stop(self) -> None:
        """Terminate the child and wait for it. Idempotent."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        if self._tether is not None:
            self._tether.release()
        self._proc = self._tether = None

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m pipeflow.testing.proxy UPSTREAM [options]``: run until SIGTERM or Ctrl-C."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m pipeflow.testing.proxy",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("upstream", help="the server, e.g. http://127.0.0.1:9000")
    p.add_argument("--delay-ms", type=float, default=20.0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    d = Faults()
    p.add_argument("--error-rate", type=float, default=d.error_rate)
    p.add_argument("--error-status", type=int, default=d.error_status, choices=sorted(_ERRORS))
    p.add_argument("--reset-rate", type=float, default=d.reset_rate)
    p.add_argument("--reset-after", type=int, default=d.reset_after)
    p.add_argument("--stall-rate", type=float, default=d.stall_rate)
    p.add_argument("--stall-s", type=float, default=d.stall_s)
    p.add_argument("--methods", default="GET", help="comma-separated methods the faults apply to")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--rate-limit", type=float, default=d.rate_limit,
                   help="requests/s let through; beyond, --error-status (0: no limit)")
    a = p.parse_args(argv)
    faults = replace(d, error_rate=a.error_rate, error_status=a.error_status, reset_rate=a.reset_rate,
                     reset_after=a.reset_after, stall_rate=a.stall_rate, stall_s=a.stall_s,
                     methods=frozenset(m for m in a.methods.split(",") if m), seed=a.seed,
                     rate_limit=a.rate_limit)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with DelayProxy(a.upstream, delay_ms=a.delay_ms, faults=faults, host=a.host, port=a.port) as proxy:
        print(proxy.url, flush=True)
        while not stop.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
