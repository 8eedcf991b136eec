"""The LoRA adapters an engine of the LoRA role serves: seeded, written by the engine child in
PEFT's format, each changing every layer's K and V (so a connector that ignores the adapter is
served another adapter's KV)."""

from __future__ import annotations

import json
import os
from typing import Any

LORA_RANK = 8


def lora_adapters(model: str, out: str) -> dict[str, Any]:
    """Two adapters, "a" (written to ``out``) and "b" (beside it), each a seeded rank-8 adapter of its
    own, and "a2": another version of "a" (its name, other weights, from another directory), which
    replaces "a"'s weights under its id where vLLM has ``load_inplace`` (else it is registered under
    a new id: "a"'s name re-pointed)."""
    from vllm.lora.request import LoRARequest

    inplace = "load_inplace" in getattr(LoRARequest, "__struct_fields__", ())
    return {"a": _lora_adapter(model, out, 1, "kvconform-adapter"),
            "b": _lora_adapter(model, out + "-b", 2, "kvconform-adapter-b"),
            "a2": _lora_adapter(model, out + "-v2", 1 if inplace else 3, "kvconform-adapter", seed=3,
                                **({"load_inplace": True} if inplace else {}))}


def _lora_adapter(model: str, out: str, lora_id: int, lora_name: str, seed: int | None = None, **more: Any) -> Any:
    """A LoRARequest for a rank-8 adapter seeded by ``seed`` (default: ``lora_id``) on the projections
    every layer of ``model`` computes its KV with (``_kv_projections``), written to ``out`` in PEFT's
    format (the same bytes for the same model and seed); ``more``: the request's other fields."""
    import torch
    from safetensors.torch import save_file
    from vllm.lora.request import LoRARequest

    config = json.loads(open(os.path.join(model, "config.json")).read())
    projections = _kv_projections(config)
    generator = torch.Generator().manual_seed((seed or lora_id) - 1)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for proj, width in projections.items():
            name = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(LORA_RANK, config["hidden_size"], generator=generator) * 0.1
            tensors[f"{name}.lora_B.weight"] = torch.randn(width, LORA_RANK, generator=generator) * 0.1
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "adapter_model.safetensors"))
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": LORA_RANK, "lora_alpha": 2 * LORA_RANK, "bias": "none",
                   "target_modules": list(projections), "task_type": "CAUSAL_LM",
                   "base_model_name_or_path": model}, f)
    return LoRARequest(lora_name, lora_id, out, **more)


def _kv_projections(config: dict[str, Any]) -> dict[str, int]:
    """The attention projections a layer's KV comes from, with their output widths: k_proj and
    v_proj, or an MLA model's one (DeepSeek-V2's kv_a_proj_with_mqa: the latent and its rope part,
    which is what its KV cache holds; it has no k_proj, and vLLM refuses an adapter on one)."""
    if "kv_lora_rank" in config:
        return {"kv_a_proj_with_mqa": config["kv_lora_rank"] + config["qk_rope_head_dim"]}
    kv_width = config["num_key_value_heads"] * config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
    return {"k_proj": kv_width, "v_proj": kv_width}
