"""The one mechanism behind every child the suite forks (``conformance.util.forking``): a fork server
that says it is ready, forks a child per request, each in a group of its own with its output in its
own log, reports each end, and takes its children with it when it dies; its client that reads a
server that dies or hangs as one that failed, never as a hang."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from conformance.util import forking, procs

SERVER = """
import os, sys, time
from pathlib import Path
from conformance.util import forking

channel = forking.protocol_channel()
print("what an import prints on stdout")  # goes to the server's log, never into the protocol
if os.environ.get("REFUSE"):
    forking.say(channel, {"ready": False, "why": "refused for the test"})
    sys.exit(0)
forking.say(channel, {"ready": True, "server": os.getpid()})


def body(request):
    print("child", request["what"], "in group", os.getpgid(0))
    if request["what"] == "raise":
        raise RuntimeError("boom")
    if request["what"] == "exit":
        sys.exit(3)
    if request["what"] == "sleep":
        time.sleep(600)


forking.serve(channel, lambda r: forking.fork_child(lambda: body(r), Path(r["log"]), close=(channel,)))
"""
ROOT = Path(__file__).resolve().parents[2]


def _server(tmp_path: Path, reply_s: float = 30, **env: str) -> forking.ForkServer:
    log = tmp_path / "server.log"
    proc = procs.spawn_speaking([sys.executable, "-c", SERVER], log,
                                {**os.environ, "PYTHONPATH": str(ROOT), **env}, die_with_parent=True)
    return forking.ForkServer(proc, "test fork server", log, reply_s=reply_s)


@pytest.fixture
def server(tmp_path):
    forks = _server(tmp_path)
    yield forks
    forks.close(grace_s=5)


def test_each_child_has_its_group_its_log_and_its_exit_status(server, tmp_path):
    assert server.wait_ready(60) and server.ready["server"] == server.proc.pid
    children = {what: server.fork({"what": what, "log": str(tmp_path / f"{what}.log")})
                for what in ("ok", "raise", "exit")}
    assert {what: child.wait(30) for what, child in children.items()} == {"ok": 0, "raise": forking.CHILD_FAILED,
                                                                            "exit": 3}
    for what, child in children.items():
        printed = (tmp_path / f"{what}.log").read_text()
        assert f"child {what} in group {child.pid}" in printed  # a group of its own, led by itself
    assert "RuntimeError: boom" in (tmp_path / "raise.log").read_text()  # why it failed, in its log
    assert "what an import prints" in (tmp_path / "server.log").read_text()


def test_a_child_is_killed_with_its_group_and_reads_as_killed(server, tmp_path):
    child = server.fork({"what": "sleep", "log": str(tmp_path / "sleep.log")})
    assert child.pid is not None and child.poll() is None
    procs.kill_group(child)
    assert child.wait(30) == -signal.SIGKILL


def test_a_server_that_dies_takes_its_children_with_it(server, tmp_path):
    child = server.fork({"what": "sleep", "log": str(tmp_path / "sleep.log")})
    pid = child.pid
    assert pid is not None
    os.kill(server.proc.pid, signal.SIGKILL)
    assert child.wait(30) == -signal.SIGKILL  # as the client reads it
    deadline = time.monotonic() + 30
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)  # and it is gone, nothing left holding cores
    later = server.fork({"what": "ok", "log": str(tmp_path / "later.log")})
    assert later.pid is None and "the test fork server exited" in later.error and later.poll() == 1


def test_a_server_that_hangs_fails_its_forks_within_the_reply_deadline(tmp_path):
    forks = _server(tmp_path, reply_s=1)
    try:
        assert forks.wait_ready(60)
        os.kill(forks.proc.pid, signal.SIGSTOP)
        child = forks.fork({"what": "ok", "log": str(tmp_path / "ok.log")})
        assert child.pid is None and child.error == "the test fork server did not answer within 1s"
    finally:
        forks.close(grace_s=0)


def test_a_server_that_refuses_says_why(tmp_path):
    forks = _server(tmp_path, REFUSE="1")
    try:
        assert not forks.wait_ready(60) and forks.failed == "refused for the test"
    finally:
        forks.close(grace_s=5)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_fork_child_sets_the_group_before_it_returns(tmp_path):
    """The caller may kill the child's group the moment it has the pid."""
    pid = forking.fork_child(lambda: time.sleep(600), tmp_path / "child.log")
    try:
        assert os.getpgid(pid) == pid
    finally:
        procs.kill_pgid(pid)
        assert os.waitpid(pid, 0)[1] == signal.SIGKILL
