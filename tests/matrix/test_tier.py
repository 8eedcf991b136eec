"""A tier's run (``matrix.tier``, what `kvconform run` calls): which cells, shards and excluded cells
it covers; and one writer per results file: the cell's pytest writes the suite's verdicts, the
runner alone writes the cell's result."""

from __future__ import annotations

import json

import pytest

from conformance.matrix import runner, tier
from conformance.matrix.definition import Cell, Tier
from conformance.plugin.options import evidence_dir

from tests.conftest import REPO
from tests.matrix.matrix_texts import SHARDED, write


def test_a_selection_is_the_named_cells_and_records_the_excluded_ones_only_for_a_whole_tier(tmp_path):
    path = write(tmp_path, SHARDED)
    whole = tier.select(path, "quick")
    assert whole is not None and [c.name for c in whole.cells] == ["memory", "file"] and whole.record_excluded
    assert [(c.name, why) for c, why in whole.excluded] == [("lossy", "the codec is under repair")]
    assert whole.current == {"memory", "file", "lossy"}  # the report covers the excluded cell too
    named = tier.select(path, "quick", ["file"])
    assert named is not None and [c.name for c in named.cells] == ["file"] and not named.record_excluded
    assert named.current == whole.current
    assert tier.listing(path, "quick") == ["memory\tstore(memory)", "file\tstore(file)",
                                           "lossy\tstore(lossy)\texcluded: the codec is under repair"]


def test_a_shard_is_its_job_of_the_plan_and_the_first_records_the_excluded_cells(tmp_path, monkeypatch):
    from conformance.matrix import plan

    monkeypatch.setattr(plan, "MIN_CELLS_PER_JOB", 1)
    path = write(tmp_path, SHARDED)
    first, second = (tier.select(path, "quick", shard=f"{i}/2") for i in (1, 2))
    assert first is not None and second is not None
    assert [c.name for c in first.cells] == ["memory"] and first.record_excluded
    assert [c.name for c in second.cells] == ["file"] and not second.record_excluded
    assert tier.select(path, "quick", shard="3/3") is None  # the plan needs fewer jobs
    assert tier.listing(path, "quick", shard="3/3") == [
        "kvconform: shard 3/3 of tier 'quick' has no cells (the plan needs fewer jobs)"]


@pytest.mark.parametrize("names, shard, says", [
    (["lossy"], None, "cell 'lossy' is excluded: the codec is under repair"),
    (["memroy"], None, "has no cell 'memroy'; did you mean 'memory'?"),
    ([], "0/2", "--shard '0/2' is not I/N"),
])
def test_a_run_that_cannot_start_is_one_tier_error(tmp_path, names, shard, says):
    with pytest.raises(tier.TierError, match=says):
        tier.run_tier(write(tmp_path, SHARDED), "quick", results=tmp_path / "r", names=names, shard=shard)
    assert not (tmp_path / "r").exists()  # nothing was recorded


def test_the_plugin_writes_the_verdicts_and_the_runner_alone_writes_the_result(tmp_path, monkeypatch):
    """The cell's pytest is given ``raw_path`` (the evidence it keeps beside it lands beside the
    result); the runner reads it into the result, applying the expectations, and removes it."""
    monkeypatch.chdir(REPO)
    cell = Cell("mem", "store", ("--kv-store=memory", "-k", "shape_preserved"), Tier("quick", "ci", 300),
                expected_failures={"shape_preserved": "a stale expectation"})
    out, raw = runner.result_path(tmp_path, cell), runner.raw_path(tmp_path, cell)
    assert raw.parent == out.parent and raw != out and raw.suffix != ".json"  # never read as a result
    assert evidence_dir(raw) == evidence_dir(out)  # what the plugin keeps beside its file is the result's
    doc = runner.run_cell(cell, tmp_path)
    assert not raw.exists() and json.loads(out.read_text()) == doc
    assert "--kv-results=RESULTS.json" in doc["cell"]["command"]  # the repro command reads as before
    [test] = doc["tests"]
    assert (test["raw_status"], test["status"]) == ("Pass", "XPass")  # the suite's verdict, and the runner's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mem.json", "mem.junit.xml", "mem.log"]
