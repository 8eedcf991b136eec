"""What the store level's drawn inputs reach (#53): run the suite on a recording memory store and
count what it was given, so that a gap in the inputs is a number, not a guess.

    python benchmarks/store_input_footprint.py [--profile ci] [--out benchmarks/results/store_input_footprint.json]

Recorded over a whole run: puts, the smallest and largest entry (bytes), the largest dimension of
any entry's shape, the longest reuse distance of a read that hit (puts between an entry's put and
the read), and the key twins: pairs of keys put that differ only in one middle field of a
``@``-separated key (not the first, not the last). The store is correct (a MemoryStore), so every
clause passes; only the inputs are measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT_VAR = "KVCONFORM_FOOTPRINT"

from conformance.stores.memory import MemoryStore  # noqa: E402


class _Footprint:
    """The run's inputs, across every store instance of the process."""

    def __init__(self) -> None:
        self.puts = 0
        self.sizes: list[int] = []
        self.largest_dim = 0
        self.put_at: dict[str, int] = {}  # key -> the put count when it was last put
        self.longest_reuse = 0
        self.keys: set[str] = set()

    def record(self) -> dict[str, Any]:
        return {"puts": self.puts, "smallest_entry_bytes": min(self.sizes, default=0),
                "largest_entry_bytes": max(self.sizes, default=0), "largest_dimension": self.largest_dim,
                "longest_reuse_distance_puts": self.longest_reuse, "middle_field_key_twins": middle_field_twins(self.keys)}


def middle_field_twins(keys: set[str]) -> dict[str, Any]:
    """Pairs of keys that differ only in one ``@`` field, neither the first nor the last: how many per
    field ("field 2 of 7"), and how many of them differ there in one character only (a near miss)."""
    per_field: dict[str, int] = defaultdict(int)
    one_character = 0
    for i in range(1, max((k.count("@") for k in keys), default=0)):
        groups: dict[tuple, list[str]] = defaultdict(list)
        for key in keys:
            fields = key.split("@")
            if 0 < i < len(fields) - 1:
                groups[(len(fields), tuple(fields[:i]), tuple(fields[i + 1:]))].append(fields[i])
        for (n, _, _), values in groups.items():
            if len(values) > 1:
                per_field[f"field {i + 1} of {n}"] += len(values) * (len(values) - 1) // 2
                one_character += sum(1 for a in range(len(values)) for b in range(a + 1, len(values))
                                     if len(values[a]) == len(values[b])
                                     and sum(x != y for x, y in zip(values[a], values[b])) == 1)
    return {"pairs_per_field": dict(sorted(per_field.items())), "differing_in_one_character": one_character}


_SEEN = _Footprint()


class RecordingStore(MemoryStore):
    def put(self, key, entry):
        super().put(key, entry)
        _SEEN.puts += 1
        _SEEN.sizes.append(entry.spec.layer_nbytes)
        _SEEN.largest_dim = max(_SEEN.largest_dim, *entry.spec.layer_shape)
        _SEEN.put_at[key] = _SEEN.puts
        _SEEN.keys.add(key)

    def get(self, key, spec):
        got = super().get(key, spec)
        if got is not None and key in _SEEN.put_at:
            _SEEN.longest_reuse = max(_SEEN.longest_reuse, _SEEN.puts - _SEEN.put_at[key])
        return got

    def close(self) -> None:
        super().close()
        if os.environ.get(OUT_VAR):
            Path(os.environ[OUT_VAR]).write_text(json.dumps(_SEEN.record()))


def make_store(workdir: Path | None = None, **_: Any) -> RecordingStore:
    return RecordingStore()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "store_input_footprint.json")
    parser.add_argument("--label", default="this checkout")
    args = parser.parse_args()
    scratch = args.out.with_suffix(".run.json")
    env = {**os.environ, OUT_VAR: str(scratch), "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", "conformance",
                           "--kv-store=benchmarks.store_input_footprint:make_store", f"--kv-profile={args.profile}"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(proc.stdout[-3000:] + proc.stderr[-3000:])
    record = {"what": "the store level's inputs on a correct store", "suite": args.label, "profile": args.profile,
              **json.loads(scratch.read_text()), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d")}
    scratch.unlink()
    record_run(args.out, record)


def record_run(out: Path, record: dict[str, Any]) -> None:
    """Keep ``record`` in the results file ``out``, in place of an earlier run of the same suite label."""
    runs = json.loads(out.read_text()) if out.exists() else []
    runs = [r for r in runs if r.get("suite") != record["suite"]] + [record]
    out.write_text(json.dumps(runs, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
