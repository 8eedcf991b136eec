"""matrix.yaml's known failures as a table for the docs (docs/matrix.md's ``expectations`` block,
``conformance/util/generated.py``): they are written once, in matrix.yaml, which the runs judge by."""

from __future__ import annotations

from conformance.matrix.definition import Expectation, Matrix

BLOCK = "expectations"


def expectation_table(matrix: Matrix) -> str:
    """One row per expectation, in matrix.yaml's order: the connectors (or stores) it is for, the
    other coordinates it holds on, its clauses, its reason verbatim; newline-terminated."""
    lines = ["| connector | where | known failures | why |", "|---|---|---|---|"]
    for e in matrix.expectations:
        subject = e.when.get("connector") or e.when.get("store") or ("any",)
        clauses = ", ".join(f"`{c}`" for c in e.clauses) + (" (may pass or fail)" if e.intermittent else "")
        lines.append(f"| {_cell(', '.join(subject))} | {_cell(_where(e))} | {clauses} | {_cell(e.reason)} |")
    return "\n".join(lines) + "\n"


def _where(e: Expectation) -> str:
    """The coordinates other than the subject's, as ``vllm 0.29.0, 0.30.0; model qwen3-tiny``."""
    rest = [f"{k} {', '.join(v)}" for k, v in e.when.items() if k not in ("connector", "store")]
    return "; ".join(rest) or "every cell"


def _cell(text: str) -> str:
    """``text`` as one markdown table cell: one line, a bare | escaped."""
    return " ".join(text.split()).replace("|", "\\|")
