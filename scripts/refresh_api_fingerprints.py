"""Regenerate the committed vLLM API fingerprints, ``fixtures/api/vllm-<version>.json``.

Each release's sdist is found through PyPI's simple index (PEP 691 JSON), downloaded once to
the cache directory (checked against the index's sha256; archives are never committed) and read
with the static reader, without installing or importing anything.

    python scripts/refresh_api_fingerprints.py [--cache /work/cache/vllm-sdists] [VERSION ...]

Without VERSION: the releases below, and every final release on PyPI newer than the newest of
them (a new vLLM is fingerprinted by the next refresh, with nothing to edit).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conformance.api_surface import fingerprint, sources, static  # noqa: E402
from conformance.util.versions import version_key  # noqa: E402

VERSIONS = ("0.8.5", "0.9.2", "0.10.2", "0.11.0", "0.12.0", "0.13.0", "0.16.0", "0.19.1", "0.22.0", "0.25.0",
            "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0")
INDEX = "https://pypi.org/simple/vllm/"


def sdists() -> dict[str, dict]:
    """Filename -> the simple index's file entry (url, hashes)."""
    request = urllib.request.Request(INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return {f["filename"]: f for f in json.load(response)["files"]}


def newer_releases(index: dict[str, dict], than: str) -> list[str]:
    """Final releases (no rc, dev or post part) with an sdist in ``index`` newer than ``than``."""
    found = []
    for filename in index:
        match = re.fullmatch(r"vllm-(\d+\.\d+\.\d+)\.tar\.gz", filename)
        if match and version_key(match.group(1)) > version_key(than):
            found.append(match.group(1))
    return sorted(found, key=version_key)


def fetch(entry: dict, cache: Path) -> Path:
    path = cache / entry["filename"]
    if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != entry["hashes"]["sha256"]:
        print(f"downloading {entry['filename']}", flush=True)
        partial = path.with_suffix(".part")
        urllib.request.urlretrieve(entry["url"], partial)
        if hashlib.sha256(partial.read_bytes()).hexdigest() != entry["hashes"]["sha256"]:
            raise SystemExit(f"{entry['filename']}: sha256 does not match the index")
        partial.replace(path)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path("/work/cache/vllm-sdists"))
    parser.add_argument("--out", type=Path, default=fingerprint.COMMITTED)
    parser.add_argument("versions", nargs="*", default=None)
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    index = sdists()
    for version in args.versions or [*VERSIONS, *newer_releases(index, VERSIONS[-1])]:
        entry = index.get(f"vllm-{version}.tar.gz")
        if entry is None:
            print(f"vllm {version}: no sdist on PyPI, skipped")
            continue
        fp = static.fingerprint(sources.read(fetch(entry, args.cache), version=version))
        out = fingerprint.committed_path(version, args.out)
        fingerprint.write(fp, out)
        print(f"vllm {version}: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
