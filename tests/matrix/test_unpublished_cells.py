"""scripts/unpublished_cells.py: what is left to run of a published report regenerated in parts."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from conformance.matrix import definition
from conformance.util.identity import suite_digest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "unpublished_cells.py"
MATRIX = ("schema: kvconform.matrix/1\ntiers: {full: {profile: ci}}\nconnectors:\n"
          "  c: {connector: 'm:C', models: [qwen3-tiny], kv_cache_dtypes: [auto, float16], levels: [engine],"
          " tiers: [full]}\nstores:\n  s: {target: 'm:make_store', tiers: [full]}\n")


def test_only_cells_this_suite_made_count_as_published(tmp_path):
    spec = importlib.util.spec_from_file_location("unpublished_cells", SCRIPT)
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    cells = definition.load(tmp_path / "matrix.yaml").cells("full")
    assert len(cells) == 3
    published = tmp_path / "matrix.json"
    here = {"version": "x", "digest": suite_digest()}
    published.write_text(json.dumps({"cells": [
        {"id": cells[0].id, "suite": here},  # made by this suite: done
        {"id": cells[1].id, "suite": {**here, "digest": "0" * 64}},  # other code: run again
        {"id": cells[2].id},  # published before builds were recorded: run again
        {"id": "cell(gone)", "suite": here}]}))
    assert script.unpublished(cells, published) == [cells[1].name, cells[2].name]
    # Finishing another build's half: only the cell of no recorded build is left.
    assert script.unpublished(cells, published, any_build=True) == [cells[2].name]
    run = subprocess.run([sys.executable, str(SCRIPT), "--matrix", str(tmp_path / "matrix.yaml"), str(published)],
                         capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["--cell", cells[1].name, "--cell", cells[2].name]
    assert "2 of 3 cells of tier 'full'" in run.stderr


def test_any_build_lists_only_the_cells_a_report_lacks(tmp_path):
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    cells = definition.load(tmp_path / "matrix.yaml").cells("full")
    published = tmp_path / "matrix.json"
    published.write_text(json.dumps({"cells": [{"id": cells[0].id, "suite": {"digest": "0" * 64}}]}))
    run = subprocess.run([sys.executable, str(SCRIPT), "--any-build", "--matrix", str(tmp_path / "matrix.yaml"),
                          str(published)], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["--cell", cells[1].name, "--cell", cells[2].name]
    assert "2 of 3 cells of tier 'full' are not in" in run.stderr and "by any build" in run.stderr
