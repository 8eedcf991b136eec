"""The keys the store clauses draw: the shapes real keys have, pools of keys that differ only at the
end or in case, and the near misses of a composite key (two keys that differ only in one field).
A key is a string to a store; these make the strings a store is likely to confuse."""

from __future__ import annotations

import hashlib
import uuid
from typing import NamedTuple, Sequence

# The shapes real keys have: a chunk hash (64 hex characters), LMCache's composite key string
# (format@model@world_size@worker_id@chunk_hash@dtype), a long path-like key, and LMCache's
# layerwise key string (model@world_size@worker_id@chunk_hash@dtype@layer) under a local model
# snapshot path, at 256 bytes (just past memcached's 250-byte keys and a 255-byte file name) and at
# 1024 (S3's key limit). Keys of one run share a long prefix and differ only at the end, as the
# layers of one chunk do, so a store that truncates or caps keys (a fixed-width column, a 64-byte
# slot, memcached, a file named after its key) collides them.
KEY_SHAPES = ("hash", "lmcache", "long", "lmcache_256", "lmcache_1024")
_LONG_KEY_BYTES = {"lmcache_256": 256, "lmcache_1024": 1024}
_SNAPSHOT = ("/mnt/shared/hf-cache/hub/models--Qwen--Qwen3-Coder-480B-A35B-Instruct-FP8/snapshots/"
             "9d1d8b5d4b5ad1d2a5d3bd3e0b5d9f0e7a1c2b3d/")
# The snapshot path going deeper (a tenant's fine-tune under it): cut to a length, the model path of
# a key that must have an exact length.
_DEEP_MODEL = _SNAPSHOT + "finetunes/tenant-" + "0123456789abcdef" * 64

# The names of a run's key pool (``pool_keys``): "A" is "a" in another case, so a store that folds
# case (a case-insensitive file system, a lower()ing normaliser) serves one for the other.
KEY_NAMES = ("a", "b", "A")


class KeyTwins(NamedTuple):
    """Two distinct keys (``pool_keys(shape, names)``) that a store which normalises or caps its
    keys serves as one; ``why`` says what they are."""
    why: str
    shape: str
    names: tuple[str, str]


KEY_TWINS = (
    KeyTwins("two keys that differ only in letter case", "lmcache", ("a", "A")),
    KeyTwins("two keys of 256 bytes that differ only in their last character", "lmcache_256", ("a", "b")),
    KeyTwins("two keys of 1024 bytes that differ only in their last character", "lmcache_1024", ("a", "b")),
)


# LMCache's layerwise key, field by field: format@model@world_size@worker_id@chunk_hash@dtype@layer.
# A store must keep two keys apart wherever they differ; one that elides, parses or hashes part of a
# key keeps them apart only where it looks. So every field gets a twin that differs in it alone.
KEY_FIELDS = ("format", "model", "world_size", "worker_id", "chunk_hash", "dtype", "layer")
# Whole keys of these lengths: LMCache's own (a short model path), past memcached's 250 bytes and a
# file name's 255, and S3's 1024.
KEY_FIELD_LENGTHS = (None, 256, 1024)
_NEXT_CHAR = str.maketrans("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ/-._",
                           "1234567890bcdefghijklmnopqrstuvwxyzaBCDEFGHIJKLMNOPQRSTUVWXYZA-/_.")


class FieldTwins(NamedTuple):
    """Two keys that differ only in one field of LMCache's composite key (``KEY_FIELDS``)."""
    field: str
    change: str  # "one character" (the field's middle one) or "the whole field" (every character)
    keys: tuple[str, str]

    @property
    def why(self) -> str:
        return (f"two keys of {len(self.keys[0])} bytes that differ only in {self.change} of their {self.field} "
                f"(field {KEY_FIELDS.index(self.field) + 1} of {len(KEY_FIELDS)})")


def _chunk_hash() -> str:
    """A chunk hash no other key has (64 hex characters)."""
    return hashlib.sha256(uuid.uuid4().bytes).hexdigest()


def key_fields(length: int | None = None) -> list[str]:
    """A fresh layerwise key's fields; with ``length`` the model path goes deeper (a tenant's fine-tune
    under a snapshot) until the joined key has exactly that many bytes."""
    fields = ["vllm", "/models/Qwen3-30B-A3B-FP8", "8", "3", _chunk_hash(), "bfloat16", "0"]
    if length is not None:
        room = length - (len("@".join(fields)) - len(fields[1]))
        if room > len(_DEEP_MODEL) or room < 1:
            raise ValueError(f"no key of {length} bytes has these fields")
        fields[1] = _DEEP_MODEL[:room]
    return fields


def field_twin(fields: Sequence[str], field: str, change: str) -> tuple[str, str]:
    """The key of ``fields`` and its twin that differs only in ``field``: in its middle character, or
    in every character (a near miss at the field's place in the key, early, middle or late; the same
    length, so only the bytes there tell them apart)."""
    i = KEY_FIELDS.index(field)
    value = fields[i]
    if change == "one character":
        mid = len(value) // 2
        other = value[:mid] + value[mid].translate(_NEXT_CHAR) + value[mid + 1:]
    elif change == "the whole field":
        other = value.translate(_NEXT_CHAR)
    else:
        raise ValueError(f"change {change!r}; valid: 'one character', 'the whole field'")
    assert other != value and len(other) == len(value)
    twin = [*fields[:i], other, *fields[i + 1:]]
    return "@".join(fields), "@".join(twin)


def key_field_twins() -> list[FieldTwins]:
    """For every field of the key, at every length of ``KEY_FIELD_LENGTHS``, the twin that differs in
    its middle character and the one that differs in all of it: fresh keys, no other example's."""
    twins = []
    for length in KEY_FIELD_LENGTHS:
        for i, field in enumerate(KEY_FIELDS):
            fields = key_fields(length)
            changes = ("one character", "the whole field") if len(fields[i]) > 1 else ("one character",)
            twins += [FieldTwins(field, change, field_twin(fields, field, change)) for change in changes]
    return twins


def pool_keys(shape: str, names: Sequence[str] = KEY_NAMES) -> dict[str, str]:
    """One key per name, of ``shape``, no other example uses: they share all but ``"@" + name`` at
    the end (as LMCache's layerwise keys of one chunk share all but the layer id), and a long shape
    keeps its length exactly."""
    prefix = realistic_key(shape, room=1 + max(len(n) for n in names))
    return {name: f"{prefix}@{name}" for name in names}


def realistic_key(shape: str, *, room: int = 0) -> str:
    """A key no other example uses, shaped as ``shape`` says (one of ``KEY_SHAPES``). A long
    LMCache shape is ``room`` bytes short of its length, for a suffix the caller appends."""
    chunk = _chunk_hash()
    if shape == "hash":
        return chunk
    if shape == "lmcache":
        return f"vllm@/models/Qwen3-30B-A3B-FP8@8@3@{chunk}@uint8"
    if shape == "long":
        return "/".join(["kvconform", "tenants", "a" * 40, "models", "Qwen3-30B-A3B-FP8", "tp8", "rank3",
                         "layers", "0-47", "chunks", "b" * 60, chunk])
    if shape in _LONG_KEY_BYTES:
        tail = f"@8@3@{chunk}@bfloat16"  # "@" and the layer id: the caller's suffix
        pad = _LONG_KEY_BYTES[shape] - room - len(_SNAPSHOT) - len(tail)
        return _DEEP_MODEL[:len(_SNAPSHOT) + max(pad, 0)] + tail
    raise ValueError(f"key shape {shape!r}; valid: {', '.join(KEY_SHAPES)}")


def fresh_key() -> str:
    """A key no other example uses (examples never see each other's entries), as LMCache writes one."""
    return realistic_key("lmcache")

