"""Ports the test harness hands to services it starts.

A port the kernel picked (bound to 0, then released) lies in the ephemeral range, where any
outgoing connection may take it before the service binds it; a fresh-clone CI run once lost
an ingress replica to "address already in use" that way.
"""

from __future__ import annotations

import socket

from loadgen.harness import process_stack
from loadgen.harness.process_stack import free_port, free_ports


def test_ports_are_below_the_ephemeral_range_and_never_handed_out_twice() -> None:
    floor = process_stack._ephemeral_floor()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= port < floor for port in ports)


def test_a_handed_out_port_can_be_listened_on() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()


def test_consecutive_ports_are_all_free_and_reserved_together() -> None:
    first = free_ports(3)
    held = []
    try:
        for port in range(first, first + 3):
            sock = socket.socket()
            held.append(sock)
            sock.bind(("127.0.0.1", port))
        later = {free_port() for _ in range(100)}
        assert later.isdisjoint(range(first, first + 3))
    finally:
        for sock in held:
            sock.close()


def test_a_port_someone_listens_on_is_skipped() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert not process_stack._bindable("127.0.0.1", taken.getsockname()[1])
