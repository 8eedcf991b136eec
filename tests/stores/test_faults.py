"""KVCONFORM_FAULT parsing (the injected faults themselves run in test_lmcache_stores.py)."""

from __future__ import annotations

import pytest

from conformance.stores import faults


def test_kill_server_after_puts_parses() -> None:
    fault = faults.parse("kill-server-after-puts:7")
    assert (fault.kind, fault.count) == (faults.KILL_SERVER_AFTER_PUTS, 7)
    assert str(fault) == "KVCONFORM_FAULT=kill-server-after-puts:7"


@pytest.mark.parametrize("text", ["kill-server-after-puts", "kill-server-after-puts:0",
                                  "kill-server-after-puts:x", "kill-everything:3"])
def test_unknown_or_malformed_fault_is_refused_with_the_valid_forms(text: str) -> None:
    with pytest.raises(ValueError, match="kill-server-after-puts:N"):
        faults.parse(text)


@pytest.mark.parametrize("env", [{}, {"KVCONFORM_FAULT": ""}, {"KVCONFORM_FAULT": "  "}])
def test_no_fault_unless_asked(env: dict[str, str]) -> None:
    assert faults.from_env(env) is None
