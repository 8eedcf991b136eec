"""The LMCache server launcher refuses, in one line, an LMCache whose server it cannot drive."""

from __future__ import annotations

import pytest

from conformance.stores.lmcache_server import LMCacheServer


def fake_python(tmp_path, version: str, rc: int = 0) -> str:
    """An executable that answers the launcher's version probe as a Python with that LMCache would."""
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\necho {version}\nexit {rc}\n")
    exe.chmod(0o755)
    return str(exe)


def test_lmcache_0_3_is_refused_with_the_reason_before_a_server_starts(tmp_path):
    server = LMCacheServer(tmp_path / "server.log", python=fake_python(tmp_path, "0.3.15"))
    with pytest.raises(RuntimeError, match=r"LMCache 0\.3\.15's multiprocess server takes another command line"):
        server.start()
    assert server.proc is None and not (tmp_path / "server.log").exists()


def test_a_python_without_lmcache_is_named(tmp_path):
    with pytest.raises(RuntimeError, match="LMCache is not installed in"):
        LMCacheServer(tmp_path / "server.log", python=fake_python(tmp_path, "", rc=1)).start()


@pytest.mark.parametrize("version, refused", [("0.5.6", False), ("0.4.7", False), ("0.3.15", True),
                                               ("1.0.0rc1", False), ("0.4.0.dev3+g1a2b", False), ("0.3.99", True)])
def test_only_releases_before_0_4_are_refused(tmp_path, version, refused):
    # Past the version check the fake "server" exits at once: a different error, after the check.
    with pytest.raises(RuntimeError) as raised:
        LMCacheServer(tmp_path / "server.log", python=fake_python(tmp_path, version), ready_timeout_s=10).start()
    assert ("takes another command line" in str(raised.value)) == refused, raised.value
    assert refused or "exited with 0 before it was ready" in str(raised.value), raised.value


def test_the_version_is_asked_once_per_python_not_per_restart(tmp_path):
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\necho probe >> {tmp_path / 'calls'}\necho 0.3.15\n")
    exe.chmod(0o755)
    server = LMCacheServer(tmp_path / "server.log", python=str(exe))
    for _ in range(3):  # lose_storage restarts a server twice per cell
        with pytest.raises(RuntimeError, match="takes another command line"):
            server.start()
    assert (tmp_path / "calls").read_text().splitlines() == ["probe"]


@pytest.mark.parametrize("says, attempts", [("zmq.error.ZMQError: Address already in use", 3),
                                            ("ImportError: no lmcache.v1.multiprocess", 1)])
def test_a_port_taken_before_the_server_bound_it_is_retried_on_new_ports(tmp_path, says, attempts):
    """The suite picks free ports, and the server binds them later: another process may take one in
    between. That, and only that, is tried again on new ports (up to three times)."""
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\nif [ \"$1\" = -c ]; then echo 0.5.6; exit 0; fi\n"
                   f"echo \"$6\" >> {tmp_path / 'ports'}\necho '{says}'\nexit 1\n")  # $6: --port's value
    exe.chmod(0o755)
    with pytest.raises(RuntimeError, match="exited with 1 before it was ready"):
        LMCacheServer(tmp_path / "server.log", python=str(exe), ready_timeout_s=10).start()
    ports = (tmp_path / "ports").read_text().split()
    assert len(ports) == attempts and all(p.isdigit() for p in ports)  # each attempt chose its own ports
