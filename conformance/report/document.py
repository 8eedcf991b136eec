"""The matrix report's document (``matrix.json``, schema ``kvconform.matrix-report/1``): one cell per
results file, as ``render.matrix_document`` writes it and every view (the answers, the version grid,
the page, the diff) reads it, and the views ``render.derive`` adds."""

from __future__ import annotations

from typing import Any, TypedDict

from conformance.verdict.cost import CellCost
from conformance.verdict.results import CellInfo


class Problem(TypedDict):
    """A clause of the cell that is red (a Fail, an Error, an XPass), with its message."""

    clause: str
    status: str
    message: str


class Prefill(TypedDict):
    """What loading saved: the boundary prompts' prefill as the baseline recomputed it and as a load
    engine (``loaded_by``) loaded it."""

    baseline_s: float
    loaded_s: float
    speedup: float
    loaded_by: str


class SuiteBuild(TypedDict):
    """The kvconform that made a cell's result: its version and the hash of its files
    (``util.identity.suite_digest``), so a matrix joined from several runs shows which code made each cell."""

    version: str
    digest: str


class ReportCell(CellInfo, total=False):
    """A results file's cell, with its verdicts: per clause its status, message and expectation."""

    kind: str  # ``level`` in documents written before the rename
    statuses: dict[str, str]  # clause -> status
    verdict: str  # the cell's most severe status
    packages: dict[str, str]
    platform: str  # the machine it ran on: CPU, its features, GPU
    problems: list[Problem]
    messages: dict[str, str]  # clause -> message, for every clause that did not pass
    reasons: dict[str, str]  # clause -> why the matrix expects its failure
    prefill: Prefill
    engine_env: dict[str, str]  # the environment its engines ran with, as the connector declares it
    supplied: list[str]  # what the suite started in the user's place, in words
    geometry: str  # the one geometry a connector that declares one-geometry was judged at
    loads: dict[str, str]  # clause -> what its recorded connector-level passes loaded
    evidence: dict[str, str]  # engine role -> its log, beside the results file
    suite: SuiteBuild  # absent in cells published before it was recorded
    cost: CellCost  # what the cell cost (``verdict.cost``); absent in cells published before it was derived


class MatrixReport(TypedDict, total=False):
    schema: str
    cells: list[ReportCell]
    clauses: list[str]
    coordinates: list[str]
    answers: dict[str, Any]
    versions: dict[str, Any]
    counts: dict[str, int]
    platforms: list[str]
    suites: list[str]  # which kvconform builds made the cells, and how many each
