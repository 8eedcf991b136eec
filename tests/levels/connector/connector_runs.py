"""What the connector level's tests against real connectors share: the clauses, matrix.yaml's known
failures of vLLM's connectors, and one run of the suite against a connector, declared as its
expectations say (conformance/zoo/connectors/__init__.py for the zoo's)."""

from __future__ import annotations

from conformance.levels.connector.scenarios import CPU_KV_CACHE_DTYPES
from conformance.matrix import definition
from conformance.verdict import results
from conformance.verdict.clauses import CLAUSES
from conformance.vocabulary import DEFAULT_MODEL
from conformance.zoo import connectors as connector_zoo

from tests.conftest import REPO

API_CLAUSES = {c.id for c in CLAUSES.values() if c.level == "connector"}
PD = {c.id for c in CLAUSES.values() if c.level == "connector" and "pd" in c.requires}
# Judged only for a cache that declares its capacity (Disabled for the rest).
BOUNDED_ONLY = {c.id for c in CLAUSES.values() if c.level == "connector" and "capacity" in c.requires}
MATRIX = definition.load(REPO / "matrix.yaml")  # read once
ZOO, GOOD = connector_zoo.BAD, connector_zoo.GOOD  # the known-bad connectors' modules, and the known-good's
# vLLM's connectors that report transfer statistics or emit KV events, declared so (those clauses
# are Disabled for the rest); the zoo's declare theirs beside them.
VLLM_DECLARES = {"OffloadingConnector": ("stats", "events")}


def known_failures(connector: str) -> set[str]:
    """matrix.yaml's known connector-level failures of one of vLLM's connectors, as a cell of this
    session's stack would have them (the whole dtype axis, the default model): written once, there."""
    coordinates = {"connector": connector, "model": DEFAULT_MODEL, **results.stack_versions(results.package_versions()),
                   "kv_cache_dtype": definition.API_DTYPES_SEP.join(CPU_KV_CACHE_DTYPES)}
    return set(MATRIX.expected("connector", coordinates)[0])


def api_suite(run_suite, connector: str, *extra: str, persistent: bool | None = None):
    member = connector_zoo.ZOO.get(connector)
    persistent = (member is None or member.persistent) if persistent is None else persistent
    caps = (["persistent"] if persistent else []) + list(member.declares if member else VLLM_DECLARES.get(connector, ()))
    declared: tuple[str, ...] = (f"--kv-connector-capabilities={','.join(caps)}",) if caps else ()
    if member and member.capacity:
        declared += (f'--kv-connector-extra-config={{"capacity_bytes": {member.capacity}}}',)
    return run_suite(f"--kv-connector={connector}", "--kv-levels=connector", "--kv-profile=ci", *declared, *extra,
                     timeout=900)
