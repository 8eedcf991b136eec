"""The input audit of the connector-level clauses (``conformance/verdict/audit``): each field its promise
depends on, and the near miss drawn in it."""

from __future__ import annotations

from conformance.verdict.audit.schema import Gap, Twin, unplaced

ROWS: dict[str, tuple[Twin, ...]] = {
    'api_requirements': (
        Twin('api', "each vLLM name the connector's modules import, override or call, looked up in the installed vLLM",
             **unplaced('a name has no position: it resolves in the installed vLLM or it does not'),
             slight="nothing is drawn: the connector's names as written against one vLLM; a renamed name is "
                    'another release, judged in its own cell (and named with where it was last seen)',
             large='nothing is drawn: a module or name gone is another release, judged in its own cell',
             drawn_by='conformance.api_surface.requirements:check_requirements'),
    ),
    'api_save_load_roundtrip': (
        Twin('layout', 'each drawn case stored and loaded in one layout the installed vLLM allocates; never stored in '
             'one layout and loaded by a pair of another',
             **unplaced('a layout has no position'),
             slight=Gap('a prompt stored in one layout and loaded by a pair of its twin (NHD vs HND, LBHNC vs '
                        'LBNHC) over the same storage: a connector that stores raw pages untagged serves '
                        'transposed KV.'),
             large=Gap('stored per layer, loaded by a cross-layer (blocks-first) pair or back: a connector '
                       "that saves the raw cross-layer buffer serves one layer's rows as another's."),
             drawn_by='conformance.levels.connector.test_connector_api:_draw_case'),
        Twin('kv_cache_dtype', 'one prompt round-tripped in every kv_cache_dtype of the axis (and drawn ones), stored and loaded'
             ' in the same dtype',
             **unplaced('a dtype is one value: it has no position'),
             slight='one dtype per round trip: stored in one format, loaded in its twin is '
                    "api_format_isolation's",
             large="one dtype per round trip: another format family on load is api_format_isolation's",
             drawn_by='conformance.levels.connector.test_connector_api:_every_dtype_once'),
        Twin('content', "the store run's drawn bits (random bytes, NaN payloads, -0, subnormals, fp8 specials a cast "
             "changes by a bit, some caches all one special) against other bits in the load run's blocks",
             early=True,
             late=True,
             slight=True,
             large=True,
             drawn_by='conformance.levels.connector.scenarios:filler'),
        Twin('block_size', 'a 135-token prompt stored by a pair of 16-token blocks, asked for by a fresh pair of 32-token '
             'blocks over the same storage',
             **unplaced('a block size has no position (the prompt ends mid-block in both)'),
             slight=True,
             large=Gap('only 16 -> 32 runs; never 32 -> 16 or 16 -> 64: a connector that maps stored blocks to'
                       ' loaded ones by one fixed ratio (or splits only one way) misplaces tokens.'),
             drawn_by='conformance.levels.connector.test_connector_api:_across_block_sizes'),
        Twin('size', 'a prompt just past 16 MiB of KV per layer (by half a block) against the drawn prompts, under 512'
             ' KiB',
             **unplaced('a size has no position'),
             slight=True,
             large=True,
             drawn_by='conformance.levels.connector.test_connector_api:_loads_a_large_payload'),
    ),
    'api_same_engine_roundtrip': (
        Twin('timing', 'a prompt stored, then asked for in the next phase of the same pair (prefix cache reset, every '
             'block overwritten, one neighbour first)',
             early=True,
             late="api_reuse_distance asks for a prompt after 23 others were stored in the same pair's "
                  'lifetime',
             slight=True,
             large='api_reuse_distance fills the pair past what a small cache holds (12 MiB), capacity '
                   'declared or not',
             drawn_by='conformance.levels.connector.test_connector_api:_same_engine'),
        Twin('content', "the first phase's drawn bits against other drawn bits written over every block before the second",
             early=True,
             late=True,
             slight=True,
             large=True,
             drawn_by='conformance.levels.connector.scenarios:filler'),
    ),
    'api_no_collateral_writes': (
        Twin('batch', "the loaded request's blocks against the neighbour's (admitted first, just before them) and the "
             'free blocks after them; in the store run, every block',
             early=True,
             late=True,
             slight=True,
             large=True,
             drawn_by='conformance.levels.connector.test_connector_api:_store_and_load'),
    ),
    'api_partial_prefix': (
        Twin('tokens', 'the stored prompt against one sharing exactly its first k tokens: its first token, third block '
             'or next-to-last token changed; its block edges +-1 token; drawn k, another tail',
             early=True,
             late=True,
             slight=True,
             large=True,
             drawn_by='conformance.levels.connector.scenarios:Prompts'),
    ),
    'api_concurrent_loads': (
        Twin('batch', 'two batch-mates admitted in one step, stored together and loaded together in the other order: '
             'drawn prompts that share nothing, a prompt and its twin but for its first token, and its twin but for its '
             'last block',
             early=True,
             late=True,
             slight=True,
             large=True,
             drawn_by='conformance.levels.connector.test_connector_api:_batch_twins'),
    ),
    'api_shared_prefix': (
        Twin('tokens', 'conversations sharing a 1k or 4k system prompt: tails that differ wholly after it, one differing'
             ' only from its last whole block, one extending a stored one by 3 blocks; a stored one but for its first '
             'token (every later block shared, none as a prefix), and but for one token mid-way through the system '
             'prompt',
             early=True,
             late=True,
             slight=True,
             large=True,
             drawn_by='conformance.levels.connector.scenarios:Prompts'),
    ),
    'api_mixed_hits': (
        Twin('tokens', "an 85-token stored prompt asked for with its first 2 blocks in vLLM's own prefix cache (a "
             '33-token prefix ran since), and a prompt extending it by 3 blocks',
             early=True,
             late=Gap("local hits covering all but the stored prompt's last block: a connector that subtracts "
                      'local hits from a count rounded to its chunks claims a negative count or a token past '
                      'the prompt.'),
             slight=Gap('one local-hit length only (2 blocks, half an LMCache chunk): offset arithmetic right '
                        'only at that length (wrong at a whole chunk, 4 blocks, or one block more) is not '
                        'tried.'),
             large=True,
             drawn_by='conformance.levels.connector.test_workloads:test_mixed_hits'),
    ),
    'api_damaged_storage': (
        Twin('damage', "each file the store run wrote, as written and with its middle byte inverted (or a server's "
             'content lost)',
             early=Gap("a byte flipped near a file's start (header, length, magic): a connector that checksums"
                       ' only the payload trusts a corrupt header and reads wrong offsets into the blocks.'),
             late=Gap("the last byte flipped (a footer, the checksum itself, the last block's data): a check "
                      'that covers all but the tail lets it through.'),
             slight=True,
             large=Gap("for file storage, never a file halved or deleted (only a server's content is lost "
                       'whole): an index that outlives its files claims blocks whose file is gone, or the '
                       'reader raises.'),
             drawn_by='conformance.levels.connector.test_connector_api:_stored_then_damaged'),
    ),
    'api_format_isolation': (
        Twin('kv_cache_dtype', 'the same prompt stored by a pair of one kv_cache_dtype, asked for by a pair of its same-width '
             'twin (fp8_e4m3/fp8_e5m2, bfloat16/float16) over the same storage',
             **unplaced('a dtype is one value: it has no position'),
             slight=True,
             large=Gap("a 16-bit pair's prompt asked for by an fp8 pair (another width): a token-keyed "
                       "connector that copies by the loading cache's size serves half a bf16 entry as fp8 KV."),
             drawn_by='conformance.levels.connector.scenarios:TWINS'),
        Twin('model_dtype', 'the same prompt stored under kv_cache_dtype=auto by the model served as bf16, asked for by it '
             'served as fp16 (one width), and fp16 then fp32 (another width): one config string, other bytes',
             **unplaced('a dtype is one value: it has no position'),
             slight=True,
             large=True,
             drawn_by='conformance.contract.strategies:MODEL_DTYPE_TWINS'),
    ),
    'api_model_isolation': (
        Twin('model', 'the same prompt stored by an engine of the model, asked for by an engine of another checkpoint '
             '(weights of seed + 1) in a sibling directory of another name',
             early=Gap('another checkpoint in a directory of the same name under another parent '
                       '(.../run-a/model vs .../run-b/model): a connector keyed by the basename serves the '
                       "other run's KV."),
             late=Gap('model paths that differ only in their last characters (checkpoint-1000 vs '
                      'checkpoint-2000 under one long run directory): a key that truncates the path keeps only'
                      ' its start.'),
             slight="a path's one-character change is the late twin; weights replaced at the same path no "
                    'connector can tell without reading them (not judged)',
             large=True,
             drawn_by='conformance.levels.connector.test_connector_api:test_model_isolation'),
    ),
    'api_cache_salt': (
        Twin('cache_salt', "the same prompt under cache_salt 'salt-a', 'salt-b' and none, both ways (an unsalted prompt "
             'asked for by salted tenants)',
             **unplaced('a salt has no position in the prompt (vLLM hashes it into the first block)'),
             slight=True,
             large=True,
             drawn_by='conformance.levels.connector.test_lifecycle:test_cache_salt'),
    ),
    'api_lora_isolation': (
        Twin('lora', 'the same prompt under adapter-a, adapter-b, adapter-a@v2 (its name and id, another directory) '
             'and the base model, both ways',
             **unplaced('an adapter has no position in the prompt'),
             slight=True,
             large=True,
             drawn_by='conformance.levels.connector.test_lifecycle:test_lora_isolation'),
    ),
    'api_prompt_embeds': (
        Twin('embeds', 'one length given as embeddings of one seed, of another seed (every value differs), as the '
             'token ids vLLM puts in their place (zeros), every way; and the stored embeddings but for one element '
             'of their first row, or of the last row of their last whole block, one unit in the last place away',
             early=True,
             late=True,
             slight=True,
             large=True,
             drawn_by='conformance.levels.connector.runs:EmbedsTwin'),
    ),
    'api_multimodal_isolation': (
        Twin('image', "the same token ids with image 'cat', with image 'dog' (32 placeholder tokens from token 2) and "
             'as text, both ways',
             early=True,
             late=Gap('an image placed late (in the last block, after text): a connector that folds image '
                      "identifiers into the first block's key only (or only for a prompt opening with one) "
                      'serves the KV.'),
             slight="no pixels here: an image is its identifier (vLLM's hash), which any pixel changes whole",
             large=True,
             drawn_by='conformance.levels.connector.test_lifecycle:test_multimodal_isolation'),
    ),
    'api_chunked_prefill': (
        Twin('timing', 'an 85-token prompt prefilled in chunks of 32 tokens (2 blocks: max_num_batched_tokens), then '
             'asked for again',
             early=True,
             late=True,
             slight=Gap('a token budget one token off a block multiple (a chunk ending mid-block): a connector'
                        " that saves each chunk's blocks as the chunk ends, never rewriting the half-filled "
                        'one, stores stale bytes.'),
             large=Gap('a prompt of many chunks (tens, not 3): a connector that tracks a bounded number of '
                       'pending chunk saves per request drops the later ones.'),
             drawn_by='conformance.levels.connector.test_lifecycle:_chunk'),
    ),
    'api_abort': (
        Twin('timing', 'a request aborted after one step of its prefill, another after one step of its load, beside '
             'batch-mates that finish; each prompt asked for again',
             early=True,
             late=Gap("an abort at the request's last prefill step or just after it, its save in flight: a "
                      'connector that frees or never reports a save it still reads is caught only when aborted'
                      ' early.'),
             slight='an abort is one event: where it falls is early or late',
             large=True,
             drawn_by='conformance.levels.connector.test_lifecycle:test_abort'),
    ),
    'api_preemption': (
        Twin('timing', 'two 7-block prompts prefilled side by side in 10 usable blocks: one preempted (after about 5 of '
             'its blocks) and re-admitted, the other not; each asked for again',
             early=Gap('a request preempted after its first block: a connector that marks blocks saved when '
                       'scheduled, not after their forward pass, claims a block never written before the '
                       'preemption.'),
             late=True,
             slight='a preemption is one event: where it falls is early or late',
             large=True,
             drawn_by='conformance.levels.connector.test_lifecycle:test_preemption'),
    ),
    'api_async_load': (
        Twin('timing', 'a stored prompt asked for alone in the next phase: its async load reported over steps in which '
             'no layer hook runs',
             early=True,
             late='one load right after its store: its distance from the store is not the point',
             slight="when the load lands is the connector's: the harness steps until it is reported",
             large="when the load lands is the connector's: the harness steps until it is reported",
             drawn_by='conformance.levels.connector.test_lifecycle:test_async_load'),
    ),
    'api_save_before_free': (
        Twin('timing', "the stored request's blocks given to the next request's chunk in the step it gave them back, "
             "overwritten by that chunk's forward pass",
             early=True,
             late='reuse later than at once only gives a save more time: the tightest is drawn',
             slight=True,
             large='reuse later than at once only gives a save more time: the tightest is drawn',
             drawn_by='conformance.levels.connector.test_lifecycle:test_save_before_free'),
    ),
    'api_transfer_reports': (
        Twin('timing', 'two prompts stored in one pass and both asked for again in the next: each save and load reported'
             ' in the step it finishes',
             early="which step a transfer ends in is the connector's: the harness steps until every block is "
                   'back',
             late="which step a transfer ends in is the connector's: the harness steps until every block is "
                  'back',
             slight="which step a transfer ends in is the connector's: the harness steps until every block is "
                    'back',
             large="which step a transfer ends in is the connector's: the harness steps until every block is "
                   'back',
             drawn_by='conformance.levels.connector.test_lifecycle:test_transfer_reports'),
    ),
    'api_connector_stats': (
        Twin('api', "the stats of a store pass and a reload pass through the installed vLLM's own path (msgpack, "
             'build_kv_connector_stats, aggregate, reduce)',
             **unplaced('a name has no position'),
             slight="the installed vLLM's path as it is: a renamed name is another release, judged in its own "
                    'cell',
             large="the installed vLLM's path as it is: a gone name is another release, judged in its own cell",
             drawn_by='conformance.levels.connector.test_lifecycle:test_connector_stats'),
    ),
    'api_kv_events': (
        Twin('api', "the events of a store and a reload through the installed vLLM's KVEventBatch msgpack encoding, "
             'held against the block hashes vLLM computed',
             **unplaced('a name has no position'),
             slight="the installed vLLM's path as it is: a renamed name is another release, judged in its own "
                    'cell',
             large="the installed vLLM's path as it is: a gone name is another release, judged in its own cell",
             drawn_by='conformance.levels.connector.test_lifecycle:test_kv_events'),
    ),
    'api_cache_pressure': (
        Twin('timing', 'prompts stored 3x past the declared capacity, 4 a phase, then asked for newest first (the oldest'
             ' after every other), the last batch once more',
             early=True,
             late=True,
             slight=True,
             large=True,
             drawn_by='conformance.levels.connector.test_workloads:test_cache_pressure'),
        Twin('size', 'every prompt of one length (2 to 64 blocks, chosen from the capacity): never two sizes in one '
             'fill',
             **unplaced('a size has no position'),
             slight=Gap('prompts one block apart in size in one fill: a bounded cache that evicts by count, or'
                        ' frees room sized for the last entry, keeps an index entry whose bytes a larger entry'
                        ' overwrote.'),
             large=Gap('prompts of very different sizes (2 and 64 blocks) in one fill: a size-class allocator '
                       "that evicts a large entry's bytes but keeps its index is never met."),
             drawn_by='conformance.levels.connector.test_workloads:PRESSURE_PROMPT_BLOCKS'),
    ),
    'api_reuse_distance': (
        Twin('timing', '24 prompts stored 4 a phase, then asked for oldest first: the first after 23 others (12 MiB of '
             'KV later), the newest last; the last batch once more',
             early='the read order is oldest first: the longest distance is read first',
             late=True,
             slight='the newest prompts are read back within a batch of their store',
             large=True,
             drawn_by='conformance.levels.connector.test_workloads:REUSE_PROMPTS'),
        Twin('size', 'every prompt of 16 blocks and 3 tokens, whatever capacity the cache has or declares',
             **unplaced('a size has no position'),
             slight=Gap('prompts one block apart in size: a cache that frees room sized for the last entry is '
                        'not met (api_cache_pressure draws the same single size)'),
             large='one moderate size by design: the workload must fit any cache a user runs, declared or not',
             drawn_by='conformance.levels.connector.test_workloads:REUSE_PROMPT_BLOCKS'),
    ),
    'api_load_errors_reported': (
        Twin('damage', 'each file the store run wrote, as written and with its last byte cut off',
             early="a cut takes a file's end: it has no start",
             late=True,
             slight=True,
             large=Gap('a file cut to half or to nothing: a reader that reports a missing last byte (a size '
                       'check) but raises on a header it cannot parse kills the worker.'),
             drawn_by='conformance.levels.connector.test_connector_api:_stored_then_damaged'),
    ),
    'api_pd_roundtrip': (
        Twin('content', "the producer's drawn bits against other drawn bits in the consumer's blocks",
             early=True,
             late=True,
             slight=True,
             large=True,
             drawn_by='conformance.levels.connector.scenarios:filler'),
        Twin('timing', "the producer's blocks, once vLLM gets them back, overwritten at once (as its next request would)"
             ' while the consumer may still pull',
             early=True,
             late='reuse later than at once only gives a pull more time: the tightest is drawn',
             slight=True,
             large='reuse later than at once only gives a pull more time: the tightest is drawn',
             drawn_by='conformance.levels.connector.test_pd:_pd'),
        Twin('tokens', "the consumer's own request (handed no params): a handed-over prompt's first token, then the "
             "other handed-over prompt's tokens shifted by one",
             early=True,
             late=Gap("a no-params request whose prompt is a handed-over one's, or it less its last token: a "
                      'consumer that matches handed-over KV by prompt (a prefix lookup), not by params, claims'
                      ' KV nobody sent it.'),
             slight=Gap('a no-params prompt one token off a handed-over one: the same prompt-matching bug.'),
             large=True,
             drawn_by='conformance.levels.connector.test_pd:_pd'),
        Twin('layout', 'producer and consumer in one drawn layout; never a consumer of another layout',
             **unplaced('a layout has no position'),
             slight=Gap('a consumer of the twin layout (NHD vs HND, as NixlConnector permutes): a consumer '
                        "that copies the producer's pages raw loads transposed KV."),
             large=Gap('a cross-layer consumer of a per-layer producer: the same raw-page copy, wrong rows.'),
             drawn_by='conformance.levels.connector.test_pd:_pd_examples'),
        Twin('block_size', 'producer and consumer of one drawn block size (16 or 32); never a consumer of another',
             **unplaced('a block size has no position'),
             slight=Gap('a consumer of another block size (16 vs 32, heterogeneous P/D): a consumer that '
                        'copies block i into block i puts tokens in the wrong slots.'),
             large=Gap('block sizes far apart (16 vs 64): the same fixed-ratio bug, unseen.'),
             drawn_by='conformance.levels.connector.test_pd:_pd_examples'),
    ),
    'api_pd_format_isolation': (
        Twin('kv_cache_dtype', 'a consumer of the same-width twin kv_cache_dtype (one producer dtype per width) handed a '
             "producer's kv_transfer_params",
             **unplaced('a dtype is one value: it has no position'),
             slight=True,
             large=Gap('an fp8 consumer of a bf16 producer (another width): a consumer that copies by its own '
                       'byte size takes half of the bf16 bytes as fp8 KV.'),
             drawn_by='conformance.levels.connector.scenarios:TWINS'),
        Twin('model_dtype', "not drawn: producer and consumer serve one model of one dtype, and 'auto' has no twin in TWINS",
             **unplaced('a dtype is one value: it has no position'),
             slight=Gap("producer and consumer of one checkpoint as bf16 and fp16 under 'auto': a consumer "
                        'that checks only the kv_cache_dtype string takes bf16 bytes as fp16.'),
             large=Gap("fp16 vs fp32 under 'auto': the same string check, another width."),
             drawn_by='conformance.levels.connector.scenarios:TWINS'),
    ),
    'api_pd_lost_peer': (
        Twin('timing', 'the producer shut down after its prefill, before the consumer is built (with it present: '
             'api_pd_roundtrip)',
             early=True,
             late=Gap('the producer lost mid-transfer, after part of the blocks were read: a consumer that '
                      'reports failed only the requests it had not started claims half-read ones.'),
             slight='a peer is lost once: where it goes is early or late',
             large=True,
             drawn_by='conformance.levels.connector.test_pd:test_pd_lost_peer'),
    ),
}
