"""What a worker connector reports back each step, held against what vLLM's scheduler can accept.

vLLM trusts ``get_finished`` (``get_transfer_results``): a request reported ``finished_sending`` has
its blocks freed; ``finished_recving`` promotes a request that waited for an async load. A report
for a request vLLM is not waiting on, or a second report of one, hits an assertion in the engine
core's scheduler (the engine dies) or frees blocks another request now holds. The ledger vets each
report before vLLM sees it, drops the ones the contract forbids and keeps them, in words, for the
one clause that judges them (``api_transfer_reports``): every other clause sees a clean stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

WAITING_FOR_LOAD = "WAITING_FOR_REMOTE_KVS"  # vLLM's RequestStatus of a request whose async load runs
# KVConnectorOutput field -> what it reports. failed_recving (vLLM >= 0.32) marks a load that failed;
# vLLM's contract (KVConnectorTransferResults): a failed receive also appears in finished_recving,
# which is what ends the load's wait.
REPORTS = {"finished_recving": "load", "failed_recving": "failed load", "finished_sending": "save"}


@dataclass
class Ledger:
    """Every transfer report of one connector pair's lifetime, by request and step."""

    problems: list[str] = field(default_factory=list)
    phase: int = 1  # which pass of the lifetime is running, for the messages
    _seen: dict[tuple[str, str], str] = field(default_factory=dict)  # (kind, request id) -> step reported

    def admit(self, request_id: str) -> None:
        """A request (re)enters the engine: a request id is unique only among live requests."""
        for kind in set(REPORTS.values()):
            self._seen.pop((kind, request_id), None)

    def reported(self, kind: str, request_id: str) -> bool:
        """Whether a ``kind`` report (``save``, ``load``) for the request has passed this lifetime."""
        return (kind, request_id) in self._seen

    def vet(self, output: Any, scheduler: Any, step: int) -> None:
        """Check ``output``'s reports against the scheduler's state before ``update_from_output``;
        remove the forbidden ones from ``output``."""
        for attr, kind in REPORTS.items():
            ids = getattr(output, attr, None)
            if not ids:
                continue
            kept = set()
            for rid in sorted(ids):
                problem = self._problem(attr, kind, rid, scheduler, step, getattr(output, "finished_recving", None))
                if problem:
                    self.problems.append(f"pass {self.phase} step {step}: {problem}")
                else:
                    kept.add(rid)
                    self._seen[(kind, rid)] = f"pass {self.phase} step {step}"
            setattr(output, attr, kept)

    def _problem(self, attr: str, kind: str, rid: str, scheduler: Any, step: int,
                 output_recving: Any = None) -> str | None:
        hook = f"get_finished reported request {rid!r} in {attr}"
        if kind == "failed load" and rid not in (output_recving or ()):
            return (f"{hook} but not in finished_recving of the same step: vLLM marks the load failed and keeps "
                    "the request waiting for it forever; a failed receive also appears in finished_recving")
        if (kind, rid) in self._seen:
            return (f"{hook} again (first in {self._seen[(kind, rid)]}): vLLM acts on the first report "
                    f"({'frees the blocks' if kind == 'save' else 'schedules the request'}); a second one "
                    "asserts in the scheduler and the engine core dies. Report each finished transfer once")
        request = scheduler.requests.get(rid)
        if request is None:
            return (f"{hook}, a request vLLM does not hold (never added, or already freed): report only "
                    "requests vLLM handed the connector and has not freed")
        if kind == "save" and not request.is_finished():
            return (f"{hook} while it is still {request.status.name}: finished_sending is for a finished "
                    "request whose request_finished returned True (its blocks held for an async save)")
        if kind != "save" and not (request.status.name == WAITING_FOR_LOAD or request.is_finished()):
            return (f"{hook} while it is {request.status.name}: finished_recving is for a request whose "
                    "get_num_new_matched_tokens returned load_async=True and that still waits for that load")
        return None
