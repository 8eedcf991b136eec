"""The input audit of the engine-level clauses (``conformance/verdict/audit``): each field its promise
depends on, and the near miss drawn in it."""

from __future__ import annotations

from conformance.verdict.audit.schema import Gap, Twin, unplaced

# Gaps several engine clauses share: no prompt pair that differs only at its start, or by one token.
_UNCHAINED = Gap('no prompts differing only in their first token: per-block keys not chained pass')
_ONE_TOKEN = Gap('no stored prompt asked one token changed/longer: claims rounded up a block pass')

# The damage both lost-storage clauses draw.
_HALVED = Twin('damage', "the store engine's intact storage beside the same with every file cut to half (or the LMCache "
    "server's store lost)",
    early=Gap("no damage only at a file's start or in one file of many: tail/length-only checks pass"),
    late=Gap("no cut of only the last byte (only a --kv-storage-hook's 'truncate'): coarse checks "
             'pass'),
    slight=Gap('no byte flipped at the same length: a connector without a checksum serves corrupt KV'),
    large=True,
    drawn_by='conformance.levels.subject:damage_files')

ROWS: dict[str, tuple[Twin, ...]] = {
    'engine_cache_salt': (
        Twin('cache_salt', "the same prompts stored unsalted, asked under a tenant's salt; a tenant's asked unsalted and "
             "under a third tenant's salt",
             **unplaced('a salt has no position'),
             slight=Gap('no two salts one character apart: a connector truncating or case-folding salts passes'),
             large=True,
             drawn_by='conformance.levels.engine.prompts:prompt_batches'),
    ),
    'engine_lora_isolation': (
        Twin('lora', "prompts stored for the base model asked under adapter A, A's asked by the base model, under "
             "adapter B and under A's next version (same name, other weights)",
             **unplaced('an adapter applies to every token of the request'),
             slight=True,
             large=True,
             drawn_by='conformance.levels.engine.adapters:lora_adapters'),
    ),
    'engine_prompt_embeds': (
        Twin('embeds', "one prompt's embeddings stored, asked as other embeddings of its length (another seed) and as "
             'zeros token ids; zeros stored, asked as embeddings',
             early=Gap("none differing only in the first token's vector: a tail-only digest passes"),
             late=Gap('none differing only in the last full block: keying embeds by first block/shape alone '
                      'passes'),
             slight=Gap('none one element (one ulp) apart: a digest taken after rounding or a cast passes'),
             large=True,
             drawn_by='conformance.levels.engine.prompts:_embeds_batches'),
    ),
    'engine_multimodal_isolation': (
        Twin('image', 'the same words after an image that opens the prompt, stored with one noise image, asked with '
             'another (every pixel drawn by another seed)',
             early=True,
             late=Gap('no image after text across a block edge: an id keyed only where placeholders start'),
             slight=Gap('no images one pixel apart: a lossy image digest (thumbnail, first bytes) passes'),
             large=True,
             drawn_by='conformance.levels.engine.prompts:_image_batches'),
    ),
    'engine_store_then_load': (
        Twin('tokens', 'independent prompts; a stored 4-block prompt and its extension past its last block edge; two '
             'sharing 2 blocks and diverging at the edge',
             early=_UNCHAINED,
             late=True,
             slight=_ONE_TOKEN,
             large=True,
             drawn_by='conformance.levels.engine.prompts:prompt_batches'),
    ),
    'engine_tensor_parallel': (
        Twin('rank', "every rank 0..N-1 of one N-rank engine asks for its own share of the same prompts' KV (only with"
             ' --kv-tensor-parallel N)',
             early=True,
             late=True,
             slight=True,
             large=Gap('no load at another world size: a key with the rank but not the world size passes'),
             drawn_by='conformance.levels.engine.cell:EngineCell'),
    ),
    'engine_block_size': (
        Twin('block_size', "an engine at the cell's block size stores, a fresh one at twice that block size asks for the "
             'same prompts',
             **unplaced('a block size has no position'),
             slight=True,
             large=Gap('no load far from (8x) or below (b/2) the stored block size: direction/chunk bugs pass'),
             drawn_by='conformance.levels.engine.cell:EngineCell'),
    ),
    'engine_same_engine_reload': (
        Twin('tokens', 'independent prompts; a stored 4-block prompt and its extension past its last block edge; two '
             'sharing 2 blocks and diverging at the edge',
             early=_UNCHAINED,
             late=True,
             slight=_ONE_TOKEN,
             large=True,
             drawn_by='conformance.levels.engine.prompts:prompt_batches'),
    ),
    'engine_abort': (
        Twin('timing', 'two prompts aborted one engine step after they were added (prefilled, save in flight), then the '
             'same prompts served whole after a reset',
             early=True,
             late=Gap("no abort at a request's last step (finish and abort racing): a leak or double free "
                      'there passes'),
             slight=Gap('no aborts one step apart (0: never scheduled; 2: decoding): request_finished edge '
                        'cases pass'),
             large=True,
             drawn_by='conformance.levels.engine.prompts:prompt_batches'),
    ),
    'engine_pd_roundtrip': (
        Twin('tokens', "the producer's independent prompts and two sharing 2 blocks then diverging at the edge, each "
             'handed to the consumer with its own params',
             early=_UNCHAINED,
             late=True,
             slight=Gap('no prompts one token apart: params matched by a lossy key or length pass'),
             large=True,
             drawn_by='conformance.levels.engine.prompts:prompt_batches'),
    ),
    'engine_hma_groups': (
        Twin('model', 'one hybrid model (sliding-window layer, then full attention) served by each connector engine and'
             ' by the no-connector baseline',
             early="vLLM keeps its hybrid manager by the connector's class (SupportsHMA), not by the layers' "
                   'order',
             late="vLLM keeps its hybrid manager by the connector's class (SupportsHMA), not by the layers' "
                  'order',
             slight='which layers are sliding-window does not change whether vLLM keeps the manager on',
             large='a model of one attention type has one KV cache group with any connector (Not runnable)',
             drawn_by='conformance.levels.engine.test_engine:_connector_engines'),
    ),
    'engine_block_reuse': (
        Twin('timing', 'prompts of N blocks served one by one in a cache of N+1 usable blocks: each next prompt is given'
             ' the blocks the one before gave back',
             early=Gap("a request's first block goes two prompts later (tail freed first): a late first-block "
                       'read'),
             late=True,
             slight=True,
             large='reuse at once is the strictest: a read any later sees the same blocks overwritten',
             drawn_by='conformance.levels.engine.cell:EngineCell'),
    ),
    'engine_effective_dtype': (
        Twin('kv_cache_dtype', "each connector engine's requested kv_cache_dtype beside the cache dtype vLLM resolved and the KV"
             " tensors' dtype: no second format drawn",
             **unplaced('a dtype has no position'),
             slight='no pair: the request is matched exactly against what vLLM resolved (the matrix runs each '
                    'dtype)',
             large='no pair: the request is matched exactly against what vLLM resolved (the matrix runs each '
                   'dtype)',
             drawn_by='conformance.contract.spec:KVSpec'),
    ),
    'engine_format_isolation': (
        Twin('kv_cache_dtype', "an engine of the cell's kv_cache_dtype stores; a fresh one of its same-width twin (e4m3/e5m2, "
             'bf16/fp16; auto: float16) asks the same prompts',
             **unplaced('a dtype has no position'),
             slight=True,
             large=Gap('no format of another width (bf16 stored, fp8 asked): size misreads/crashes unjudged'),
             drawn_by='conformance.contract.spec:same_width_twin'),
        Twin('model_dtype', 'not drawn: every engine runs its model in bfloat16; under auto the twin asks float16 by name, '
             'never auto with a float16 model',
             **unplaced('a dtype has no position'),
             slight=Gap('no auto with a float16 model beside bf16: a config-string key passes'),
             large=Gap('no auto with a float32 model (other width, same string): unjudged here'),
             drawn_by='conformance.contract.spec:same_width_twin'),
    ),
    'engine_model_isolation': (
        Twin('model', 'an engine of the model stores; a fresh engine of another checkpoint (every weight redrawn, '
             'another directory, or --kv-other-model) asks',
             **unplaced("which layers' weights differ does not change what a connector keys by (all are redrawn)"),
             slight=Gap('no checkpoint under the same name/path (updated in place): a name-only key passes'),
             large=True,
             drawn_by='conformance.levels.engine.cell:EngineCell'),
    ),
    'engine_block_boundaries': (
        Twin('tokens', 'independent prompts of bs-1, bs, bs+1, 2bs, 2bs+1, 3bs+7, 4bs tokens; the 4-block one extended '
             'past its last block edge',
             early=_UNCHAINED,
             late=True,
             slight=Gap('no stored prompt asked one token longer/shorter: a partial last block claimed passes'),
             large=True,
             drawn_by='conformance.levels.engine.prompts:prompt_batches'),
    ),
    'engine_shared_prefix': (
        Twin('tokens', 'three conversations after one system prompt: two diverging just past it (mid-block), the third '
             'extending the first by 40 tokens',
             early=Gap('no conversations differing only at their start: per-block keys not chained pass'),
             late=True,
             slight=Gap('no conversations one token apart: a lossy token digest passes'),
             large=True,
             drawn_by='conformance.levels.engine.prompts:_conversations'),
    ),
    'engine_cache_pressure': (
        Twin('timing', 'prompts filling the capacity 3 times over, stored one by one, asked by a fresh engine newest '
             'first (reuse distance 0 up to all)',
             early=True,
             late=True,
             slight=True,
             large=True,
             drawn_by='conformance.levels.engine.prompts:pressure_batches'),
        Twin('size', 'every prompt of one length (whole blocks and 5 tokens), sized from the declared capacity',
             **unplaced('a size has no position'),
             slight=Gap('no prompts a block apart in size: reused space trusting an old length passes'),
             large=Gap('no prompt larger than the whole capacity: a self-evicting or partial entry passes'),
             drawn_by='conformance.levels.engine.prompts:pressure_batches'),
    ),
    'engine_concurrent_requests': (
        Twin('batch', 'four requests admitted together: two sharing 2 blocks and diverging at the edge, two sharing '
             'nothing',
             early=Gap("no mates differing only in their first block: unchained keys hand a mate's KV"),
             late=True,
             slight=Gap('no mates one token apart: matching loads to requests by a lossy key passes'),
             large=True,
             drawn_by='conformance.levels.engine.prompts:prompt_batches'),
    ),
    'engine_lost_storage': (_HALVED,),
    'engine_load_failure_recompute': (_HALVED,),
}
