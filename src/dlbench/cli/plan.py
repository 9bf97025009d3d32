"""`dlbench plan`: a job trace simulated on a cluster under each scheduling policy (workflows/planning.py,
src/dlbench/planning/), printed as a table or JSON, and with `--page DIR` as a page of the report
(reporting/plan_page.py). Bad input is the workflow's RequestError: exit 2, one message."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..planning.policies import POLICIES
from ..planning.simulator import MAX_ROUNDS
from ..workflows.planning import TRACE_FORMATS, PlanRequest, PlanResult
from ..workflows.planning import plan as run_plan
from .console import err, out, safe
from .lookup import refused
from .options import FormatOption, StoreOption, check_format, listed_choices


def plan(
    cluster: Annotated[Path, typer.Option(help="The cluster file (YAML): device types, nodes, links, prices.")],
    trace: Annotated[Path, typer.Option(help="The job trace: dlbench's YAML or CSV, Gavel's or sacct's (--trace-format).")],
    trace_format: Annotated[str, typer.Option("--trace-format", help=" | ".join(TRACE_FORMATS))] = "dlbench",
    throughputs: Annotated[Optional[Path], typer.Option(help=(
        "Gavel's throughput table (simulation_throughputs.json) instead of dlbench's matrix: the cluster's "
        "types are its worker types.")) ] = None,
    policy: Annotated[Optional[list[str]], typer.Option(help=(
        f"Policies to simulate: {', '.join(POLICIES)}; 'all' (the default) or a comma list; repeatable.")) ] = None,
    framework: Annotated[Optional[str], typer.Option(help=(
        "What `framework: any` jobs run in under every policy but framework_aware (default: the single "
        "framework fastest over them).")) ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the agnostic placements' choices.")] = 0,
    what_if: Annotated[Optional[list[str]], typer.Option("--what-if", help=(
        "A change to the cluster, simulated again: 'add N TYPE', 'remove N TYPE', 'replace TYPE with TYPE'; "
        "repeatable.")) ] = None,
    limit: Annotated[Optional[int], typer.Option(min=1, help="Only the first N jobs of the trace.")] = None,
    max_rounds: Annotated[int, typer.Option("--max-rounds", min=1, help=(
        "Stop a simulation after this many rounds; the jobs left unfinished are counted.")) ] = MAX_ROUNDS,
    measure_jobs: Annotated[Optional[str], typer.Option("--measure-jobs", help=(
        "FIRST:LAST: report JCT and ρ of these jobs only (their places in the trace, from 0) and stop when "
        "they are done, the later jobs still arriving: a steady-state window, as Gavel's 4000:5000.")) ] = None,
    sacct_batch: Annotated[int, typer.Option("--sacct-batch", min=1, help=(
        "Batch per GPU of sacct's jobs (sacct does not record it).")) ] = 32,
    sacct_type: Annotated[Optional[str], typer.Option("--sacct-type", help=(
        "The cluster type of a sacct job whose GRES names no GPU type.")) ] = None,
    page: Annotated[Optional[Path], typer.Option(help=(
        "Also write the report's plan page, DIR/plan.html (a report folder: beside its pages).")) ] = None,
    matrix: Annotated[bool, typer.Option("--matrix", help="Print the throughput matrix too.")] = False,
    store: StoreOption = None,
    format: FormatOption = "table",
) -> None:
    """Which job goes where: a trace simulated on a heterogeneous cluster under FIFO, SRTF, LAS, Gavel's
    LPs and the framework-aware policy, from dlbench's measured and predicted throughputs."""
    check_format(format)
    policies = listed_choices("policy", policy, list(POLICIES))
    measure = _window(measure_jobs) if measure_jobs is not None else None
    request = PlanRequest(measure=measure, cluster=cluster, trace=trace, trace_format=trace_format, throughputs=throughputs,
                          policies=policies, framework=framework, seed=seed, what_if=what_if, limit=limit,
                          sacct_batch=sacct_batch, sacct_type=sacct_type, max_rounds=max_rounds, store=store)
    result = refused(run_plan, request)
    if page is not None:
        from ..reporting.plan_page import write_plan_page

        written = write_plan_page(result, page)
        err.print(f"plan page: {written}")
    if format == "json":
        sys.stdout.write(json.dumps(result.to_dict(), indent=1) + "\n")
        return
    _tables(result, matrix)


def _window(text: str) -> tuple[int, int]:
    first, sep, last = text.partition(":")
    if not sep or not first.strip().isdigit() or not last.strip().isdigit() or int(first) > int(last):
        err.print(safe(f"--measure-jobs {text!r}: expected FIRST:LAST, two job numbers, FIRST <= LAST (e.g. 4000:5000)"))
        raise typer.Exit(2)
    return int(first), int(last)


def _hours(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds / 3600:.3g}"


def _money(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _summary_table(title: str, runs) -> Table:
    table = Table(title=title)
    for name in ("policy", "done", "avg JCT h", "p99 JCT h", "makespan h", "utilisation", "cost used", "cluster cost",
                 "ρ med", "ρ max", "preempt", "spread", "LP s/solve", "sim s"):
        table.add_column(name, justify="left" if name in ("policy", "utilisation") else "right")
    for r in runs:
        s = r.summary
        table.add_row(s.policy, f"{s.finished:,}/{s.jobs:,}", _hours(s.average_jct_s), _hours(s.p99_jct_s), _hours(s.makespan_s),
                      " ".join(f"{k} {100 * v:.0f}%" for k, v in s.utilisation.items()), _money(s.cost_used),
                      _money(s.cost_cluster), f"{s.ftf_median:.2f}" if s.ftf_median is not None else "",
                      f"{s.ftf_max:.2f}" if s.ftf_max is not None else "", str(s.preemptions),
                      f"{s.spread_starts} ({100 * s.spread_share:.0f}%)",
                      f"{s.lp_solve_mean_s:.3f}" if s.lp_solve_mean_s is not None else "", f"{r.seconds:.2f}")
    return table


def _tables(result: PlanResult, with_matrix: bool) -> None:
    types = ", ".join(f"{t.count} {t.name}" for t in result.cluster.types)
    out.print(_summary_table(safe(f"{len(result.jobs)} jobs on {result.cluster.name} ({types})"), result.runs))
    for w in result.what_if:
        out.print(_summary_table(safe(f"what if: {w.question}"), w.runs))
    for s in result.summaries:
        if s.measured:
            err.print(safe(f"{s.policy}: JCT and ρ of {s.measured}"))
        for note in s.notes:
            err.print(safe(f"{s.policy}: {note}"))
    for note in result.trace.notes + result.notes:
        err.print(safe(f"note: {note}"))
    err.print(f"matrix: {len(result.matrix)} cells in {result.matrix_s:.2f} s")
    if with_matrix:
        table = Table(title="throughput matrix (iterations/s)")
        for name in ("network", "batch", "workers", "type", "framework", "precision", "it/s", "source", "±", "placement"):
            table.add_column(name, justify="right" if name in ("batch", "workers", "it/s", "±") else "left")
        for c in result.matrix:
            table.add_row(safe(c["network"]), str(c["batch"]), str(c["workers"]), c["type"], c["framework"],
                          c["precision"], f"{c['iterations_per_s']:.4g}" if c["iterations_per_s"] else "-",
                          c["source"] or safe(c["note"])[:40],
                          f"{100 * c['uncertainty']:.0f}%" if c["uncertainty"] is not None else "?", c["placement"])
        out.print(table)
