"""`dlbench compare` and `dlbench history`: how throughput differs between two selections of runs,
and how it moved over time and versions."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer
from rich.markup import escape

from ..store.store import Store
from . import lookup
from .console import err, fail, out
from .options import FormatOption, FrameworkFilter, MachineFilter, StoreOption, check_format

EXIT_REGRESSION = 3  # `compare --fail-on-regression`: 1 stays "error", 2 "bad input"


def compare(
    baseline: Annotated[str, typer.Option(help="Selector of the baseline runs: key=value terms joined by ',' (AND), "
                                               "alternatives with '|'; keys: run, framework, version, machine, since, "
                                               "until, benchmark, suite, device, batch, precision.")],
    candidate: Annotated[str, typer.Option(help="Selector of the candidate runs (same syntax).")],
    store: StoreOption = None,
    fail_on_regression: Annotated[Optional[float], typer.Option(
        "--fail-on-regression", min=0, metavar="PCT",
        help=f"Exit {EXIT_REGRESSION} when a comparison is significant after Holm correction and the candidate's "
             "throughput is more than PCT percent lower.")] = None,
    alpha: Annotated[float, typer.Option(min=0.001, max=0.5, help="Family-wise significance level.")] = 0.05,
    format: FormatOption = "table",
) -> None:
    """Candidate vs baseline per benchmark: throughput ratio with a bootstrap CI, Mann-Whitney U, Holm, geometric mean."""
    from ..analysis.comparison import NothingToCompare, SelectorError, compare_loadgen, comparison_table, loadgen_table
    from ..analysis.comparison import compare as compare_runs
    from ..analysis.comparison import parse_selector

    check_format(format)
    try:
        base_sel, cand_sel = parse_selector(baseline, "--baseline"), parse_selector(candidate, "--candidate")
    except SelectorError as e:
        raise fail(str(e)) from None
    st = lookup.existing_store(store)
    records = _readable_records(st)
    loadgen = compare_loadgen(records, base_sel, cand_sel)  # LoadGen scenario runs (schema 9): their own table
    try:
        result = compare_runs(records, base_sel, cand_sel, alpha=alpha)
    except SelectorError as e:
        raise fail(str(e)) from None
    except NothingToCompare as e:
        if not loadgen:
            raise fail(f"{e} (store {st.root})", 1) from None
        result = None
    if format == "json":
        data = result.to_dict(fail_on_regression) if result is not None else {}
        data["loadgen"] = [c.to_dict() for c in loadgen]
        sys.stdout.write(json.dumps(data, indent=1) + "\n")
    else:
        if result is not None:
            out.print(comparison_table(result))
        if loadgen:
            out.print(loadgen_table(loadgen, base_sel, cand_sel))
    if result is None:
        return
    for side, keys in (("baseline", result.baseline_only), ("candidate", result.candidate_only)):
        for k in keys:
            err.print(f"[yellow]unpaired[/] only in the {side}: {escape(', '.join(f'{f}={v}' for f, v in k.items()))}",
                      highlight=False, soft_wrap=True)
    if fail_on_regression is not None:
        regressions = result.regressions(fail_on_regression)
        for c in regressions:
            err.print(f"[bold red]regression[/] {escape(c.key['benchmark'])}: throughput {c.change_pct:+.1f}% "
                      f"(p Holm {c.p_adjusted:.2g}), beyond --fail-on-regression {fail_on_regression:g}%",
                      highlight=False, soft_wrap=True)
        if regressions:
            raise typer.Exit(EXIT_REGRESSION)


def history(
    store: StoreOption = None,
    benchmark: Annotated[Optional[list[str]], typer.Option(help="Only these benchmarks or networks; repeatable, or a comma list.")] = None,
    framework: FrameworkFilter = None,
    machine: MachineFilter = None,
    format: FormatOption = "table",
) -> None:
    """Median throughput per benchmark, framework and machine over time and versions, with detected steps."""
    from ..analysis.history import build_history, history_table
    from ..store.selection import split_values

    check_format(format)
    st = lookup.existing_store(store)
    records = [r for r in _readable_records(st) if r.status == "ok" and r.summary is not None]
    filters = {"benchmark": split_values(benchmark), "framework": split_values(framework),
               "machine": split_values(machine)}
    present = {
        "benchmark": {r.benchmark for r in records} | {r.network.name for r in records},
        "framework": {str(r.framework.get("name")) for r in records},
        "machine": {str(r.machine.get("hostname")) for r in records} | {str(r.machine.get("machine_id"))
                                                                         for r in records if r.machine.get("machine_id")},
    }
    for kind, values in filters.items():
        for v in sorted(values - present[kind]):
            raise fail(f"--{kind} {v!r}: no completed run in {st.root}; "
                       f"{kind}s there: {', '.join(sorted(present[kind])) or 'none'}")
    series = build_history(records, benchmarks=filters["benchmark"], frameworks=filters["framework"],
                           machines=filters["machine"])
    if format == "json":
        sys.stdout.write(json.dumps([s.to_dict() for s in series], indent=1) + "\n")
        return
    if not series:
        raise fail(f"no completed runs in {st.root}; run `dlbench run` first", 1)
    out.print(history_table(series, f"{len(series)} series in {st.root}"))


def _readable_records(st: Store) -> list:
    problems: list = []
    records = list(st.records(problems))
    for p in problems:
        err.print(f"[yellow]skipped[/] {escape(p.reason)}", highlight=False, soft_wrap=True)
    return records
