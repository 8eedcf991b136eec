"""The LMCache server launcher refuses, in one line, an LMCache whose server it cannot drive."""

from __future__ import annotations

import pytest

from conformance.engine.lmcache_server import LMCacheServer, _release


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


@pytest.mark.parametrize("version, release", [("0.5.6", (0, 5)), ("0.4.7", (0, 4)), ("0.3.15", (0, 3)),
                                               ("1.0.0rc1", (1, 0)), ("0.4.0.dev3+g1a2b", (0, 4)), ("7", (7, 0))])
def test_release_reads_major_and_minor(version, release):
    assert _release(version) == release
