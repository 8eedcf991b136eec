"""The ports the suite gives the servers it starts."""

from __future__ import annotations

import socket

from conformance.util import procs


def test_the_ports_of_one_server_are_never_the_same_number():
    """Chosen one by one and each released at once, a server's ports can coincide (its HTTP port on
    its ZMQ port's number answers the health check in ZMQ's bytes); chosen together they cannot."""
    ports = procs.free_ports(64)
    assert len(set(ports)) == 64
    for port in ports[:3]:  # and each is free again for the server to bind
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))
