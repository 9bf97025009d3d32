"""`dlbench predict`: an iteration's time per phase from a machine profile, with `--suite` the
machines compared for each of a suite's benchmarks (performance/choice.py), and with `--accuracy`
the prediction error of the runs in the store. A machine profile is a calibrated one from the store,
or a shipped datasheet machine (suites/machines/, performance/datasheet.py) by its name. The model is
src/dlbench/performance/; the prediction is workflows/prediction.py's, which checks the input before
anything is predicted (its RequestError: exit 2, one message); this module parses and renders."""

from __future__ import annotations

import json
import math
import statistics
import sys
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..axes import Mode, Precision
from ..store.store import Store
from ..workflows.prediction import (
    PREDICTED_MODES,
    MachineComparison,
    PredictionAccuracy,
    PredictRequest,
    SinglePrediction,
)
from ..workflows.prediction import predict as run_predict
from . import lookup
from .console import err, fail, out
from .options import FormatOption, StoreOption, axis_option, check_format


def predict(
    network: Annotated[Optional[str], typer.Option(help="A network of suites/networks, or a path to its .yaml.")] = None,
    framework: Annotated[Optional[str], typer.Option(help=(
        "Whose measured kernel times and step kind to use; with --suite, 'all' (the default) or a comma list: "
        "each framework ranked with the machines.")) ] = None,
    batch: Annotated[Optional[int], typer.Option(min=1, help="Batch size (per worker).")] = None,
    mode: Annotated[Mode, axis_option(Mode, accepted=PREDICTED_MODES, help="What the network is timed at.")] = Mode.TRAIN,
    workers: Annotated[Optional[list[int]], typer.Option(min=1, help=(
        "Synchronous data-parallel workers (default 1); with --suite, repeatable: each count compared.")) ] = None,
    machine: Annotated[Optional[list[str]], typer.Option(help=(
        "Machine profile: a shipped datasheet machine by name (a100, h100, h200, l4, mi300x: "
        "suites/machines/), a profile file, or a machine id or hostname with @REVISION for an older one "
        "(default: this machine's latest); with --suite, repeatable: the machines compared.")) ] = None,
    efficiency: Annotated[Optional[list[str]], typer.Option(help=(
        "For datasheet machines: CLASS=VALUE (matmul, convolution, attention, elementwise, all_reduce: "
        "the fraction of the peak reached) or a YAML file of the form of suites/machines/efficiency.yaml; "
        "repeatable.")) ] = None,
    schedule: Annotated[Optional[str], typer.Option(help=(
        "Gradient communication: none | wfbp | mgwfbp (default: the framework's engine, "
        "as its runners/FW/runner.toml [model] states it).")) ] = None,
    precision: Annotated[Precision, axis_option(Precision, accepted=Precision.runs(),
                                                help="The precision the network runs at.")] = Precision.FP32,
    threads: Annotated[Optional[int], typer.Option(min=1, help="Threads the run would use (a note if the profile's differ).")] = None,
    io_bandwidth: Annotated[Optional[float], typer.Option("--io-bandwidth", metavar="GBPS", help=(
        "Read the data at this many GB/s (default: synthetic data already in memory); with --accuracy, the "
        "bandwidth the data term of convergence runs is checked at (default: each run's measured read).")) ] = None,
    accuracy: Annotated[bool, typer.Option("--accuracy", help=(
        "Instead: the prediction error of the runs in the store, per suite and framework.")) ] = False,
    recompute: Annotated[bool, typer.Option("--recompute", help=(
        "With --accuracy: predict every run again from the profile (--machine) instead of using the "
        "prediction its record kept.")) ] = False,
    suite: Annotated[Optional[list[str]], typer.Option(help=(
        "Compare the --machine profiles on each benchmark of this suite (default profile's batch sizes), "
        "ranked; with --accuracy: only these suites. Repeatable.")) ] = None,
    runs: Annotated[bool, typer.Option("--runs", help="With --accuracy: list every run too.")] = False,
    layers: Annotated[bool, typer.Option("--layers", help="The time of every layer too.")] = False,
    format: FormatOption = "table",
    store: StoreOption = None,
) -> None:
    """Predict an iteration's time per phase from a machine profile (--accuracy: score stored predictions)."""
    check_format(format)
    if runs and not accuracy:
        raise fail("--recompute and --runs go with --accuracy")
    request = PredictRequest(network=network, framework=framework, batch=batch, mode=mode.value, workers=workers,
                             machine=machine, efficiency=efficiency, schedule=schedule, precision=precision.value,
                             threads=threads, io_bandwidth=io_bandwidth, accuracy=accuracy, recompute=recompute,
                             suite=suite, store=store)
    result = lookup.refused(run_predict, request)
    if isinstance(result, PredictionAccuracy):
        _accuracy(result, fmt=format, runs=runs)
    elif isinstance(result, MachineComparison):
        _choose(result, fmt=format)
    else:
        _predict(result, fmt=format, layers=layers)


def _predict(result: SinglePrediction, *, fmt: str, layers: bool) -> None:
    p, profile, batch, workers = result.prediction, result.profile, result.batch, result.workers
    if fmt == "json":
        data = {"network": result.network, "framework": result.framework, "batch_per_worker": batch,
                "mode": result.mode, "precision": result.precision, "source": profile.source, **p.to_record(),
                "layers": [{"index": l.index, "label": l.label, "params": l.params, "forward_s": l.forward_s,
                            "backward_s": l.backward_s, "update_s": l.update_s, "measured_s": l.measured_s,
                            "estimated_s": l.estimated_s, "sources_s": l.sources} for l in p.layers],
                "unmeasured": p.unmeasured}
        if p.schedule is not None:
            data["messages"] = p.schedule.groups
        sys.stdout.write(json.dumps(data, indent=1) + "\n")
        return
    title = (f"predicted {result.network} {result.mode}, {result.framework}, batch {batch}"
             + (f" per worker x {workers} workers ({p.schedule.kind})" if workers > 1 else "")
             + f"; machine profile {p.profile}" + (" (datasheet, not measured)" if profile.source == "datasheet" else ""))
    t = Table(title=escape(title))
    for col in ("phase", "ms", "share"):
        t.add_column(col, justify="left" if col == "phase" else "right")
    total = p.iteration_s
    rows = [("data path (not hidden)", p.io_exposed_s), ("step call", p.step_call_s), ("forward", p.forward_s),
            ("backward", p.backward_s), ("update", p.update_s)]
    if workers > 1:
        rows.append(("communication (not hidden)", p.communication_exposed_s))
    for name, seconds in rows:
        t.add_row(name, f"{seconds * 1e3:.3f}", f"{100 * seconds / total:.1f}%" if total else "")
    t.add_row("[bold]iteration[/]", f"[bold]{total * 1e3:.3f}[/]", "100%")
    if workers > 1:
        t.add_row("communication, all of it", f"{p.communication_s * 1e3:.3f}",
                  f"{len(p.schedule.groups)} messages")
    if profile.source == "datasheet":
        t.caption = (f"datasheet: published peaks x stated efficiencies, no measured kernel; "
                     f"{total and batch * workers / total:,.1f} samples/s")
    else:
        t.caption = (f"compute time from {sources_text(p.source_shares)}; {len(p.unmeasured)} kernels not timed at "
                     f"their shape; {total and batch * workers / total:,.1f} samples/s")
    out.print(t)
    if layers:
        lt = Table(title="per layer (ms)")
        for col in ("layer", "params", "forward", "backward", "update", "from"):
            lt.add_column(col, justify="left" if col in ("layer", "from") else "right")
        for l in p.layers:
            busy = sum(l.sources.values())
            lt.add_row(escape(l.label), f"{l.params:,}", f"{l.forward_s * 1e3:.3f}", f"{l.backward_s * 1e3:.3f}",
                       f"{l.update_s * 1e3:.3f}",
                       sources_text({k: v / busy for k, v in l.sources.items()}, short=True) if busy else "")
        out.print(lt)
    for n in p.notes:
        err.print(f"note: {escape(n)}", highlight=False, soft_wrap=True)


SOURCE_WORDS = {"shape": "measured shapes", "class": "measured class efficiencies",
                "ceilings": "the roofline at the measured ceilings", "datasheet": "datasheet figures"}


def sources_text(shares: dict[str, float], short: bool = False) -> str:
    """`62% measured shapes, 30% measured class efficiencies, 8% the roofline at ...` (performance/model.py
    SOURCES); short: `shape 62% class 30% ceilings 8%`."""
    if not shares:
        return "no split by source (recorded before schema 9)" if not short else ""
    if short:
        return " ".join(f"{k} {100 * v:.0f}%" for k, v in shares.items())
    return ", ".join(f"{100 * v:.0f}% {SOURCE_WORDS.get(k, k)}" for k, v in shares.items())


# ---------------------------------------------------------------------------------------- accuracy


def _accuracy(result: PredictionAccuracy, *, fmt: str, runs: bool) -> None:
    for u in result.unreadable:
        err.print(f"[red]unreadable[/] {escape(u.reason)}", highlight=False, soft_wrap=True)
    if not result.runs and not result.data_term and not result.link_term:
        raise fail(f"no completed runs{' matching' if result.matching else ''} in {result.store.root}", 1)
    if fmt == "json":
        sys.stdout.write(json.dumps({"groups": result.groups, "runs": result.runs,
                                     "data_term": [c.to_dict() for c in result.data_term],
                                     "link_term": [c.to_dict() for c in result.link_term],
                                     "crossovers": [c.to_dict() for c in result.crossovers]}, indent=1) + "\n")
        return
    if result.runs:
        _accuracy_tables(result.store, result.runs, result.groups, result.profile, runs)
        for problem in result.problems:
            err.print(f"note: not predicted from {escape(problem)}", highlight=False, soft_wrap=True)
    if result.data_term:
        out.print(data_term_table(result.data_term))
    if result.link_term:
        out.print(link_term_table(result.link_term))
    if result.crossovers:
        out.print(crossover_table(result.crossovers))


def link_term_table(checks) -> Table:
    """Each training run on a shaped link: its loopback run plus the link's α–β term against its
    measured iteration (performance/link_term.py), grouped by method."""
    t = Table(title="communication term on shaped links: loopback iteration + the link's α-β time of the method's "
                    "exchange, against the measured iteration")
    columns = ["benchmark", "framework", "compression", "link", "measured Mbit/s", "rtt us", "loopback ms", "wire ms",
               "predicted ms", "error", "overlapped ms", "error (overlapped)", "measured ms"]
    for col in columns:
        t.add_column(col, justify="left" if col in ("benchmark", "framework", "compression", "link") else "right")
    for c in sorted(checks, key=lambda c: (c.benchmark, c.framework, c.compression, c.bandwidth_bps)):
        t.add_row(escape(c.benchmark), escape(c.framework), escape(c.compression), escape(c.link),
                  f"{c.bandwidth_bps / 1e6:,.1f}", f"{c.rtt_s * 1e6:.0f}",
                  f"{c.loopback_s * 1e3:,.1f}" if c.loopback_s is not None else "",
                  f"{c.wire_s * 1e3:,.1f}" if c.wire_s is not None else "",
                  f"{c.predicted_s * 1e3:,.1f}" if c.predicted_s is not None else escape(c.reason or ""),
                  f"{100 * c.error:+.1f}%" if c.error is not None else "",
                  f"{c.overlapped_s * 1e3:,.1f}" if c.overlapped_s is not None else "",
                  f"{100 * c.overlapped_error:+.1f}%" if c.overlapped_error is not None else "",
                  f"{c.measured_s * 1e3:,.1f}")
    t.caption = ("wire: α = half the measured round trip per message on the longest path, β = 8 / the measured "
                 "bandwidth per byte, bytes from the method's analytical exchange. predicted: loopback + wire (nothing "
                 "overlapped); overlapped: max(loopback, loopback's step without the exchange + wire). Median |error| "
                 "per method: " + "; ".join(f"{m} {_median_abs(e)} ({len(e)} runs), overlapped {_median_abs(o)}"
                                            for m, (e, o) in sorted(_errors(checks).items())))
    return t


def _errors(checks) -> dict[str, tuple[list[float], list[float]]]:
    """Per method, the |errors| of its scored runs: additive and overlapped."""
    out: dict[str, tuple[list[float], list[float]]] = {}
    for c in checks:
        additive, overlapped = out.setdefault(c.compression, ([], []))
        if c.error is not None:
            additive.append(abs(c.error))
        if c.overlapped_error is not None:
            overlapped.append(abs(c.overlapped_error))
    return out


def _median_abs(errors: list[float]) -> str:
    return f"{100 * statistics.median(errors):.1f}%" if errors else "-"


def crossover_table(crossovers) -> Table:
    """The bandwidth below which each method beats dense: predicted from the loopback runs and the
    link's round trip, measured from the link runs' speedups."""
    t = Table(title="crossover bandwidth: below it the method's iteration is shorter than dense's")
    for col in ("benchmark", "framework", "workers", "compression", "extra ms (loopback)", "predicted Mbit/s",
                "overlapped Mbit/s", "measured Mbit/s", "speedup over dense per link (measured Mbit/s)"):
        t.add_column(col, justify="left" if col in ("benchmark", "framework", "compression") or col.startswith("speedup")
                     else "right")
    for c in crossovers:
        predicted = ("never" if c.predicted_bps is None else "always" if math.isinf(c.predicted_bps)
                     else f"{c.predicted_bps / 1e6:,.0f}")
        measured = (f"{c.measured_bps / 1e6:,.0f}" if c.measured_bps is not None
                    else {"above": f"above {c.speedups[-1][1] / 1e6:,.0f}", "below": f"below {c.speedups[0][1] / 1e6:,.0f}"}
                    .get(c.measured_side, c.measured_side))
        t.add_row(escape(c.benchmark), escape(c.framework), str(c.workers), escape(c.compression),
                  f"{c.extra_s * 1e3:+,.1f}" if c.extra_s is not None else "", predicted,
                  f"{c.overlapped_bps / 1e6:,.0f}" if c.overlapped_bps is not None else "", measured,
                  escape(", ".join(f"{asked} ({bps / 1e6:,.0f}): {s:.2f}x" for asked, bps, s in c.speedups)))
    t.caption = ("predicted: communication.crossover_bandwidth with the method's extra cost its loopback iteration less "
                 "dense's (nothing overlapped); overlapped: where the two overlapped predictions meet; measured: where "
                 "the time the method saves over dense crosses 0 between neighbouring links, interpolated linearly in "
                 "1 / the measured bandwidth")
    return t


def data_term_table(checks) -> Table:
    """The model's data term against the measured input-bound share, one row per convergence record
    (performance/data_term.py)."""
    t = Table(title="data term: predicted data share of a step against the measured input-bound share "
                    "(convergence runs)")
    columns = ["suite", "task", "framework", "runs", "B/batch", "read MB/s", "t_io ms", "compute ms",
               "predicted", "no prefetch", "measured", "wait ms", "unexplained ms"]
    for col in columns:
        t.add_column(col, justify="left" if col in ("suite", "task", "framework") else "right")
    for c in checks:
        t.add_row(escape(c.suite), escape(c.task), escape(c.framework), str(c.runs), f"{c.bytes_per_batch:,}",
                  f"{c.read_bytes_per_s / 1e6:,.1f}{'' if c.bandwidth_source == 'stated' else ' m'}",
                  f"{c.io_s * 1e3:.4f}", f"{c.compute_s * 1e3:.2f}", f"{c.predicted_share:.1%}",
                  f"{c.unhidden_share:.1%}", f"{c.measured_share:.1%}", f"{c.measured_wait_s * 1e3:.2f}",
                  f"{c.unexplained_s * 1e3:.2f}")
    t.caption = ("per training step, summed over the seeds that trained; B/batch: as the files hold it (a byte per "
                 "pixel and per label); read MB/s: stated by --io-bandwidth, or m: measured, the splits' bytes over "
                 "the runs' read_s (pipelines built included: a lower bound); t_io: a batch at that rate; compute: "
                 "the measured step less its wait; predicted: the model's data term, max(0, t_io - compute), as a "
                 "share of the step; no prefetch: t_io / (t_io + compute); measured: the time blocked in the "
                 "pipeline's next over the training time; unexplained: measured wait less the predicted one, per "
                 "step: the pipeline's per-batch cost, which is no bandwidth term")
    return t


def _accuracy_tables(store: Store, rows: list[dict], table_rows: list[dict], profile, runs: bool) -> None:
    how = f"predicted again from profile {profile.ref}" if profile else "as predicted before each run"
    sheets = any(g["datasheet_predicted"] for g in table_rows)
    scaled = any(g["scaled"] for g in table_rows)
    t = Table(title=f"prediction error in {store.root} ({how})")
    columns = ["suite", "framework", "precision", "runs", "predicted", "median |error|", "within 25%", "median error",
               "from (mean share)"]
    if scaled:
        columns += ["drift", "scaled |error|", "scaled within 25%"]
    if sheets:
        columns += ["datasheet runs", "datasheet |error|", "datasheet error"]
    for col in columns:
        t.add_column(col, justify="left" if col in ("suite", "framework", "precision", "from (mean share)") else "right")
    for g in table_rows:
        style = "bold" if g["framework"] == "all" else ""
        cells = [g["suite"], g["framework"], g["precision"], str(g["runs"]), str(g["predicted"]),
                 f"{100 * g['median_abs_error']:.1f}%" if g["median_abs_error"] is not None else "",
                 f"{100 * g['within_25']:.0f}%" if g["within_25"] is not None else "",
                 f"{100 * g['median_error']:+.1f}%" if g["median_error"] is not None else "",
                 sources_text(g["sources"], short=True)]
        if scaled:
            cells += [f"{g['median_drift']:.2f}x" if g["median_drift"] is not None else "",
                      f"{100 * g['scaled_median_abs_error']:.1f}%" if g["scaled_median_abs_error"] is not None else "",
                      f"{100 * g['scaled_within_25']:.0f}%" if g["scaled_within_25"] is not None else ""]
        if sheets:
            cells += [str(g["datasheet_predicted"]),
                      f"{100 * g['datasheet_median_abs_error']:.1f}%" if g["datasheet_median_abs_error"] is not None else "",
                      f"{100 * g['datasheet_median_error']:+.1f}%" if g["datasheet_median_error"] is not None else ""]
        t.add_row(*(f"[{style}]{escape(c)}[/]" if style else escape(c) for c in cells))
    t.caption = ("error = predicted / measured median iteration time - 1; runs without a prediction are counted, not "
                 "scored; from: shape (kernels timed at that shape), class (measured class efficiencies), ceilings "
                 "(the roofline at the measured ceilings), datasheet"
                 + ("; drift: the median over the runs of how much longer the workers took for the yardstick (a "
                    "512³ matmul and a 16 MiB relu) than the profile's calibration did, each run's ratio the median of "
                    "its own and its framework's neighbouring runs'; scaled: each prediction times its run's drift, "
                    "i.e. the model's error with the machine's drift taken out" if scaled else "")
                 + ("; datasheet columns: the same runs predicted from the datasheet file of their GPU (published "
                    "peaks x stated efficiencies)" if sheets else ""))
    out.print(t)
    if runs:
        rt = Table(title="runs")
        columns = ["suite", "benchmark", "framework", "batch", "workers", "measured ms", "predicted ms", "error", "from"]
        if scaled:
            columns += ["speed ratio", "drift", "scaled error"]
        if sheets:
            columns += ["datasheet ms", "datasheet error"]
        for col in columns:
            rt.add_column(col, justify="left" if col in ("suite", "benchmark", "framework", "from") else "right")
        for row in rows:
            cells = [escape(row["suite"]), escape(row["benchmark"]), escape(row["framework"]), str(row["batch"]),
                     str(row["workers"]), f"{row['measured_s'] * 1e3:.2f}",
                     f"{row['predicted_s'] * 1e3:.2f}" if row["predicted_s"] else "",
                     f"{100 * row['error']:+.1f}%" if row["error"] is not None else "",
                     sources_text(row["sources"], short=True)]
            if scaled:
                cells += [f"{row['speed_ratio']:.2f}x" if row.get("speed_ratio") else "",
                          f"{row['drift']:.2f}x" if row.get("drift") else "",
                          f"{100 * row['scaled_error']:+.1f}%" if row.get("scaled_error") is not None else ""]
            if sheets:
                cells += [f"{row['datasheet_predicted_s'] * 1e3:.2f}" if row.get("datasheet_predicted_s") else "",
                          f"{100 * row['datasheet_error']:+.1f}%" if row.get("datasheet_error") is not None else ""]
            rt.add_row(*cells)
        out.print(rt)


# ------------------------------------------------------------------------------------------- choice


def _choose(result: MachineComparison, *, fmt: str) -> None:
    """`predict --suite S --machine A --machine B`: performance/choice.py's rows, one table per benchmark,
    every framework and machine in it."""
    rows, profiles = result.rows, result.profiles
    if fmt == "json":
        sys.stdout.write(json.dumps({"frameworks": result.frameworks, "suites": result.suites, "device": result.device,
                                     "rows": [r.to_dict() for r in rows]}, indent=1) + "\n")
        return
    by_job: dict[tuple, list] = {}
    for r in rows:
        by_job.setdefault((r.benchmark, r.batch, r.precision), []).append(r)
    for (bench, batch, precision), group in by_job.items():
        t = Table(title=escape(f"{bench}, batch {batch} per worker, {precision}"))
        for col in ("rank", "framework", "machine", "source", "workers", "iteration ms", "samples/s", "J/sample", "from"):
            t.add_column(col, justify="left" if col in ("framework", "machine", "source", "from") else "right")
        reasons: dict[str, None] = {}
        for r in group:
            if r.error is not None:
                reasons[f"{r.framework} on {r.machine}: {r.error}"] = None
                t.add_row("", r.framework, escape(r.machine), r.source, str(r.workers), "not predicted", "", "", "")
                continue
            t.add_row(str(r.rank), r.framework, escape(r.machine), r.source, str(r.workers),
                      f"{r.iteration_s * 1e3:.3f}", f"{r.samples_per_s:,.1f}",
                      f"{r.energy_per_sample_j:.4f}" if r.energy_per_sample_j is not None else "",
                      sources_text(r.sources, short=True))
        if reasons:
            t.caption = escape("; ".join(reasons))
        out.print(t)
    notes = ["ranked by samples/s (workers x per-worker batch / iteration); J/sample: the boards at their "
             "maximum power for the whole iteration (an upper bound), where the profile states it"]
    if any(p.source == "datasheet" for p in profiles):
        notes.append("datasheet rows: the vendor's published peaks corrected by stated efficiencies "
                     "(suites/machines/efficiency.yaml), not measurements")
    for n in notes:
        err.print(f"note: {escape(n)}", highlight=False, soft_wrap=True)
