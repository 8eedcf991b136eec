"""The input audit of the store-level clauses (``conformance/verdict/audit``): each field its promise
depends on, and the near miss drawn in it."""

from __future__ import annotations

from conformance.verdict.audit.schema import Twin

_S = "conformance.contract.strategies:"
_K = "conformance.contract.keys:"
_NO_POSITION = "{} is one value: it has no position"
_SIZES = "sizes have no position"

# A drawn entry's content and size, the two fields every byte-level store clause depends on.
_CONTENT = Twin("content", "entries of random bits with the format's specials (NaN payloads, -0, subnormals) at drawn "
                "positions and at the first, middle and last element", True, True, True, True, _S + "bit_patterns")
_SIZE = Twin("size", "the smallest real entry (2 KiB), then one entry at and one a block past each payload limit "
             "(64 KiB to 16 MiB; 64 MiB in deep)", _SIZES, _SIZES, True, True, _S + "sweep_entries")
_GEOMETRY = Twin("geometry", "real GQA and MLA geometries of 1 or 2 blocks, then a pool of 65,537 one-token blocks "
                 "(a dimension past 16 bits)", "a shape has no position", "a shape has no position", True, True,
                 _S + "sweep_entries")
_DTYPE = Twin("kv_cache_dtype", "the same drawn content in every kv_cache_dtype of the axis, each swept once",
              _NO_POSITION.format("a format"), _NO_POSITION.format("a format"), True, True, _S + "sweep_entries")

ROWS: dict[str, tuple[Twin, ...]] = {
    "byte_exact_roundtrip": (_CONTENT, _SIZE, _GEOMETRY, _DTYPE),
    "no_aliasing": (
        Twin("view", "the tensor put and the same bytes after the caller rewrote all of its memory or only the view's "
             "region, before and after the first get", True, True, True, True, _S + "VIEW_KINDS"),
        Twin("timing", "a write to the put tensor before the first get, and a write into what get returned",
             "two moments, both drawn", "two moments, both drawn", True, True, _S + "VIEW_KINDS"),
        _SIZE),
    "dtype_preserved": (_DTYPE,
                        Twin("model_dtype", "specs of each model dtype (bf16, fp16, fp32) under the same config string",
                             _NO_POSITION.format("a dtype"), _NO_POSITION.format("a dtype"), True, True, _S + "kv_specs")),
    "shape_preserved": (_GEOMETRY, _SIZE),
    "stride_contract": (
        Twin("view", "the same content put contiguous and through HND strides, a slice of a pool, padded rows, a "
             "storage offset and one layer of a cross-layer buffer", True, True, True, True,
             _S + "NON_CONTIGUOUS_VIEW_KINDS"),
        _GEOMETRY, _CONTENT),
    "metadata_roundtrip": (
        Twin("layout", "specs drawn over every layout and stride order (NHD/HND, KV-first, blocks-first, fused, MLA)",
             _NO_POSITION.format("a layout"), _NO_POSITION.format("a layout"), True, True, _S + "kv_specs"),
        _GEOMETRY, _DTYPE),
    "scales_roundtrip": (
        Twin("scales", "k_scale and v_scale drawn apart (typical calibrated values and any float of 1e-6 to 1e4, all "
             "53 bits), swept as 1.0 and 0.5", "a scale is one number", "a scale is one number", True, True,
             _S + "scales"),),
    "format_isolation": (
        Twin("kv_cache_dtype", "two specs identical but for their kv_cache_dtype, under one key (fp8_e4m3/fp8_e5m2, "
             "bf16/fp16, and across widths: bf16/fp8_e4m3)", _NO_POSITION.format("a format"),
             _NO_POSITION.format("a format"), True, True, _S + "format_twins"),
        Twin("model_dtype", "two specs identical but for their model dtype under kv_cache_dtype=auto (bf16/fp16 "
             "of one width, fp16/fp32 of two)", _NO_POSITION.format("a dtype"), _NO_POSITION.format("a dtype"),
             True, True, _S + "model_dtype_twins")),
    "mismatch_rejection": (
        Twin("geometry", "a tensor one block longer than its spec allocates", "a shape has no position",
             "a shape has no position", True, "one block more is the near miss; a tensor of another size altogether "
             "is refused by the same length check", "conformance.levels.store.test_isolation:_mismatched_tensor"),
        Twin("kv_cache_dtype", "a tensor of the spec's shape in another dtype of the same width (fp16 for bf16)",
             _NO_POSITION.format("a dtype"), _NO_POSITION.format("a dtype"), True,
             "a dtype of another width is another byte length, refused by the same length check",
             "conformance.levels.store.test_isolation:_mismatched_tensor")),
    "corruption_detected": (
        Twin("damage", "the stored entry and the same entry with its first byte's low bit flipped, its last byte's, "
             "its last element cut, or its second half gone: drawn, then every kind on every swept entry",
             True, True, True, True, "conformance.contract.store:DAMAGE_KINDS"),),
    "state_machine": (
        Twin("key", "two keys that differ only in one field of LMCache's layerwise key (format first, layer last), in "
             "its middle character or all of it, at 1xx, 256 and 1,024 bytes", True, True, True, True,
             _K + "key_field_twins"),
        Twin("key", "keys that differ only in letter case, or only in their last character at 256 and 1,024 bytes",
             "case folds anywhere; drawn over whole keys", True, True, "a case twin differs in one character",
             _K + "KEY_TWINS"),
        Twin("timing", "sequences of put, overwrite, get, contains and delete of three keys, drawn in any order",
             True, True, True, True, "conformance.levels.store.test_state_machine:StoreMachine"),
        _SIZE),
    "long_reuse_distance": (
        Twin("timing", "an entry read right after its put and one read after 1,048 other puts (40 MiB later), "
             "oldest first", "the read order is oldest first: the longest distance is read first",
             "the newest entry is read last, at distance 0", True, True,
             "conformance.levels.store.test_pressure:SMALL_PUTS"),
        Twin("size", "1,000 entries of 2 KiB, then 48 of 1 MiB", _SIZES, _SIZES, "two sizes, 512 times apart", True,
             "conformance.levels.store.test_pressure:LARGE_PUTS")),
}
