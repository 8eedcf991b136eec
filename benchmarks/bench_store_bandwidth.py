"""A store's put and get bandwidth, as a ratio to memcpy of the same bytes measured in the same run.

What a vendor weighs a store by beside its verdict: how much slower than copying the bytes in
memory it moves one layer's KV. For each store and payload size (one layer's paged KV tensor,
bf16, blocks of 16 tokens x 8 heads x 128), the median over ``--repeat`` calls of ``put`` (a new
key each) and ``get``, and of ``ctypes.memmove`` of the same number of bytes; every hit's bytes are
compared with what was put (a fast wrong store is not a result), and misses are counted (a cache
may evict: LMCache's CPU backend keeps about four 16 MiB values in the adapter's buffer). Writes
``benchmarks/results/store_bandwidth.json`` (rows of stores not run this time are kept).

    python benchmarks/bench_store_bandwidth.py [--store memory --store file ...] [--repeat 7]

The LMCache backends need the Python of ``nox -s engine`` (LMCache installed); ``lmcache-redis``
needs redis-server, which the adapter starts itself.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from conformance.contract.spec import KVSpec
from conformance.contract.store import KVEntry
from conformance.stores import loader

HERE = Path(__file__).resolve().parent
SIZES_MIB = (0.0625, 1, 16)  # straddling the value-size limits stores have (64 KiB, 1 MiB, 16 MiB)


def _spec(mib: float) -> KVSpec:
    one_block = KVSpec(kv_cache_dtype="bfloat16", num_blocks=1).layer_nbytes
    return KVSpec(kv_cache_dtype="bfloat16", num_blocks=max(1, round(mib * 2**20 / one_block)))


def _median_s(call: Callable[[int], Any], repeat: int) -> float:
    times = []
    for i in range(repeat):
        started = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(store_name: str, repeat: int) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = loader.build(loader.resolve(store_name), Path(tmp))
        try:
            for mib in SIZES_MIB:
                spec = _spec(mib)
                tensor = torch.randint(0, 256, (spec.layer_nbytes,), dtype=torch.uint8).view(spec.storage_dtype)
                entry = KVEntry(spec, tensor.view(spec.layer_shape))
                target = torch.empty_like(tensor)
                nbytes = spec.layer_nbytes
                # Each lambda is timed at once, inside this iteration: B023's late binding cannot bite.
                memcpy = _median_s(lambda _: ctypes.memmove(target.data_ptr(), tensor.data_ptr(), nbytes), repeat)  # noqa: B023
                keys = [f"bench/{store_name}/{mib}/{i}" for i in range(repeat)]
                put = _median_s(lambda i: store.put(keys[i], entry), repeat)  # noqa: B023
                got: list[Any] = []
                get = _median_s(lambda i: got.append(store.get(keys[i], spec)), repeat)  # noqa: B023
                hits = [g for g in got if g is not None]  # a cache may evict (a miss is not a wrong byte)
                intact = all(g.tensor.contiguous().view(torch.uint8).flatten().equal(tensor.view(torch.uint8))
                             for g in hits)
                rows.append({"store": store_name, "payload_bytes": nbytes,
                             "memcpy_gb_s": round(nbytes / memcpy / 1e9, 2),
                             "put_gb_s": round(nbytes / put / 1e9, 3), "get_gb_s": round(nbytes / get / 1e9, 3),
                             "put_vs_memcpy": round(memcpy / put, 4), "get_vs_memcpy": round(memcpy / get, 4),
                             "hits": len(hits), "gets": len(got), "bytes_intact": intact})
        finally:
            store.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", action="append", default=None)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    stores = args.store or ["memory", "file"]
    rows = [row for name in stores for row in measure(name, args.repeat)]
    path = HERE / "results" / "store_bandwidth.json"
    kept = json.loads(path.read_text())["rows"] if path.is_file() else []
    rows = [r for r in kept if r["store"] not in stores] + rows
    path.write_text(json.dumps({"repeat": args.repeat, "machine": platform.machine(), "torch": torch.__version__,
                                "rows": rows}, indent=2) + "\n")
    for r in rows:
        print(f"{r['store']:<14} {r['payload_bytes']:>10} B  memcpy {r['memcpy_gb_s']:>6} GB/s  "
              f"put {r['put_vs_memcpy']:>7.4f}x  get {r['get_vs_memcpy']:>7.4f}x  "
              f"hits {r.get('hits', '?')}/{r.get('gets', '?')}  "
              f"intact={r['bytes_intact']}")
    print(f"written to {path.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
