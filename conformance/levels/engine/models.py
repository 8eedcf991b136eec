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
import threading
import time
from pathlib import Path
from typing import Any

from conformance.data import data_dir

RECIPES_DIR = data_dir("models")
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")  # ids 0..3
BOS, EOS, PAD = 1, 2, 3
# The vision-language model an engine cell's multimodal role serves (a recipe with "images"), whatever the cell's model.
# Why the model-isolation clauses cannot judge a user's model directory without a second checkpoint of it.
NO_OTHER_MODEL = ("the model is a directory (--kv-model PATH) and no other checkpoint of it was given "
                  "(--kv-other-model PATH): the suite makes one only of the models it ships")
IMAGE_MODEL = "idefics3-tiny"


def cache_root() -> Path:
    return Path(os.environ.get("KVCONFORM_CACHE", Path.home() / ".cache" / "kvconform"))


def model_names() -> list[str]:
    """The recipes a cell may run (``--kv-model``, matrix.yaml): every one but the image model's."""
    return sorted(p.stem for p in RECIPES_DIR.glob("*.json") if "images" not in json.loads(p.read_text()))


def load_recipe(name: str) -> dict[str, Any]:
    path = RECIPES_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"model recipe {name!r} is unknown; valid: {', '.join(model_names())} "
                         "(or pass --kv-model PATH to a model directory)")
    return json.loads(path.read_text())


def materialise(name: str, *, retrained: int = 0) -> Path:
    """The model directory for recipe ``name``, generating it on first use; ``retrained=N``: another
    checkpoint of the same model (its weights drawn from the recipe's seed plus N), as a fine-tune
    or a later training run of one architecture is: the same KV geometry, other KV. A model made
    before is found without importing transformers (its version read from its metadata): seconds
    saved for every engine cell."""
    from importlib.metadata import version

    recipe = load_recipe(name)
    recipe["seed"] += retrained
    key = hashlib.sha256((RECIPES_DIR / f"{name}.json").read_bytes() + version("transformers").encode()
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


def materialise_in(python: str, name: str, *, retrained: int = 0) -> Path | str:
    """``materialise`` run by ``python`` (the engine's: its transformers writes what its vLLM reads):
    the model directory, or the error that stopped it."""
    import subprocess

    from conformance.util.procs import raised

    code = ("import sys; from conformance.levels.engine.models import materialise; "
            "print(materialise(sys.argv[1], retrained=int(sys.argv[2])))")
    proc = subprocess.run([python, "-c", code, name, str(retrained)], capture_output=True, text=True)
    if proc.returncode != 0:
        return raised(proc.stderr) or f"exit status {proc.returncode}"
    return Path(proc.stdout.strip().splitlines()[-1])


class RoleModels:
    """The models an engine cell's roles serve besides the cell's own (another checkpoint of it, the
    image model), made once by the engine's Python on the first ask, by whichever lane asks first."""

    def __init__(self, python: str, recipe: str | None, other_model: Path | None) -> None:
        self.python = python
        self.recipe = recipe  # the recipe the cell's model was made from (None: the user's directory)
        self.other_model = other_model  # the other checkpoint the user gave (--kv-other-model)
        self._made: dict[tuple[str, int], Path] = {}
        self._lock = threading.Lock()
        # Each model's materialisation, in seconds (the cost model's): the cell's own (``made``), and
        # the ones made here on first ask.
        self.seconds: dict[str, float] = {}

    @property
    def retrained(self) -> Path:
        """Another checkpoint of the cell's model (engine_model_isolation): the one the user gave, else
        the recipe's weights drawn from another seed."""
        from conformance.verdict.guard import HarnessError
        from conformance.verdict.status import NotRunnable

        if self.other_model is not None:
            return self.other_model
        if self.recipe is None:
            raise NotRunnable(NO_OTHER_MODEL)
        made = self.make(self.recipe, retrained=1)
        if isinstance(made, str):
            raise HarnessError(f"the suite could not make another checkpoint of {self.recipe}: {made}")
        return made

    @property
    def image(self) -> Path:
        """The vision-language model the multimodal role serves (engine_multimodal_isolation)."""
        from conformance.verdict.status import NotRunnable

        made = self.make(IMAGE_MODEL)
        if isinstance(made, str):
            raise NotRunnable(f"the suite's multimodal model ({IMAGE_MODEL}) cannot be made with this Python's "
                              f"transformers: {made}")
        return made

    def make(self, recipe: str, retrained: int = 0) -> Path | str:
        """``recipe``'s model directory, made once by the engine's Python (or why it could not be)."""
        with self._lock:
            if (recipe, retrained) not in self._made:
                started = time.monotonic()
                made = materialise_in(self.python, recipe, retrained=retrained)
                self.made(recipe + (f"-retrained{retrained}" if retrained else ""), time.monotonic() - started)
                if isinstance(made, str):
                    return made
                self._made[recipe, retrained] = made
            return self._made[recipe, retrained]

    def made(self, name: str, seconds: float) -> None:
        """Record that model ``name`` took ``seconds`` to materialise (found or generated)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds


def _generate(recipe: dict[str, Any], out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    config_cls = getattr(transformers, recipe["config_class"])
    config = config_cls(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, **recipe["config"])
    torch.manual_seed(recipe["seed"])
    images = recipe.get("images")
    if images is None:
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    else:  # a vision-language model: every matrix weight redrawn, so that an image moves the KV after it
        model = getattr(transformers, images["model_class"])(config)
        with torch.no_grad():
            for weight in model.parameters():
                if weight.dim() >= 2:
                    weight.normal_(0.0, images["weight_std"])
    dtype = getattr(torch, recipe["dtype"])
    model = model.to(dtype)
    model.config.dtype = dtype
    model.save_pretrained(out)
    if images is None:
        _tokenizer(recipe["config"]["vocab_size"]).save_pretrained(out)
    else:
        _processor(images, recipe["config"]["text_config"]["vocab_size"]).save_pretrained(out)


def _processor(images: dict[str, Any], vocab_size: int) -> Any:
    """A vision-language model's processor: the image processor the recipe names (a PIL one: no
    torchvision) and the word-level tokenizer with the image tokens after its words."""
    import transformers

    size = {"longest_edge": images["image_size"]}
    image_processor = getattr(transformers, images["image_processor_class"])(
        do_resize=True, size=size, max_image_size=size, do_image_splitting=False)
    return getattr(transformers, images["processor_class"])(
        image_processor=image_processor, tokenizer=_tokenizer(vocab_size, images), image_seq_len=images["image_seq_len"])


def _tokenizer(vocab_size: int, images: dict[str, Any] | None = None) -> Any:
    """The word-level tokenizer (``w4 w5 ...``); for a vision-language model (``images``), words below
    its ``words`` only, then the image token, the processor's special tokens, its tile grid's
    ``<row_i_col_j>`` and a newline, padded to ``vocab_size``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), images["words"] if images else vocab_size)})
    special: list[str] = []
    if images:
        grid = images["grid_tokens"]
        special = [images["image_token"], *images["special_tokens"],
                   *(f"<row_{i + 1}_col_{j + 1}>" for i in range(grid) for j in range(grid))]
        vocab.update({t: images["words"] + i for i, t in enumerate([*special, "\n"])})
        vocab.update({f"<unused{i}>": i for i in range(len(vocab), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    if images:
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
        tok.add_tokens([AddedToken("\n", normalized=False, special=False)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>", model_max_length=4096)
