"""A tier's cells as CI jobs: grouped by stack (each job installs its stack once and runs its cells
with the runner's own lanes), then sharded so the tier fits a job limit (GitHub refuses a matrix of
more than 256 jobs). The one source of the job list: the workflow (`.github/workflows/matrix.yml`),
`kvconform run --shard I/N` on a self-hosted fleet and the tests all read ``plan``.

``python -m conformance.matrix.plan --tier full --max-jobs 64`` prints the jobs as JSON (it needs
only PyYAML, as the noxfile does).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from conformance.matrix.definition import Cell, Matrix, load

GITHUB_MAX_JOBS = 256  # GitHub Actions' limit on the jobs of one matrix
DEFAULT_MAX_JOBS = 64  # what the workflow asks for: a quarter of the limit, room to grow
OWN_PYTHON = "default"  # the stack key of cells that run in the runner's own Python
MIN_CELLS_PER_JOB = 6  # a stack is split no finer: each job pays for its stack's install (GBs of vLLM)


@dataclass(frozen=True)
class Job:
    id: str  # e.g. "vllm-0.28.0 (2/3)"
    stack: str  # the stack it installs, or OWN_PYTHON
    cells: tuple[str, ...]  # cell names, in the tier's order


def stack_of(cell: Cell) -> str:
    return cell.stack.name if cell.stack else OWN_PYTHON


def plan(matrix: Matrix, tier: str, max_jobs: int = DEFAULT_MAX_JOBS) -> list[Job]:
    """The tier's cells in at most ``max_jobs`` jobs, one stack per job, each stack's cells split
    into as few equal shards as fit (of at least MIN_CELLS_PER_JOB cells, where it has that many);
    ValueError when the tier has more stacks than ``max_jobs``."""
    by_stack: dict[str, list[str]] = {}
    for cell in matrix.cells(tier):
        by_stack.setdefault(stack_of(cell), []).append(cell.name)
    if len(by_stack) > max_jobs:
        raise ValueError(f"tier {tier!r} has {len(by_stack)} stacks, more than {max_jobs} jobs: each job installs "
                         "one stack, so allow at least one job per stack")
    if not by_stack:
        return []
    per_job = max(MIN_CELLS_PER_JOB, math.ceil(sum(map(len, by_stack.values())) / max_jobs))
    while sum(math.ceil(len(cells) / per_job) for cells in by_stack.values()) > max_jobs:
        per_job += 1
    jobs = []
    for stack, cells in by_stack.items():
        shards = math.ceil(len(cells) / per_job)
        for i in range(shards):  # as even as can be: sizes differ by one at most
            part = tuple(cells[i * len(cells) // shards:(i + 1) * len(cells) // shards])
            jobs.append(Job(stack if shards == 1 else f"{stack} ({i + 1}/{shards})", stack, part))
    return jobs


def shard(matrix: Matrix, tier: str, spec: str) -> list[str]:
    """The cell names of shard ``I/N`` (1-based): job I of the tier's plan in N jobs (none when the
    plan needs fewer than N jobs); ValueError for a malformed spec."""
    index, _, total = spec.partition("/")
    if not (index.isdigit() and total.isdigit() and 1 <= int(index) <= int(total)):
        raise ValueError(f"--shard {spec!r} is not I/N with 1 <= I <= N")
    jobs = plan(matrix, tier, int(total))
    return list(jobs[int(index) - 1].cells) if int(index) <= len(jobs) else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.matrix.plan", description=__doc__)
    parser.add_argument("--matrix", type=Path, default=Path("matrix.yaml"))
    parser.add_argument("--tier", default="quick")
    parser.add_argument("--max-jobs", type=int, default=DEFAULT_MAX_JOBS)
    args = parser.parse_args(argv)
    try:
        jobs = plan(load(args.matrix), args.tier, args.max_jobs)
    except (ValueError, KeyError) as exc:
        print(f"kvconform plan: {exc}", file=sys.stderr)
        return 2
    print(json.dumps([asdict(j) for j in jobs]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
