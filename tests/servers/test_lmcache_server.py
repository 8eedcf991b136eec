"""The LMCache server launcher: it refuses, in one line, an LMCache whose server it cannot drive; an
engine cell's server loses its content by switching to a spare."""

from __future__ import annotations

import pytest

from conformance.servers.lmcache_server import LMCacheServer, UndrivableServer


def fake_python(tmp_path, version: str, rc: int = 0) -> str:
    """An executable that answers the launcher's version probe as a Python with that LMCache would."""
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\necho {version}\nexit {rc}\n")
    exe.chmod(0o755)
    return str(exe)


def test_lmcache_0_3_is_refused_with_the_reason_before_a_server_starts(tmp_path):
    server = LMCacheServer(tmp_path / "server.log", python=fake_python(tmp_path, "0.3.15"))
    with pytest.raises(UndrivableServer, match=r"LMCache 0\.3\.15's multiprocess server takes another command line"):
        server.start()
    assert server.proc is None and not (tmp_path / "server.log").exists()


def test_a_python_without_lmcache_is_named(tmp_path):
    with pytest.raises(RuntimeError, match="LMCache is not installed in"):
        LMCacheServer(tmp_path / "server.log", python=fake_python(tmp_path, "", rc=1)).start()


@pytest.mark.parametrize("version, refused", [("0.5.6", False), ("0.4.7", False), ("0.3.15", True),
                                               ("1.0.0rc1", False), ("0.4.0.dev3+g1a2b", False), ("0.3.99", True)])
def test_only_releases_before_0_4_are_refused(tmp_path, version, refused):
    # Past the version check the fake "server" exits at once: a different error, after the check.
    with pytest.raises((RuntimeError, UndrivableServer)) as raised:
        LMCacheServer(tmp_path / "server.log", python=fake_python(tmp_path, version), ready_timeout_s=10).start()
    assert ("takes another command line" in str(raised.value)) == refused, raised.value
    assert refused or "exited with 0 before it was ready" in str(raised.value), raised.value


def test_the_version_is_asked_once_per_python_not_per_restart(tmp_path):
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\necho probe >> {tmp_path / 'calls'}\necho 0.3.15\n")
    exe.chmod(0o755)
    server = LMCacheServer(tmp_path / "server.log", python=str(exe))
    for _ in range(3):  # lose_storage restarts a server twice per cell
        with pytest.raises(UndrivableServer, match="takes another command line"):
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


FAKE_SERVER = '''
import http.server, json, signal, socket, sys
args = dict(zip(sys.argv[3::2], sys.argv[4::2]))  # after "-m lmcache.v1.multiprocess.http_server"
zmq = socket.socket(); zmq.bind(("127.0.0.1", int(args["--port"]))); zmq.listen()
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"status": "healthy"}).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
signal.signal(signal.SIGINT, lambda *a: sys.exit(0))
http.server.HTTPServer(("127.0.0.1", int(args["--http-port"])), Health).serve_forever()
'''


def fake_server_python(tmp_path) -> str:
    """A 'python' whose LMCache server answers the health check and holds its ZMQ port, and exits on SIGINT."""
    import sys

    (tmp_path / "fake_server.py").write_text(FAKE_SERVER)
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\nif [ \"$1\" = -c ]; then echo 0.5.6; exit 0; fi\n"
                   f"echo start >> {tmp_path / 'starts'}\nexec {sys.executable} {tmp_path / 'fake_server.py'} \"$@\"\n")
    exe.chmod(0o755)
    return str(exe)


def test_an_engine_cells_server_loses_its_content_by_switching_to_a_spare_started_ahead(tmp_path):
    """With ``spare``, a server is launched beside the one in use; losing the content switches to it
    (never a restart waited for) and interrupts the old one; every server is stopped at the end."""
    from conformance.levels.services import LMCacheService

    service = LMCacheService(tmp_path / "lmcache-server.log", chunk_size=64, python=fake_server_python(tmp_path),
                             spare=True)
    service.launch()  # as an engine cell does when it is built: awaited at the first config()
    first = service.config()["lmcache.mp.port"]
    assert service._spare is not None and service._spare.proc is not None  # launched, not awaited
    old = service.server
    assert service.lose() == LMCacheService.LOST
    second = service.config()["lmcache.mp.port"]
    assert second != first and service.server.ready_s is not None
    assert old.proc.wait(timeout=10) == 0  # interrupted (SIGINT), and it left
    service._spare.ready()  # the new spare, launched by lose(): let it come up before all are stopped
    service.stop()
    assert (tmp_path / "starts").read_text().split() == ["start"] * 3  # the first, the one switched to, a new spare
    assert service.server.proc.poll() is not None and service._spare.proc.poll() is not None
    assert (tmp_path / "lmcache-server-1.log").exists()  # each server its own log


def test_a_server_launched_ahead_that_cannot_start_says_why_when_it_is_asked_for(tmp_path):
    from conformance.levels.services import LMCacheService

    service = LMCacheService(tmp_path / "lmcache-server.log", chunk_size=64, python=fake_python(tmp_path, "0.3.15"),
                             spare=True)
    service.launch()  # refused: nothing raised yet, the cell is still being built
    with pytest.raises(UndrivableServer, match="takes another command line"):
        service.config()


def test_without_a_spare_losing_the_content_restarts_the_server(tmp_path):
    """The connector level asks for no spare (its clauses run in forked children, and a spare their
    parent launched would end with the thread that started it): ``lose`` restarts, as before."""
    from conformance.levels.services import LMCacheService

    service = LMCacheService(tmp_path / "lmcache-server.log", chunk_size=64, python=fake_server_python(tmp_path))
    first = service.config()["lmcache.mp.port"]
    assert service._spare is None
    assert service.lose() == LMCacheService.LOST and service.config()["lmcache.mp.port"] != first
    service.stop()
    assert (tmp_path / "starts").read_text().split() == ["start"] * 2


def test_a_spare_asked_for_long_after_its_launch_is_checked_not_timed_out(tmp_path):
    """An old release's engine cell asks for its spare minutes after launching it: the readiness wait
    counts from the ask (it counted from the launch, and a healthy spare read as never ready)."""
    import time

    server = LMCacheServer(tmp_path / "server.log", python=fake_server_python(tmp_path), ready_timeout_s=1)
    server.launch()
    time.sleep(2)  # past its timeout, counted from the launch
    try:
        assert server.ready() is server and server.ready_s is not None
    finally:
        server.stop()


def test_a_cells_servers_are_all_asked_to_stop_before_any_is_waited_for(tmp_path):
    """An idle LMCache server takes seconds to shut down: the spare and the server in use are asked
    together, not one after the other's exit."""
    from conformance.levels.services import LMCacheService

    python = fake_server_python(tmp_path)
    stops = str(tmp_path / "stops")
    # On SIGINT a server says so, then leaves once both were asked (or after 10 s: asked one at a time).
    slow_exit = ("def leave(*a):\n"
                 f"    open({stops!r}, 'a').write('asked\\n')\n"
                 "    import time\n"
                 "    deadline = time.monotonic() + 10\n"
                 f"    while open({stops!r}).read().count('asked') < 2 and time.monotonic() < deadline:\n"
                 "        time.sleep(0.05)\n"
                 f"    open({stops!r}, 'a').write('left\\n')\n"
                 "    sys.exit(0)\n"
                 "signal.signal(signal.SIGINT, leave)")
    script = tmp_path / "fake_server.py"
    script.write_text(script.read_text().replace("signal.signal(signal.SIGINT, lambda *a: sys.exit(0))", slow_exit))
    service = LMCacheService(tmp_path / "lmcache-server.log", chunk_size=64, python=python, spare=True)
    service.config()
    service._spare.ready()
    service.stop()
    assert (tmp_path / "stops").read_text().split() == ["asked", "asked", "left", "left"]
