"""The release's last check before publishing: the built wheel, installed in a clean venv outside
the checkout, is the version the tag names and runs the suite.

    python scripts/check_dist.py dist [--tag v0.1.0]

The tag names the release; the version the wheel is built with is ``conformance.__version__``. A
tag that names another version fails here, before anything is published. The store level against
the reference ``memory`` store proves the installed wheel carries its plugin, its data and its CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
CONSTRAINTS = HERE / "constraints" / "cpu.txt"  # the CPU torch build; the venv needs torch, not CUDA's


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dist", type=Path, help="where `python -m build` wrote the sdist and the wheel")
    parser.add_argument("--tag", help="the git tag being released (vX.Y.Z): it must name the built version")
    args = parser.parse_args(argv)
    wheels, sdists = sorted(args.dist.glob("kvconform-*.whl")), sorted(args.dist.glob("kvconform-*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        return _fail(f"{args.dist}: expected one wheel and one sdist, found {[p.name for p in (*wheels, *sdists)]}")
    version = wheels[0].name.split("-")[1]
    if sdists[0].name != f"kvconform-{version}.tar.gz":
        return _fail(f"the sdist {sdists[0].name} and the wheel {wheels[0].name} disagree on the version")
    if args.tag is not None and args.tag.removeprefix("v") != version:
        return _fail(f"tag {args.tag} does not name the built version {version} (conformance.__version__): "
                     f"bump it, or tag v{version}")
    with tempfile.TemporaryDirectory(prefix="kvconform-dist-") as tmp:
        venv, work = Path(tmp) / "venv", Path(tmp) / "work"
        work.mkdir()
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the checkout
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        subprocess.run([python, "-m", "pip", "install", "-q", "-c", str(CONSTRAINTS), str(wheels[0].resolve())],
                       check=True, cwd=work, env=env)
        said = subprocess.run([str(venv / "bin" / "kvconform"), "--version"], capture_output=True, text=True,
                              cwd=work, env=env, check=True).stdout.strip()
        if said != f"kvconform {version}":
            return _fail(f"the installed wheel says {said!r}, not 'kvconform {version}'")
        results = work / "results.json"
        subprocess.run([python, "-m", "pytest", "--pyargs", "conformance", "--kv-store=memory", "--kv-profile=ci",
                        "-q", "-p", "no:cacheprovider", f"--kv-results={results}"], cwd=work, env=env, check=False)
        statuses = {t["status"] for t in json.loads(results.read_text())["tests"]} if results.exists() else set()
        if not statuses or not statuses <= {"Pass", "Disabled"}:
            return _fail(f"the installed wheel's store level against memory: {sorted(statuses) or 'no results'}")
    print(f"check_dist: {wheels[0].name} and {sdists[0].name}: version {version}, installed outside the "
          f"checkout, store level passes")
    return 0


def _fail(message: str) -> int:
    print(f"check_dist: {message}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
