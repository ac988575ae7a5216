"""The suite's own guards are on: only loopback sockets, so no test reaches the network by accident."""

from __future__ import annotations

import socket

import pytest
from pytest_socket import SocketConnectBlockedError


@pytest.mark.filterwarnings("ignore:A test tried to use socket")
def test_a_connection_outside_loopback_is_refused_before_it_leaves():
    # 192.0.2.0/24 is reserved for documentation: nothing answers there even if the guard were off
    with pytest.raises(SocketConnectBlockedError):
        socket.create_connection(("192.0.2.1", 443), timeout=0.5)


def test_loopback_stays_open():
    server = socket.create_server(("127.0.0.1", 0))
    try:
        socket.create_connection(server.getsockname(), timeout=5).close()
    finally:
        server.close()
