"""The dlbench command line (typer): `app`, built from one module per command group; before any command
it removes the shaped links (`--link`) of a dlbench killed with SIGKILL (execution/links.py). Input is
validated in those modules or in the workflows they call (dlbench.workflows: `run` and `calibrate`
parse their options into a request, call the workflow and render what it returns), once; errors exit
2 with one message (console.fail).

    console.py      the consoles `out` and `err`, `fail`, the progress bar
    signals.py      stops_on_signals: SIGINT, SIGTERM, SIGHUP for the commands that start processes;
                    interrupted: the one epilogue of a run cut short (every suite kind)
    options.py      the shared options (--store, --format, --device, ...), their values and checks
    lookup.py       suites, runners and the store by name (workflows/lookup.py's, exiting 2)
    listing.py      list
    run.py          run (workflows/run.py; which options each suite kind honours: workflows/suite_kinds.py;
                    suites of kind distributed and comm: distributed.py; kernels: performance.py;
                    convergence: convergence.py)
    results.py      results
    compare.py      compare, history
    report.py       report
    check.py        check
    performance.py  kernels, calibrate (workflows/calibration.py) and `run --suite kernels`
    prediction.py   predict (and --accuracy)
    plan.py         plan: a job trace on a cluster under each scheduling policy (workflows/planning.py)
    info.py         info
    env.py          env list|create|remove
    store.py        store verify|upgrade|merge
    schema.py       schema export|show: JSON Schemas of the files dlbench reads
"""

from __future__ import annotations

import typer
from rich.markup import escape

from .console import err
from . import check, compare, env, info, listing, performance, plan, prediction, report, results, run, schema, store

app = typer.Typer(help="Cross-framework deep-learning benchmarks.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)


@app.callback()
def _remove_what_killed_runs_left() -> None:
    """Before every command: the shaped links (network namespaces) of a dlbench killed with SIGKILL,
    whose owner is gone, are removed (execution/links.py); a live owner's are left alone."""
    from ..execution.links import LinkError, sweep_orphans

    try:
        removed = sweep_orphans()
    except LinkError as e:
        err.print(f"[yellow]warning[/]: {escape(str(e))}", highlight=False, soft_wrap=True)
        return
    if removed:
        err.print(f"removed the network namespaces a killed dlbench left: {', '.join(removed)}", highlight=False,
                  soft_wrap=True)


app.add_typer(env.env_app, name="env")
app.add_typer(store.store_app, name="store")
app.add_typer(schema.schema_app, name="schema")

app.command("list")(listing.list_suites)
app.command("run")(run.run)
app.command("results")(results.results)
app.command("compare")(compare.compare)
app.command("history")(compare.history)
app.command("report")(report.report)
app.command("check")(check.check)
app.command("kernels")(performance.kernels)
app.command("calibrate")(performance.calibrate)
app.command("predict")(prediction.predict)
app.command("plan")(plan.plan)
app.command("info")(info.info)

__all__ = ["app"]
