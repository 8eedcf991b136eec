"""What a connector may declare about itself (never guessed from its name), and how the
declaration (``--kv-connector-capabilities``) is read: clauses that need a capability are Disabled,
not failed, for a connector that does not declare it."""

from __future__ import annotations

import re

CONNECTOR_CAPABILITIES = {
    "persistent": "its cache outlives the engine that wrote it (files, a server): the clauses in which a "
                  "fresh engine or connector pair loads what another one stored apply",
    "lossy": "it changes KV on the way (a quantizing codec): byte-exact clauses are Disabled; "
             "'lossy=TOL' states the logprob tolerance the engine level compares within",
    "pd": "it moves KV from a producer engine (kv_producer) to a consumer engine (kv_consumer), "
          "handed over per request in kv_transfer_params, as vLLM's disaggregated prefill does: the P/D "
          "clauses apply; the prefix-cache clauses only if it declares cache too",
    "cache": "it serves KV it stored to a later request with the same prompt prefix (a prefix cache): "
             "implied unless pd is declared",
    "stats": "it reports transfer statistics (get_kv_connector_stats, build_kv_connector_stats), which vLLM's "
             "scheduler gathers and its frontend logs and exports: api_connector_stats applies",
    "events": "it emits KV cache events (take_events: BlockStored, BlockRemoved) for what it stores, which vLLM "
              "publishes to routers: its engines run with KV events on and api_kv_events applies",
    "capacity": "its cache is bounded and evicts: 'capacity=BYTES' (or KiB, MiB, GiB) states how much KV it holds "
                "in the configuration given, and api_cache_pressure stores several times that, then asks for "
                "everything again",
    "hma": "it works with vLLM's hybrid KV cache manager (subclasses SupportsHMA): on a hybrid model "
           "(--kv-model gemma3-hybrid-tiny) its engines keep one KV cache group per attention type "
           "(engine_hma_groups)",
    "min-span": "it stores only spans of at least TOKENS tokens (a chunk it never splits, a minimum worth "
                "storing): 'min-span=TOKENS' lengthens every prompt the suite builds by that many tokens (rounded "
                "up to whole blocks), at both levels, so that each stores something to judge",
    "settle": "what it stores becomes visible to lookups only some time after the step that saved it (a commit in "
              "the background, a quorum of workers, remote storage that is eventually consistent): 'settle=SECONDS' "
              "says how long; every later pass, and every engine that reads what another stored, asks only once "
              "that long has passed since the saves were reported, and (at the connector level) after a request of "
              "its own, so a scheduler that hears of saves from its workers has heard them",
    "one-geometry": "it (or the daemon it talks to) takes KV of one geometry per process (slots sized once for one "
                    "block size and kv_cache_dtype): the connector level shows it only the engine level's block size "
                    "(--kv-block-size), the first kv_cache_dtype of --kv-cache-dtypes and the first layout, and the "
                    "clauses whose promise is about a second geometry over one storage (format twins, another block "
                    "size) are Not runnable at both levels; the results say which geometry was judged",
    "own-server": "it starts, or is configured to reach, the server it needs by itself (an LMCacheMPConnector "
                  "subclass that auto-starts its own tiered server): the suite starts no LMCache server for it "
                  "and passes it no lmcache.mp.* key, so what it is judged with is its own",
}


def parse_capabilities(text: str) -> tuple[frozenset[str], float | None]:
    """``persistent,lossy=0.05`` -> ({persistent, lossy}, 0.05); an unknown name is one clear error."""
    names, tolerance = set(), None
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in CONNECTOR_CAPABILITIES:
            raise ValueError(f"--kv-connector-capabilities: unknown capability {name!r}; valid: "
                             + "; ".join(f"{k} ({v})" for k, v in CONNECTOR_CAPABILITIES.items()))
        if name == "capacity":
            if not value:
                raise ValueError("--kv-connector-capabilities: capacity needs the bytes of KV the connector holds, "
                                 "e.g. capacity=4MiB")
            parse_capacity(item)  # its value is read there
            names.add(name)
            continue
        if name in ("min-span", "settle"):
            (parse_min_span if name == "min-span" else parse_settle)(item)  # its value is read there
            names.add(name)
            continue
        if value and name != "lossy":
            raise ValueError(f"--kv-connector-capabilities: {name} takes no value (got {item!r})")
        if name == "lossy" and not value:  # without it the engine level would compare bits
            raise ValueError("--kv-connector-capabilities: lossy needs its logprob tolerance, e.g. lossy=0.05")
        if value:
            try:
                tolerance = float(value)
            except ValueError:
                raise ValueError(f"--kv-connector-capabilities: lossy={value!r} is not a number "
                                 "(the logprob tolerance, e.g. lossy=0.05)") from None
            if not 0 < tolerance < float("inf"):
                raise ValueError(f"--kv-connector-capabilities: lossy={value} must be a positive tolerance")
        names.add(name)
    return frozenset(names), tolerance


_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


PRESSURE_FACTOR = 3  # what a cache-pressure workload stores, in declared capacities (both levels)


def parse_capacity(text: str) -> int | None:
    """The bytes of ``capacity=BYTES`` among declared capabilities (``capacity=2MiB``), or None."""
    found = None
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name != "capacity":
            continue
        match = re.fullmatch(r"(\d+)\s*(B|KiB|MiB|GiB)?", value.strip())
        if not match or int(match[1]) <= 0:
            raise ValueError(f"--kv-connector-capabilities: capacity={value!r} is not a size; give the bytes of KV "
                             "the connector holds as configured, e.g. capacity=4194304 or capacity=4MiB")
        found = int(match[1]) * _UNITS[match[2] or ""]
    return found


def parse_min_span(text: str) -> int:
    """The tokens of ``min-span=TOKENS`` among declared capabilities, or 0."""
    found = 0
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name == "min-span":
            if not value.strip().isdigit() or int(value) <= 0:
                raise ValueError(f"--kv-connector-capabilities: min-span={value!r} is not a token count; give the "
                                 "fewest tokens the connector stores at once, e.g. min-span=256")
            found = int(value)
    return found


MAX_SETTLE_S = 60.0  # the longest visibility delay the suite waits out before each later lookup


def parse_settle(text: str) -> float:
    """The seconds of ``settle=SECONDS`` among declared capabilities, or 0."""
    found = 0.0
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name == "settle":
            try:
                found = float(value)
            except ValueError:
                found = -1.0
            if not 0 < found <= MAX_SETTLE_S:
                raise ValueError(f"--kv-connector-capabilities: settle={value!r} is not a delay the suite waits out; "
                                 "give the seconds after a save until a lookup sees it, at most "
                                 f"{MAX_SETTLE_S:g}, e.g. settle=1.5")
    return found


def one_geometry_refusal(judged: str, what: str) -> str:
    """Why a clause is Not runnable for a connector that declares one-geometry: its promise is about
    ``what``, a second geometry shown to one storage, and the connector is judged at ``judged`` only."""
    return f"the connector declares one-geometry (judged at {judged} only), and this clause's promise is about {what}"


def span_pad(min_span: int, unit: int) -> int:
    """What the suite adds to every prompt for a connector that declares ``min-span``: the span
    rounded up to whole ``unit``s (blocks), so that no prompt moves against a block boundary."""
    return -(-min_span // unit) * unit


def implied(capabilities: frozenset[str]) -> frozenset[str]:
    """A connector's declared capabilities plus ``cache``, which every connector but a P/D transfer
    (``pd`` declared without ``cache``) is: a prefix cache is what a connector is by default."""
    return capabilities if "pd" in capabilities else capabilities | {"cache"}
