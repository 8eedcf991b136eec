"""What an engine is asked to run (``EngineSpec``, its ``Batch``es) and what it records (``EngineResult``,
a ``Request`` each), as the cell writes them and the engine child reads and writes them (JSON
between two processes): typed, so that a key the two sides spell differently is a type error
rather than a silent default."""

from __future__ import annotations

from typing import Any, TypedDict

# What an engine runs with where its spec leaves a setting out (the child applies them; the cell sizes by them).
DEFAULT_MODEL_LEN = 1024  # max_model_len, unless its prompts need more
DEFAULT_MODEL_DTYPE = "bfloat16"  # the dtype vLLM loads the weights in (what kv_cache_dtype=auto stores)
DEFAULT_KV_CACHE_MB = 64
DEFAULT_MAX_NUM_SEQS = 8
DEFAULT_MAX_TOKENS = 8  # tokens generated per request
DEFAULT_LOGPROBS = 5  # the top-k logprobs recorded per step


class _Prompts(TypedDict):
    name: str
    prompts: list[list[int]]


class Batch(_Prompts, total=False):
    """Prompts an engine serves together (``together``) or one by one, in a phase (the engine's own
    prefix cache is reset before each later phase), as a tenant, under an adapter, or given as
    embeddings or after images."""

    together: bool
    phase: int
    cache_salt: str
    lora: bool | str  # True: the first adapter; "b": the second; "a2": the first's next version
    embeds: list[int]  # each prompt's embeddings seed
    images: list[int]  # each prompt's image seed
    kv_transfer_params: list[dict[str, Any] | None]  # a P/D consumer's, one per prompt
    abort_after_steps: int


class _Engine(TypedDict):
    model: str
    kv_cache_dtype: str
    block_size: int
    batches: list[Batch]


class EngineSpec(_Engine, total=False):
    """One engine: the model and its KV cache, the connector (none: vLLM alone), what it serves, and
    the settings of the roles that need their own (``child``'s docstring says what each does)."""

    torch_threads: int
    model_dtype: str
    max_model_len: int
    max_num_seqs: int
    kv_cache_mb: int
    num_blocks: int
    connector: dict[str, Any]  # KVTransferConfig's keyword arguments
    tensor_parallel_size: int
    lora_adapter: str
    prompt_embeds: bool
    images: dict[str, Any]  # the image model recipe's "images"
    max_tokens: int
    logprobs: int
    drain: bool
    settle_s: float  # how long before each later phase its saves take to become visible (settle=SECONDS)
    prefill_chunk: int  # a split reference's chunk
    cached_prefix: int  # a prefix-cache reference's cached tokens
    kv_transfer_params: dict[str, Any]  # what every request carries (a P/D producer's)
    serve_until: str
    serve_s: float
    multiprocessing: bool
    result_path: str  # set by the child that runs it


class Step(TypedDict):
    token: int
    logprob: str  # float.hex: compared as bits
    top: list[list[Any]]  # [token, float.hex] of the top-k


class Request(TypedDict):
    """What an engine recorded of one request (``kv_transfer_params``: what its output returned)."""

    batch: str
    phase: int
    idx: int
    group: int
    prompt_len: int
    tokens: list[int]
    steps: list[Step]
    finish_reason: str
    num_cached_tokens: int
    counters_delta: dict[str, float]
    kv_transfer_params: dict[str, Any] | None


class Resolved(TypedDict, total=False):
    """What vLLM made of the engine's settings, read back from the running engine."""

    cache_dtype: str
    block_size: int
    kv_cache_layout: str
    kv_tensor_dtype: str
    use_mla: bool
    kv_cache_groups: list[str] | str
    device: str


class EngineResult(TypedDict, total=False):
    """An engine's RESULT.json: whether it ran its batches (``ok``) or why not, what it served, what
    vLLM resolved, its timings and its process; ``reused_from`` where a baseline store supplied it."""

    ok: bool
    error: str
    traceback: str
    imported_vllm: bool  # False in a child an engine host forked
    vllm_version: str
    versions: dict[str, str]
    engine_settings: list[dict[str, Any]]  # what this vLLM release required of the cell (``releases``)
    warnings: list[str]
    process: dict[str, Any]  # ``separate.identity``
    torch_threads: int
    resolved: Resolved
    requests: list[Request]
    prefix_cache_resets: list[bool]
    aborted: dict[str, dict[str, Any]]  # per batch: what vLLM kept of the requests it was told to abort
    drained: bool
    counters: dict[str, float]  # vLLM's prefix-cache counters, from every step's scheduler stats (``counters``)
    counters_logged: dict[str, float]  # the same as vLLM's loggers hold them (before 0.28, fewer steps)
    t_import_s: float
    t_engine_start_s: float
    t_batches_s: dict[str, float]
    reused_from: str
