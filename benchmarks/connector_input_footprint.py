"""What the connector level's prompts reach (#53): run the level on a recording lifecycle control and
count what the scheduler asked it, so that a gap in the inputs is a number, not a guess.

    python benchmarks/connector_input_footprint.py [--suite PATH] [--label TEXT]

Every lookup (``get_num_new_matched_tokens``) is recorded with the storage it was asked over. Per
storage (one scenario's pairs), over distinct prompts in 16-token blocks: prompts asked, the longest;
**non-prefix shared spans**, pairs of prompts that share a block at the same place but not their first
block (a block in the middle, reached by another path: where a key that is not chained to its prefix
serves the wrong KV); **first-token twins**, pairs that differ in their first token only; and the
longest **reuse distance**, other prompts first asked between a prompt's first lookup and a later one
that hit. ``--suite`` runs another checkout's suite (a worktree of an older commit) on the same
recorder, for a before/after. Writes ``benchmarks/results/connector_input_footprint.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from datetime import datetime, timezone
from itertools import combinations
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT_VAR = "KVCONFORM_FOOTPRINT"
BLOCK = 16


def recorder() -> type:
    """The lifecycle control, recording each lookup to the file ``$KVCONFORM_FOOTPRINT`` names."""
    from conformance.zoo.good.lifecycle import LifecycleConnector

    class RecordingConnector(LifecycleConnector):
        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            found = super().get_num_new_matched_tokens(request, num_computed_tokens)
            with open(os.environ[OUT_VAR], "a") as out:
                out.write(json.dumps({"storage": str(self._storage_path), "prompt": self._prompt(request),
                                      "tags": self._tags(request), "hit": bool(found[0])}) + "\n")
            return found

    return RecordingConnector


def __getattr__(name: str) -> Any:  # the connector class, built once vLLM is importable
    if name == "RecordingConnector":
        return recorder()
    raise AttributeError(name)


def footprint(lines: list[dict[str, Any]]) -> dict[str, Any]:
    by_storage: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in lines:
        by_storage[line["storage"]].append(line)
    spans = twins = longest = reuse = 0
    prompts = 0
    for asks in by_storage.values():
        distinct = list({(tuple(a["prompt"]), tuple(a["tags"])): a["prompt"] for a in asks}.values())
        prompts += len(distinct)
        longest = max([longest, *map(len, distinct)])
        spans += _non_prefix_shared(distinct)
        twins += sum(1 for a, b in combinations(distinct, 2)
                     if len(a) == len(b) and a[0] != b[0] and a[1:] == b[1:])
        first: dict[tuple, int] = {}
        order: list[tuple] = []
        for ask in asks:
            key = (tuple(ask["prompt"]), tuple(ask["tags"]))
            if key not in first:
                first[key] = len(order)
                order.append(key)
            elif ask["hit"]:
                reuse = max(reuse, len(order) - 1 - first[key])
    return {"lookups": len(lines), "storages": len(by_storage), "distinct_prompts": prompts, "longest_prompt": longest,
            "non_prefix_shared_spans": spans, "first_token_twins": twins, "longest_reuse_distance_prompts": reuse}


def _non_prefix_shared(prompts: list[list[int]]) -> int:
    """Pairs of prompts sharing a whole block at the same place whose first blocks differ."""
    groups: dict[tuple, set[int]] = defaultdict(set)
    for n, p in enumerate(prompts):
        for j in range(1, len(p) // BLOCK):
            groups[(j, tuple(p[j * BLOCK:(j + 1) * BLOCK]))].add(n)
    pairs = set()
    for members in groups.values():
        for a, b in combinations(sorted(members), 2):
            if prompts[a][:BLOCK] != prompts[b][:BLOCK]:
                pairs.add((a, b))
    return len(pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", type=Path, default=ROOT, help="the checkout whose suite runs")
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "connector_input_footprint.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "lookups.jsonl"
        scratch.touch()
        env = {**os.environ, OUT_VAR: str(scratch),
               "PYTHONPATH": os.pathsep.join([str(args.suite), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")])}
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", "conformance",
                        "--kv-connector=connector_input_footprint:RecordingConnector", "--kv-levels=connector",
                        "--kv-connector-capabilities=persistent", "--kv-profile=ci"], cwd=args.suite, env=env,
                       capture_output=True, text=True)
        lines = [json.loads(line) for line in scratch.read_text().splitlines()]
    from store_input_footprint import record_run  # its sibling (this directory is the script's path)

    record_run(args.out, {"what": "the connector level's prompts on the lifecycle control", "suite": args.label,
                          "profile": "ci", "block_tokens": BLOCK, **footprint(lines),
                          "date": datetime.now(timezone.utc).strftime("%Y-%m-%d")})


if __name__ == "__main__":
    main()
