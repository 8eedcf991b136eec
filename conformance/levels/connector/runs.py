"""What a connector-level run records (``Run``), what its phases ask (``Phase``), and the outcomes a
run can end in besides its record: the connector raised, claimed what it never stored, claimed too
much, let a transfer stall, or the draw cannot be judged here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import torch

from conformance.levels.connector.eras.base import Image
from conformance.levels.connector.slots import by_block
from conformance.verdict.clauses import running
from conformance.verdict.guard import HarnessError

SAMPLED_TOKEN = 0
# fill(backing bytes, the dtype vLLM allocated, the model dtype): writes what "the model computed".
Filler = Callable[[torch.Tensor, torch.dtype, str], None]


class ConnectorRaised(Exception):
    """The connector under test raised from one of its hooks (a conformance failure)."""

    def __init__(self, phase: str, exc: BaseException) -> None:
        super().__init__(f"{phase}: {type(exc).__name__}: {exc}")
        self.phase, self.exc = phase, exc


class NotBuilt(ConnectorRaised):
    """The connector (or vLLM's configuration with it) could not be built, or registered its caches,
    here: a platform it declines, a dependency not installed, a configuration it refuses. Before any
    KV moved, so no clause was broken: Not runnable, in its own words (``cannot_run_here``)."""


class PhantomHit(Exception):
    """The connector claimed external KV in a run over storage nothing was ever stored in."""

    def __init__(self, label: str, run: Run) -> None:
        claimed = {rid: n for rid, n in run.external_tokens.items() if n}
        super().__init__(f"{label} claims KV it never stored: over empty storage, for prompts no run had "
                         f"seen, it claimed {claimed} external tokens [kv_cache_dtype={run.kv_cache_dtype}, "
                         f"layout={run.layout}, block_size={run.block_size}]; whatever it loaded there is "
                         "not KV any engine computed")
        self.run = run


class NegativeClaim(Exception):
    """The connector's get_num_new_matched_tokens claimed a negative number of tokens, which vLLM's
    scheduler takes as the request's computed tokens (a prompt it mis-measured)."""

    def __init__(self, request_id: str, claimed: int) -> None:
        super().__init__(f"get_num_new_matched_tokens claimed {claimed} tokens for request {request_id!r}, a "
                         "negative count vLLM's scheduler takes as the request's computed tokens (its "
                         f"num_computed_tokens becomes {claimed}): measure the prompt by request.num_prompt_tokens "
                         "(a prompt given as embeddings has no prompt_token_ids) and claim 0 or more")


class OverClaim(Exception):
    """The connector's get_num_new_matched_tokens claimed, beyond the tokens vLLM's own prefix cache
    already holds for a request, more than the request has: it counted those local hits again."""

    def __init__(self, request_id: str, local: int, claimed: int, length: int) -> None:
        super().__init__(f"get_num_new_matched_tokens claimed {claimed} tokens for request {request_id!r} ({length} "
                         f"tokens long) when vLLM's own prefix cache already held its first {local} (it passed "
                         f"num_computed_tokens {local}): {local} + {claimed} runs past the prompt. The count is of "
                         "the tokens beyond num_computed_tokens, so subtract those from what the connector holds")


class TransferStalled(HarnessError):
    """Every request left waits for an async load the connector never reported, though vLLM kept
    stepping (steps without a forward pass, as vLLM's ``kv_connector_no_forward`` runs them). An
    Error of any clause it stops; the clause that judges async loads makes it a Fail."""


class NotJudged(Exception):
    """The running clause cannot judge this configuration yet (a hybrid model's several KV cache
    groups, for a clause that follows one): Not runnable, with the reason."""


class DtypeFallback(NotJudged):
    """vLLM itself runs the requested kv_cache_dtype as another on this platform (vLLM-CPU 0.19-0.20
    run fp8 as auto): nothing of that dtype to judge. Drawn examples never ask for one
    (``session.probe_fallbacks`` takes it off the axis first); an explicit example of one is Not runnable."""


# Clauses whose scenario follows one KV cache group only (block reuse across groups, recompute
# after a preemption): Not runnable on a hybrid model rather than a verdict the suite cannot back.
ONE_GROUP_CLAUSES = frozenset({"api_no_collateral_writes", "api_preemption"})


def judged_with(groups: int) -> None:
    test = running()
    if groups > 1 and test is not None and test.clause in ONE_GROUP_CLAUSES:
        raise NotJudged(f"{test.clause} follows one KV cache group; this model has {groups} (vLLM's hybrid KV "
                        "cache manager): not judged on a hybrid model yet")


class LayoutRefused(ConnectorRaised):
    """The connector declined the layout up front (NotImplementedError while it was built or
    registered the caches): a clean refusal of a layout vLLM would not pick for it."""


@dataclass
class Run:
    """What one engine's lifetime left behind, for the clauses to compare byte by byte."""

    kv_cache_dtype: str
    layout: str
    block_size: int
    mla: bool
    caches: dict[str, torch.Tensor]
    before: torch.Tensor  # backing_bytes(caches) after the fill, before any hook ran
    blocks: dict[str, list[int]] = field(default_factory=dict)  # request id -> its block ids at the end
    # request id -> the blocks its KV was first computed in (``blocks`` differ after a preemption).
    origin: dict[str, list[int]] = field(default_factory=dict)
    external_tokens: dict[str, int] = field(default_factory=dict)  # request id -> tokens loaded
    load_errors: set[int] = field(default_factory=set)  # block ids the connector said failed, in time
    # load errors vLLM could not act on: blocks no request was loading into in the step they came
    late_load_errors: list[str] = field(default_factory=list)
    preempted: set[str] = field(default_factory=set)  # requests re-admitted after a preemption
    whole: set[str] = field(default_factory=set)  # requests whose whole prompt vLLM prefilled in their first step
    aborted: set[str] = field(default_factory=set)  # requests aborted through the scheduler
    misreports: list[str] = field(default_factory=list)  # transfer reports vLLM's contract forbids
    held: list[str] = field(default_factory=list)  # blocks never given back once everything ended
    # request id -> the kv_transfer_params vLLM handed back when it finished (a P/D producer's)
    transfer_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    reused: set[int] = field(default_factory=set)  # blocks overwritten once their request gave them back
    given_back: set[int] = field(default_factory=set)  # blocks given back, not yet allocated again
    freed_unsent: set[str] = field(default_factory=set)  # requests whose blocks came back unreported
    # A hybrid model's KV cache groups (one per attention type under vLLM's hybrid KV cache manager):
    # layer -> its group (absent: group 0), and request id -> its block ids in every group.
    groups: dict[str, int] = field(default_factory=dict)
    group_blocks: dict[str, list[list[int]]] = field(default_factory=dict)
    # the engine core's outputs of each step whose scheduler stats carry a connector stats payload
    stats: list[Any] = field(default_factory=list)
    # A lossy connector's declared tolerance, and the cache's element format: its loads are compared
    # as values of that format within the tolerance (``checks.same_rows``), not as bytes.
    tolerance: float | None = None
    element: torch.dtype = torch.uint8
    async_loads: set[str] = field(default_factory=set)  # requests that waited for an async load
    # the KV cache events the scheduler-side connector handed vLLM (take_events), in order, and
    # request id -> its block hashes as those events name them
    events: list[Any] = field(default_factory=list)
    block_hashes: dict[str, list[Any]] = field(default_factory=dict)
    # request id -> (num_computed_tokens vLLM asked get_num_new_matched_tokens with: its own prefix
    # cache's hits, the tokens the connector claimed beyond them), from the first ask that got a count
    claims: dict[str, tuple[int, int]] = field(default_factory=dict)
    asked_at: dict[str, int] = field(default_factory=dict)  # request id -> the step of that ask
    # (layer, block) -> the block's bytes when the layer's forward pass last read it as part of a
    # request's computed prefix (``LiveLifetime._read``); and the blocks that changed after that read:
    # a load that landed late (what the run is judged on is what the forward pass read).
    read: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)
    landed_late: list[str] = field(default_factory=list)

    @property
    def num_blocks(self) -> int:
        """Blocks in each layer's view (vLLM's KVCacheConfig may round what was asked)."""
        return by_block(next(iter(self.caches.values()))).shape[0]


class EmbedsTwin(NamedTuple):
    """The embeddings of ``seed`` but for one element of row ``row`` (negative: from the end), moved by
    one unit in the last place: a near miss that only an exact key of the embeddings tells apart."""
    seed: int
    row: int


@dataclass(frozen=True)
class Phase:
    """What one stretch of an engine's lifetime serves: ``requests`` (request id, prompt token ids,
    and optionally a ``cache_salt``) admitted together over caches ``fill`` wrote; ``aborts`` names
    requests the client abandons after that many steps of the phase (0: before any step);
    ``transfer`` the kv_transfer_params a request carries (P/D); ``loras`` the LoRA adapter a
    request is for; ``images`` the image its placeholder tokens stand for; ``embeds`` the seed of
    the embeddings a request is given instead of its token
    ids (its prompt's length theirs); ``fresh=False`` keeps the engine's own prefix cache and the
    blocks as the last phase left them (no reset, no fill: vLLM's local hits beside the connector's);
    ``reuse_freed`` overwrites each block as soon as its request
    gave it back, as vLLM's next request in it would (a P/D producer's); ``reuse_reallocated`` when
    vLLM gives it to another request, in that step's forward pass (after the connector's pre-forward
    hooks, where a connector that frees blocks with a save pending can still finish it)."""

    requests: Sequence[tuple[Any, ...]]
    fill: Filler
    aborts: Mapping[str, int] = field(default_factory=dict)
    transfer: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    loras: Mapping[str, str] = field(default_factory=dict)
    images: Mapping[str, Image] = field(default_factory=dict)
    embeds: Mapping[str, int | EmbedsTwin] = field(default_factory=dict)
    reuse_freed: bool = False
    reuse_reallocated: bool = False
    fresh: bool = True

    @property
    def serves(self) -> frozenset[str]:
        """What the engine must enable for this phase's requests besides token-id prompts."""
        return frozenset(name for name, used in (("lora", self.loras), ("prompt_embeds", self.embeds),
                                                 ("images", self.images)) if used)


