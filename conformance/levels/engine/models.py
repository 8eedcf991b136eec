"""Tiny seeded-random models that keep a real model's KV geometry, generated locally.

No model hub is reachable, so a model *recipe* (``fixtures/models/NAME.json``: the config
class, its kwargs, a seed, a dtype) is turned into a model directory vLLM can load offline:
``config.json``, ``model.safetensors`` and a WordLevel tokenizer (``w4 w5 ...``). Directories
are content-addressed (recipe bytes + transformers version) under the cache, built once and
reused; a lock file keeps parallel workers from building the same one twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from conformance.data import data_dir

RECIPES_DIR = data_dir("models")
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")  # ids 0..3
BOS, EOS, PAD = 1, 2, 3
DEFAULT_MODEL = "qwen3-tiny"  # what a run, a certified product and the PR gate take when none is named


def cache_root() -> Path:
    return Path(os.environ.get("KVCONFORM_CACHE", Path.home() / ".cache" / "kvconform"))


def model_names() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.json"))


def load_recipe(name: str) -> dict[str, Any]:
    path = RECIPES_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"model recipe {name!r} is unknown; valid: {', '.join(model_names())} "
                         "(or pass --kv-model PATH to a model directory)")
    return json.loads(path.read_text())


def materialise(name: str, *, retrained: int = 0) -> Path:
    """The model directory for recipe ``name``, generating it on first use; ``retrained=N``: another
    checkpoint of the same model (its weights drawn from the recipe's seed plus N), as a fine-tune
    or a later training run of one architecture is: the same KV geometry, other KV."""
    import transformers

    recipe = load_recipe(name)
    recipe["seed"] += retrained
    key = hashlib.sha256((RECIPES_DIR / f"{name}.json").read_bytes() + transformers.__version__.encode()
                         + (f"retrained={retrained}".encode() if retrained else b"")).hexdigest()[:12]
    out = cache_root() / "models" / (f"{name}-{key}" if not retrained else f"{name}-retrained{retrained}-{key}")
    if (out / "DONE").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "DONE").exists():
            _generate(recipe, out)
            (out / "DONE").write_text(key)
    return out


def _generate(recipe: dict[str, Any], out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    config_cls = getattr(transformers, recipe["config_class"])
    config = config_cls(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, **recipe["config"])
    torch.manual_seed(recipe["seed"])
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    dtype = getattr(torch, recipe["dtype"])
    model = model.to(dtype)
    model.config.dtype = dtype
    model.save_pretrained(out)
    _tokenizer(recipe["config"]["vocab_size"]).save_pretrained(out)


def _tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>", model_max_length=4096)
