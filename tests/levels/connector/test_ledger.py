"""The ledger's rules for get_finished reports, on the scheduler state vLLM keeps (no vLLM needed)."""

from __future__ import annotations

from types import SimpleNamespace

from conformance.levels.connector.ledger import Ledger


def _request(status: str) -> SimpleNamespace:
    return SimpleNamespace(status=SimpleNamespace(name=status), is_finished=lambda: status.startswith("FINISHED"))


def _scheduler(**requests: str) -> SimpleNamespace:
    return SimpleNamespace(requests={rid: _request(status) for rid, status in requests.items()})


def _output(sending=(), recving=()) -> SimpleNamespace:
    return SimpleNamespace(finished_sending=set(sending), finished_recving=set(recving))


def test_a_report_vllm_is_waiting_for_passes_through():
    ledger, out = Ledger(), _output(sending={"a"}, recving={"b"})
    ledger.vet(out, _scheduler(a="FINISHED_STOPPED", b="WAITING_FOR_REMOTE_KVS"), step=3)
    assert (out.finished_sending, out.finished_recving, ledger.problems) == ({"a"}, {"b"}, [])


def test_a_second_report_is_dropped_and_named_with_both_steps():
    ledger = Ledger()
    ledger.vet(_output(sending={"a"}), _scheduler(a="FINISHED_STOPPED"), step=1)
    again = _output(sending={"a"})
    ledger.vet(again, _scheduler(), step=2)
    assert again.finished_sending == set()
    (problem,) = ledger.problems
    assert "'a' in finished_sending again (first in pass 1 step 1)" in problem and problem.startswith("pass 1 step 2")


def test_reports_for_requests_vllm_does_not_wait_on_are_dropped():
    ledger, out = Ledger(), _output(sending={"running", "gone"}, recving={"computing"})
    ledger.vet(out, _scheduler(running="RUNNING", computing="RUNNING"), step=0)
    assert out.finished_sending == out.finished_recving == set()
    text = " ".join(ledger.problems)
    assert "'gone' in finished_sending, a request vLLM does not hold" in text
    assert "'running' in finished_sending while it is still RUNNING" in text
    assert "'computing' in finished_recving while it is RUNNING" in text


def test_a_request_id_may_come_back_once_vllm_freed_it():
    ledger = Ledger()
    ledger.vet(_output(sending={"a"}), _scheduler(a="FINISHED_STOPPED"), step=0)
    ledger.admit("a")
    out = _output(sending={"a"})
    ledger.vet(out, _scheduler(a="FINISHED_STOPPED"), step=5)
    assert out.finished_sending == {"a"} and ledger.problems == []


def test_a_failed_receive_comes_with_its_finished_receive():
    """vLLM 0.32's contract (KVConnectorTransferResults): a failed receive also appears in
    finished_recving, which ends the wait; both in one step is one report, not two."""
    ledger, out = Ledger(), _output(recving={"a"})
    out.failed_recving = {"a"}
    ledger.vet(out, _scheduler(a="WAITING_FOR_REMOTE_KVS"), step=4)
    assert (out.finished_recving, out.failed_recving, ledger.problems) == ({"a"}, {"a"}, [])


def test_a_failed_receive_alone_leaves_the_request_waiting_and_is_named():
    ledger, out = Ledger(), _output()
    out.failed_recving = {"a"}
    ledger.vet(out, _scheduler(a="WAITING_FOR_REMOTE_KVS"), step=4)
    (problem,) = ledger.problems
    assert out.failed_recving == set() and "not in finished_recving of the same step" in problem
