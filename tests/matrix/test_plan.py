"""The tier's CI jobs (conformance/matrix/plan.py): every tier of matrix.yaml fits GitHub's job
limit, one stack per job, and the jobs' cells are exactly the tier's."""

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from conformance.matrix import definition as matrix
from conformance.matrix import plan

from tests.matrix.matrix_texts import SHARDED

REPO = Path(__file__).resolve().parents[2]
MATRIX = matrix.load(REPO / "matrix.yaml")


@pytest.mark.parametrize("tier", sorted(MATRIX.tiers))
@pytest.mark.parametrize("max_jobs", [plan.GITHUB_MAX_JOBS, plan.DEFAULT_MAX_JOBS])
def test_every_tier_fits_the_job_limit_with_its_cells_exactly_once(tier, max_jobs):
    cells = MATRIX.cells(tier)
    jobs = plan.plan(MATRIX, tier, max_jobs)
    assert len(jobs) <= max_jobs
    assert Counter(n for job in jobs for n in job.cells) == Counter(c.name for c in cells)
    stacks = {c.name: plan.stack_of(c) for c in cells}
    assert all(stacks[n] == job.stack for job in jobs for n in job.cells)  # one stack per job
    assert len({job.id for job in jobs}) == len(jobs)


def test_a_stack_is_sharded_only_to_fit_and_evenly():
    full = plan.plan(MATRIX, "full", 64)
    assert all(len(job.cells) <= plan.MIN_CELLS_PER_JOB for job in full)
    sizes: dict[str, list[int]] = {}
    for job in full:
        sizes.setdefault(job.stack, []).append(len(job.cells))
    assert all(max(s) - min(s) <= 1 for s in sizes.values())
    # a stack with no more cells than the floor is one job: its install is paid once
    assert all(len(s) == 1 for s in sizes.values() if sum(s) <= plan.MIN_CELLS_PER_JOB)
    stacks = len({plan.stack_of(c) for c in MATRIX.cells("full")})
    assert len(plan.plan(MATRIX, "full", stacks)) == stacks  # one job per stack, when that is all it may have
    with pytest.raises(ValueError, match="more than 3 jobs"):
        plan.plan(MATRIX, "full", 3)


def test_shards_of_a_fleet_cover_the_tier_once():
    n = 10
    shards = [plan.shard(MATRIX, "standard", f"{i}/{n}") for i in range(1, n + 1)]
    assert Counter(c for s in shards for c in s) == Counter(c.name for c in MATRIX.cells("standard"))
    for bad in ("0/3", "4/3", "x", "1/"):
        with pytest.raises(ValueError, match="is not I/N"):
            plan.shard(MATRIX, "standard", bad)


def test_the_cli_prints_the_plan_the_workflow_reads():
    proc = subprocess.run([sys.executable, "-m", "conformance.matrix.plan", "--tier", "standard"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    jobs = json.loads(proc.stdout)
    assert [j["cells"] for j in jobs] == [list(j.cells) for j in plan.plan(MATRIX, "standard")]
    workflow = (REPO / ".github/workflows/matrix.yml").read_text()
    assert "python -m conformance.matrix.plan" in workflow and 'nox -r -s "stack(${{ matrix.job.stack }})"' in workflow


def _untimed(matrix: dict) -> dict:
    """A report's matrix without how long each cell ran (its wall time and its cost model)."""
    return {**matrix, "cells": [{k: v for k, v in cell.items() if k not in ("wall_s", "cost")} for cell in matrix["cells"]]}


def test_a_sharded_run_merged_renders_the_report_an_unsharded_run_does(tmp_path, monkeypatch):
    """Each shard of a fleet runs its job's cells (the first also records the excluded ones); their
    result folders, merged into one, render the report a single machine's run renders."""
    from conformance import cli
    from conformance.report import render

    monkeypatch.setattr(plan, "MIN_CELLS_PER_JOB", 1)  # two cells, two jobs: a fleet of two
    path = tmp_path / "matrix.yaml"
    path.write_text(SHARDED)
    assert [len(s) for s in (plan.shard(matrix.load(path), "quick", f"{i}/2") for i in (1, 2))] == [1, 1]
    run = ["run", "--matrix", str(path), "--tier", "quick", "--results"]
    assert cli.main([*run, str(tmp_path / "single")]) == 0
    merged = tmp_path / "merged"
    for i in (1, 2):
        shard = tmp_path / f"shard{i}"
        assert cli.main([*run, str(shard), "--shard", f"{i}/2"]) == 0
        merged.mkdir(exist_ok=True)
        for result in shard.glob("*.json"):
            shutil.copy(result, merged / result.name)
    single = render.render(tmp_path / "single", tmp_path / "single-report")
    assert _untimed(render.render(merged, tmp_path / "merged-report")) == _untimed(single)
    assert {c["verdict"] for c in single["cells"]} >= {"Pass", "Skip"}  # the excluded cell is there, as Skip
