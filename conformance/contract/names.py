"""Names that files outside the suite's runtime validate against (matrix.yaml, the noxfile):
importable without torch or pytest, which the Python running nox may not have."""

# vLLM's kv_cache_dtype strings the contract models (conformance.contract.spec.KV_CACHE_DTYPES maps them).
KV_CACHE_DTYPE_NAMES: tuple[str, ...] = (
    "auto", "bfloat16", "float16", "half", "float", "float32",
    "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "int8",
)
