"""The KV contract model: vLLM's dtype strings, layouts, stride orders and its error messages."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given

from conformance.contract.spec import KVSpec, KVSpecError, Layout, allocate_layers, resolve_kv_cache_dtype
from conformance.contract.strategies import kv_specs


@pytest.mark.parametrize("kv_cache_dtype, storage, fmt", [
    ("fp8", torch.uint8, "e4m3fn"),
    ("fp8_e4m3", torch.uint8, "e4m3fn"),
    ("fp8_e5m2", torch.uint8, "e5m2"),
    ("fp8_inc", torch.float8_e4m3fn, "e4m3fn"),
    ("bfloat16", torch.bfloat16, "bf16"),
    ("float16", torch.float16, "fp16"),
    ("int8", torch.int8, "int8"),
])
def test_vllm_storage_dtypes(kv_cache_dtype, storage, fmt):
    # vLLM's STR_DTYPE_TO_TORCH_DTYPE: every fp8 string but fp8_inc is a uint8 tensor.
    got_storage, got_format = resolve_kv_cache_dtype(kv_cache_dtype, "bfloat16")
    assert (got_storage, got_format.name) == (storage, fmt)


@pytest.mark.parametrize("model_dtype, storage", [("bfloat16", torch.bfloat16), ("float16", torch.float16),
                                                  ("float32", torch.float32)])
def test_auto_is_the_model_dtype(model_dtype, storage):
    assert KVSpec(kv_cache_dtype="auto", model_dtype=model_dtype).storage_dtype == storage


def test_fp8_formats_share_a_storage_dtype_but_not_a_format():
    e4m3, e5m2 = KVSpec(kv_cache_dtype="fp8_e4m3"), KVSpec(kv_cache_dtype="fp8_e5m2")
    assert e4m3.storage_dtype == e5m2.storage_dtype == torch.uint8
    assert e4m3.element_format != e5m2.element_format
    assert e4m3 != e5m2


@pytest.mark.parametrize("kwargs, names", [
    ({"kv_cache_dtype": "fp8_e5m3"}, ["fp8_e5m2", "fp8_e4m3", "auto"]),
    ({"model_dtype": "bf16"}, ["bfloat16", "float16"]),
    ({"layout": "paged"}, ["kv_first", "blocks_first", "fused", "mla"]),
    ({"layout": "mla", "num_kv_heads": 1, "kv_cache_dtype": "fp8_e5m2"}, ["fp8_e4m3", "fp8_ds_mla"]),
    ({"layout": "mla", "num_kv_heads": 1, "stride_order": "HND"}, ["NHD"]),
    ({"layout": "mla", "num_kv_heads": 8}, ["num_kv_heads must be 1"]),
    ({"kv_cache_dtype": "fp8_ds_mla"}, ["layout='mla'", "head_size=656"]),
    ({"block_size": 0}, ["positive integer"]),
])
def test_impossible_specs_say_what_is_valid(kwargs, names):
    with pytest.raises(KVSpecError) as info:
        KVSpec(**kwargs)
    message = str(info.value)
    assert "\n" not in message
    for name in names:
        assert name in message


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(KVSpecError, match="unknown KVSpec field"):
        KVSpec.from_dict({"kv_cache_dtype": "auto", "dtype": "fp8"})


@given(spec=kv_specs())
def test_dict_roundtrip(spec):
    assert KVSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("layout, shape", [
    (Layout.KV_FIRST, (2, 3, 16, 4, 64)),
    (Layout.BLOCKS_FIRST, (3, 2, 16, 4, 64)),
    (Layout.FUSED, (3, 4, 16, 128)),
])
def test_layer_shapes(layout, shape):
    assert KVSpec(layout=layout, num_blocks=3, block_size=16, num_kv_heads=4, head_size=64).layer_shape == shape


def test_hnd_layers_are_non_contiguous_views_with_the_logical_shape():
    for layout in (Layout.KV_FIRST, Layout.BLOCKS_FIRST):
        spec = KVSpec(layout=layout, stride_order="HND", num_kv_heads=4, head_size=64)
        (layer,) = allocate_layers(spec)
        assert tuple(layer.shape) == spec.layer_shape and not layer.is_contiguous()
    # vLLM >= 0.29 on CPU: [B, H, N, 2D] in LBHNC is contiguous; LBNHC (the GPU default) is not.
    (fused_hnd,) = allocate_layers(KVSpec(layout="fused", stride_order="HND"))
    (fused_nhd,) = allocate_layers(KVSpec(layout="fused", stride_order="NHD"))
    assert fused_hnd.is_contiguous() and not fused_nhd.is_contiguous()


def test_cross_layer_views_share_one_buffer_and_are_non_contiguous():
    spec = KVSpec(num_layers=3, cross_layer=True, num_kv_heads=2, head_size=64)
    layers = allocate_layers(spec)
    assert len(layers) == 3
    assert len({layer.untyped_storage().data_ptr() for layer in layers}) == 1
    assert all(not layer.is_contiguous() and tuple(layer.shape) == spec.layer_shape for layer in layers)
    layers[1].fill_(1)
    assert layers[0].abs().sum() == 0 and layers[2].abs().sum() == 0  # no overlap between layers
