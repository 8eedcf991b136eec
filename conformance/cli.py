"""The ``kvconform`` command: run the matrix, render its report, list the clauses, track vLLM's API."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, cast

from conformance import __version__
from conformance.vocabulary import LEVELS, RECORDED_PACKAGES, Level


def main(argv: list[str] | None = None) -> int:
    """kvconform's commands: their arguments declared, then the chosen one run.

    Over 80 lines: one argparse declaration per command and option, in the order ``--help`` shows them;
    each command's work is its own function."""
    from conformance.verdict.profiles import PROFILES

    parser = argparse.ArgumentParser(prog="kvconform", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kvconform {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a tier of matrix.yaml and render its report")
    run.add_argument("--matrix", type=Path, default=Path("matrix.yaml"))
    run.add_argument("--tier", default="quick")
    run.add_argument("--results", type=Path, default=None, help="default: results/TIER")
    run.add_argument("--report", type=Path, default=None, help="default: RESULTS/report (reports/ is the published one)")
    run.add_argument("--rerun", action="store_true", help="rerun cells that already have results")
    run.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                     help="run N cells at a time (each is its own process tree; engines use every core, so "
                          "more than 2 rarely pays on a small machine)")
    run.add_argument("--cell", action="append", default=[], metavar="NAME",
                     help="run only this cell, by name or id (repeatable); the report still covers every result present")
    run.add_argument("--shard", default=None, metavar="I/N",
                     help="run only job I of the tier planned in N jobs (kvconform plan: one stack per job), for a "
                          "fleet of N machines; shard 1 also records the excluded cells. Merge the result folders "
                          "into one and render it with kvconform report")
    run.add_argument("--list", action="store_true", help="print the tier's cells (name, then id) and exit")
    run.add_argument("--stacks-dir", type=Path, default=Path(".kvconform/stacks"),
                     help="where a stack that the current Python lacks gets its venv (default: .kvconform/stacks)")
    run.add_argument("--no-provision", action="store_true",
                     help="never create stack venvs: a stack not installed here makes its cells Error")

    report = sub.add_parser("report", help="render RESULTS_DIR (or a published matrix.json, re-rendered without its "
                                           "results) into matrix.json, matrix.md, index.html")
    report.add_argument("results_dir", type=Path, metavar="RESULTS_DIR|MATRIX.json")
    report.add_argument("--out", type=Path, default=None, help="default: RESULTS_DIR/report, or beside MATRIX.json")
    report.add_argument("--add", type=Path, action="append", default=[], metavar="RESULTS_DIR|MATRIX.json",
                        help="with MATRIX.json: the cells of RESULTS_DIR (or of another published matrix.json) join "
                             "it, replacing its cells of the same id (cells run elsewhere, e.g. one CI job per cell; "
                             "repeatable, later ones win)")

    sub.add_parser("clauses", help="list the clauses and what each promises")

    dif = sub.add_parser("diff", help="regression table between two results dirs; exit 1 on a regression or "
                                      "lost coverage, 2 when a side cannot be read")
    dif.add_argument("base", type=Path)
    dif.add_argument("head", type=Path)
    dif.add_argument("--allow-lost", action="store_true",
                     help="cells gone and clauses no longer reaching a verdict are reported, not failed")
    dif.add_argument("--format", choices=["markdown", "json"], default="markdown",
                     help="markdown (a job summary) or json")

    gate = sub.add_parser("gate", help="the PR gate: the suite over a change's base and head checkouts, then diff "
                                       "(exit 1 on a regression or lost coverage, 2 when a side cannot run or be read)")
    gate.add_argument("--base", type=Path, required=True, help="a checkout of the change's base")
    gate.add_argument("--head", type=Path, required=True, help="a checkout of the change's head")
    gate.add_argument("--out", type=Path, default=Path("kvconform-gate"), help="results: OUT/base, OUT/head")
    what = gate.add_mutually_exclusive_group(required=True)
    what.add_argument("--connector", help="registry name or module:Class (imported from each checkout)")
    what.add_argument("--store", help="module:factory (imported from each checkout)")
    gate.add_argument("--extra-config", default="", metavar="JSON", help="the connector's kv_connector_extra_config")
    gate.add_argument("--capabilities", default="",
                      help="what the connector declares, comma-separated: persistent, lossy=TOL, pd, cache, stats, events, hma")
    gate.add_argument("--level", choices=LEVELS, default=None,
                      help="default: store for a store, connector for a connector")
    gate.add_argument("--kv-cache-dtypes", default="", metavar="LIST", help="default: every string vLLM knows")
    gate.add_argument("--profile", default="ci", choices=list(PROFILES))
    gate.add_argument("--suite-arg", action="append", default=[], metavar="ARG",
                      help="one more token of the suite's pytest command line (repeatable), e.g. --suite-arg=-kroundtrip")
    gate.add_argument("--summary", type=Path, default=None, help="append the markdown table here ($GITHUB_STEP_SUMMARY)")
    gate.add_argument("--allow-lost", action="store_true", help="report lost coverage without failing on it")

    cert = sub.add_parser("certify", help="run a product's claimed badges and write a bundle")
    cert.add_argument("--product", type=Path, required=True, help="PRODUCT.yaml")
    cert.add_argument("--out", type=Path, required=True, help="a new, empty directory for the bundle")
    cert.add_argument("--sign", type=Path, default=None, metavar="KEY",
                      help="sign MANIFEST.json with this OpenSSH private key (ssh-keygen -Y sign)")

    ver = sub.add_parser("verify", help="check a certification bundle (without rerunning it, unless --rerun)")
    ver.add_argument("bundle", type=Path)
    ver.add_argument("--allowed-signers", type=Path, default=None, metavar="FILE",
                     help="require MANIFEST.json.sig, signed by PRODUCT.yaml's contact_email in this "
                          "ssh-keygen allowed-signers file")
    ver.add_argument("--rerun", action="store_true",
                     help="run every claimed badge again here and compare each verdict and example count")

    fpr = sub.add_parser("api-fingerprint", help="fingerprint vLLM's connector-facing API (default: the installed vLLM)")
    fpr.add_argument("--from", dest="source", type=Path, default=None, metavar="PATH",
                     help="read this sdist, wheel or source tree with ast instead of importing vLLM")
    fpr.add_argument("--out", type=Path, default=None, help="default: standard output")

    adiff = sub.add_parser("api-diff", help="what was added, removed or changed between two API fingerprints")
    adiff.add_argument("a", type=Path)
    adiff.add_argument("b", type=Path)

    areq = sub.add_parser("api-requirements", help="the vLLM names a connector needs; exit 1 if one is missing")
    areq.add_argument("connector", metavar="MODULE_OR_FILE")
    areq.add_argument("--fingerprint", type=Path, action="append", default=[], metavar="FILE",
                      help="check against this fingerprint (repeatable); default: the installed vLLM, by import")

    pln = sub.add_parser("plan", help="a tier's cells as CI jobs (one stack per job, sharded to fit --max-jobs), as JSON")
    pln.add_argument("--matrix", type=Path, default=Path("matrix.yaml"))
    pln.add_argument("--tier", default="quick")
    pln.add_argument("--max-jobs", type=int, default=None, help="default: 64 (GitHub allows 256 jobs in one matrix)")

    stk = sub.add_parser("stacks", help="the stack venvs (and shared torch bases) on disk, with their size; "
                                        "--prune removes what matrix.yaml no longer uses")
    stk.add_argument("--stacks-dir", type=Path, default=Path(".kvconform/stacks"))
    stk.add_argument("--matrix", type=Path, default=Path("matrix.yaml"))
    stk.add_argument("--prune", action="store_true",
                     help="remove stacks matrix.yaml does not name, unfinished installs, and unused torch bases")
    stk.add_argument("--resolve", metavar="TIER",
                     help="instead: resolve each stack TIER runs on, for TIER's platform, with pip's dry run against "
                          "the package index (no install, no GPU needed); exit 1 if one does not resolve")

    args = parser.parse_args(argv)
    commands = {"run": _run, "plan": _plan, "stacks": _stacks, "report": _report, "clauses": _clauses, "gate": _gate,
                "certify": _certify, "verify": _verify,
                "diff": _diff, "api-fingerprint": _api_fingerprint, "api-diff": _api_diff,
                "api-requirements": _api_requirements}
    try:
        return commands[args.command](args)
    except BrokenPipeError:  # `kvconform run --list | head`: the reader left, which is no error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _run(args: argparse.Namespace) -> int:
    from conformance.matrix import tier

    try:
        if args.list:
            for line in tier.listing(args.matrix, args.tier, args.cell, args.shard):
                print(line)
            return 0
        return tier.run_tier(args.matrix, args.tier, results=args.results, report_dir=args.report, names=args.cell,
                             shard=args.shard, rerun=args.rerun, jobs=args.jobs, stacks_dir=args.stacks_dir,
                             provision=not args.no_provision)
    except tier.TierError as exc:
        print(f"kvconform: {exc}", file=sys.stderr)
        return 2


def _plan(args: argparse.Namespace) -> int:
    from conformance.matrix import plan

    return plan.main(["--matrix", str(args.matrix), "--tier", args.tier,
                      *(["--max-jobs", str(args.max_jobs)] if args.max_jobs else [])])


def _resolve_stacks(loaded: Any, tier: str) -> int:
    from conformance.matrix import stacks

    platform = loaded.tiers[tier].platform
    used = sorted({c.stack.name for c in loaded.cells(tier) if c.stack})
    failed = 0
    for name in used:
        try:
            found = stacks.resolve(loaded.stacks[name], platform)
        except stacks.StackError as exc:
            failed += 1
            print(f"{name}\t{platform}\t{exc.reason}")
            continue
        key = ", ".join(f"{p} {found[p]}" for p in RECORDED_PACKAGES if p in found)
        print(f"{name}\t{platform}\tresolves: {key} ({len(found)} packages)")
    print(f"kvconform: {len(used) - failed} of {len(used)} stacks of tier {tier!r} resolve for {platform}")
    return 1 if failed else 0


def _stacks(args: argparse.Namespace) -> int:
    import shutil

    from conformance.matrix import definition as matrix
    from conformance.matrix import stacks

    try:
        loaded = matrix.load(args.matrix)
        if args.resolve is not None and args.resolve not in loaded.tiers:
            raise matrix.MatrixError(f"{args.matrix}: no tier {args.resolve!r} (tiers: {', '.join(loaded.tiers)})")
    except matrix.MatrixError as exc:
        print(f"kvconform: {exc}", file=sys.stderr)
        return 2
    if args.resolve is not None:
        return _resolve_stacks(loaded, args.resolve)
    wanted = set(loaded.stacks)
    found = stacks.inventory(args.stacks_dir)
    remove = {d.name for d in stacks.stale(found, wanted)} if args.prune else set()
    for d in found:
        state = ("removed" if d.name in remove else "shared torch base" if d.is_base else
                 "not in matrix.yaml" if d.name not in wanted else "unfinished install" if not d.complete else "in use")
        on = f" (on {d.base})" if d.base else ""
        print(f"{d.name}\t{d.size_bytes / 2**30:.1f} GiB\t{state}{on}")
        if d.name in remove:
            shutil.rmtree(d.path)
    total = sum(d.size_bytes for d in found if d.name not in remove)
    print(f"kvconform: {len(found) - len(remove)} venvs, {total / 2**30:.1f} GiB in {args.stacks_dir}"
          + (f"; {len(remove)} removed" if remove else ""))
    return 0


def _report(args: argparse.Namespace) -> int:
    from conformance.report import render as report
    from conformance.report.document import MatrixReport

    source = args.results_dir
    if source.is_file():  # a published matrix.json: its cells carry everything the views are derived from
        matrix = _published(source)
        if matrix is None:
            return 2
        cells = matrix["cells"]
        out = args.out or source.parent
        for added in args.add:
            if added.is_file():
                joined = _published(added)
                if joined is None:
                    return 2
                fresh = joined["cells"]
            else:
                fresh = report.matrix_document(report.load_results(added))["cells"]
            if not fresh:  # a typo in a path must not re-render the report as if nothing were missing
                print(f"kvconform: {added} holds no cell results to add", file=sys.stderr)
                return 2
            ids = {c["id"] for c in fresh}
            cells = [c for c in cells if c.get("id") not in ids] + fresh
        rendered = report.write_report(report.derive(cast(MatrixReport, {"schema": matrix.get("schema"), "cells": cells})),
                                       out)
    elif args.add:
        print("kvconform: --add joins results to a published MATRIX.json, not to a results dir", file=sys.stderr)
        return 2
    else:
        out = args.out or source / "report"
        rendered = report.render(source, out)
    print(f"kvconform: {len(rendered['cells'])} cells rendered to {out}")
    return 0


def _published(path: Path) -> dict[str, Any] | None:
    """A published matrix.json (one with its cells), or None after saying on stderr why not."""
    try:
        matrix = json.loads(path.read_text())
        if not isinstance(matrix["cells"], list):
            raise TypeError("its cells are not a list")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"kvconform: {path} is not a matrix.json kvconform wrote: {exc}", file=sys.stderr)
        return None
    return matrix


def _clauses(args: argparse.Namespace) -> int:
    from conformance.verdict.clauses import CLAUSES

    for c in CLAUSES.values():
        needs = f" (needs {', '.join(sorted(c.requires))})" if c.requires else ""
        print(f"{c.id} [{c.level}]{needs}: {c.promise}")
    return 0


def _diff(args: argparse.Namespace) -> int:
    from conformance.report import diff

    try:
        result = diff.compare(args.base, args.head)
    except diff.DiffInputError as exc:
        print(f"kvconform diff: {exc}", file=sys.stderr)
        return 2
    render = diff.as_json if args.format == "json" else diff.markdown
    print(render(result, args.allow_lost), end="")
    return 1 if result.failed(args.allow_lost) else 0


def _gate(args: argparse.Namespace) -> int:
    from conformance.matrix.definition import connector_args
    from conformance.matrix.gate import gate_cell, run_gate

    if args.store:
        subject = [f"--kv-store={args.store}"]
    else:
        try:
            extra = json.loads(args.extra_config) if args.extra_config else None
        except ValueError as exc:
            print(f"kvconform gate: --extra-config is not JSON: {exc}", file=sys.stderr)
            return 2
        subject = list(connector_args(args.connector, extra, [c for c in args.capabilities.split(",") if c]))
    subject += [f"--kv-cache-dtypes={args.kv_cache_dtypes}"] if args.kv_cache_dtypes else []
    subject += args.suite_arg  # each one token of the suite's command line
    level: Level = args.level or ("store" if args.store else "connector")
    cell = gate_cell(args.store or args.connector, subject, level, args.profile)
    return run_gate(args.base, args.head, args.out, cell, allow_lost=args.allow_lost, summary=args.summary)


def _certify(args: argparse.Namespace) -> int:
    from conformance.certify.bundle import certify
    from conformance.certify.golden import GoldenError
    from conformance.certify.verify import sign

    if args.sign is not None and not args.sign.is_file():
        print(f"kvconform certify: --sign {args.sign}: no such key file", file=sys.stderr)
        return 2
    try:
        code = certify(args.product, args.out)
    except GoldenError as exc:
        print(f"kvconform certify: {exc}", file=sys.stderr)
        return 2
    if args.sign is not None and code in (0, 1):
        sign(args.out, args.sign)
        print(f"kvconform certify: signed {args.out / 'MANIFEST.json'} with {args.sign}")
    return code


def _verify(args: argparse.Namespace) -> int:
    from conformance.certify.verify import verify

    problems = verify(args.bundle, allowed_signers=args.allowed_signers, rerun=args.rerun, say=print)
    for problem in problems:
        print(problem)
    print(f"kvconform verify: {'OK' if not problems else f'{len(problems)} problem(s)'}: {args.bundle}")
    return 1 if problems else 0


def _api_fingerprint(args: argparse.Namespace) -> int:
    from conformance.api_surface import fingerprint, runtime, sources, static

    try:
        fp = static.fingerprint(sources.read(args.source)) if args.source else runtime.fingerprint()
    except (sources.SourceError, ImportError) as exc:
        print(f"kvconform api-fingerprint: {exc}", file=sys.stderr)
        return 2
    if args.out is None:
        print(fingerprint.dumps(fp), end="")
    else:
        fingerprint.write(fp, args.out)
        print(f"kvconform api-fingerprint: vLLM {fp['vllm_version']} ({fp['obtained_by']}) written to {args.out}")
    return 0


def _api_diff(args: argparse.Namespace) -> int:
    from conformance.api_surface import api_diff, fingerprint

    try:
        a, b = fingerprint.load(args.a), fingerprint.load(args.b)
    except fingerprint.FingerprintError as exc:
        print(f"kvconform api-diff: {exc}", file=sys.stderr)
        return 2
    print(api_diff.render(a, b), end="")
    return 0


def _api_requirements(args: argparse.Namespace) -> int:
    from conformance.api_surface import fingerprint, requirements

    try:
        path = requirements.source_path(args.connector)
        targets: list[requirements.Resolver] = [
            requirements.FingerprintResolver(fingerprint.load(f)) for f in args.fingerprint] or [requirements.ImportResolver()]
        history = fingerprint.committed()
    except (FileNotFoundError, fingerprint.FingerprintError, ImportError) as exc:
        print(f"kvconform api-requirements: {exc}", file=sys.stderr)
        return 2
    needed = requirements.scan(path)
    failed = False
    for target in targets:
        missing, unchecked = requirements.check(needed, target, history)
        for m in missing:
            print(f"{path}:{m.requirement.line}: {m}")
        print(f"kvconform api-requirements: vLLM {target.version}: {len(missing)} missing of {len(needed)} "
              f"names {path.name} needs" + (f" ({len(unchecked)} not checkable)" if unchecked else ""))
        failed = failed or bool(missing)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
