"""lodestar.local port choice: predictable default ports for `lodestar up`, a free one when taken."""

from __future__ import annotations

import socket

from lodestar.local import free_port, port_or_free


def test_port_or_free_keeps_a_free_preferred_port() -> None:
    port = free_port()
    assert port_or_free(port) == port


def test_port_or_free_moves_off_a_taken_port() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        chosen = port_or_free(busy)
        assert chosen != busy
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", chosen))  # really free
