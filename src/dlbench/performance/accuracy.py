"""How well the model predicted: each completed run's stored prediction (or one made again from a
machine profile) against its measured iteration time, and the errors summarised per suite and
framework, and per precision where runs of several were predicted (`dlbench predict --accuracy`).

Each prediction says how much of its time came from each source (model.SOURCES); a group's row
gives the mean of those shares. Held to account: a run on a GPU that a datasheet file describes
(its `gpu_names`) is predicted from that datasheet too, and its error is set beside the calibrated
(or stored) prediction's, so what the published figures and stated efficiencies get wrong shows
on runs of the very machine.

The machine's drift: a run and a profile that both timed the yardstick (performance/yardstick.py)
are compared at the same speed too. `speed_ratio` is how much longer the run's workers took for
the yardstick than the profile's calibration did. One worker's yardstick is a tenth of a second:
a burst of another tenant's work in it moves it by up to 1.45x on the development VM, where the
run's own median, over seconds, moves little. So a run is scaled by its `drift`, the median speed
ratio of it and its neighbours in time of the same framework (the runs before and after it,
within DRIFT_WINDOW_S): one burst is voted down, a machine that stays slower is followed from its
second run on. `scaled_error` is the prediction times that drift against the measured time. Where
the raw error and the scaled one differ, the machine moved between the calibration and the run;
the scaled one is the model's own."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from datetime import datetime

from ..store.profiles import MachineProfile
from .model import SOURCES, FrameworkFacts
from . import yardstick
from .runtime import RunPredictor

DRIFT_WINDOW_S = 20 * 60  # a neighbour further away in time is another period of the machine


def datasheet_matcher(sheets: Mapping[str, list[str]]) -> Callable[[dict], str | None]:
    """machine fingerprint -> the datasheet machine (a file's name) whose `gpu_names` holds the name of
    the fingerprint's first GPU, ignoring case; None for a CPU or an unknown board. `sheets`: each
    datasheet machine's gpu_names."""
    names = {n.strip().lower(): machine for machine, given in sheets.items() for n in given}

    def match(fingerprint: dict) -> str | None:
        gpus = [g for g in fingerprint.get("gpus") or [] if isinstance(g, dict)]
        return names.get(str(gpus[0].get("name") or "").strip().lower()) if gpus else None

    return match


def prediction_errors(records, recompute_with: MachineProfile | None = None,
                      frameworks: Mapping[str, FrameworkFacts] | None = None,
                      datasheets: Mapping[str, MachineProfile] | None = None,
                      match_datasheet: Callable[[dict], str | None] | None = None,
                      yardsticks: Mapping[str, Mapping] | None = None) -> list[dict]:
    """One row per completed run with a prediction: suite, framework, benchmark, batch, measured and
    predicted seconds per iteration, the relative error (predicted / measured - 1) and the shares
    of the predicted time by source. With `recompute_with`, every run is predicted again from that
    profile instead of the stored prediction, each framework with its `frameworks` facts
    (RunPredictor). With `datasheets` (name -> datasheet profile) and `match_datasheet`
    (datasheet_matcher), a CUDA run of a board a datasheet describes is also predicted from it:
    `datasheet`, `datasheet_predicted_s`, `datasheet_error` (or `datasheet_problem`). A run whose
    workers timed the yardstick, predicted from a profile that did (`recompute_with`'s, else the
    stored prediction's profile in `yardsticks`: profile ref -> its `yardstick`), also gets its
    `speed_ratio`, its `drift` and `scaled_error` (_scale_by_drift)."""
    predictor = RunPredictor(recompute_with, frameworks=frameworks) if recompute_with is not None else None
    sheet_predictors = {name: RunPredictor(p, frameworks=frameworks) for name, p in (datasheets or {}).items()}
    rows = []
    for r in records:
        if r.status != "ok" or r.summary is None or r.workload.mode not in ("train", "infer"):
            continue
        workers = r.distributed.workers if r.distributed else 1
        if predictor is not None:
            batch = (r.distributed.per_worker_batch if r.distributed and r.distributed.per_worker_batch
                     else r.workload.batch_size)
            predictor.threads = r.settings.threads_requested
            pred = predictor(network=r.network.definition, batch=batch, mode=r.workload.mode,
                             precision=r.workload.precision, framework=str(r.framework.get("name")), workers=workers)
            predicted, profile, sources = pred.get("iteration_s"), pred.get("profile"), pred.get("sources") or {}
        elif r.prediction is not None:
            predicted, profile, sources = r.prediction.iteration_s, r.prediction.profile, dict(r.prediction.sources)
        else:
            predicted = profile = None
            sources = {}
        measured = r.summary.median_s
        base = (recompute_with.yardstick if recompute_with is not None else (yardsticks or {}).get(profile) or {})
        calibrated = base.get(str(r.framework.get("name")))
        ratio = (yardstick.speed_ratio(yardstick.pooled(rep.yardstick for rep in r.repeats if rep.status == "ok"),
                                       calibrated.median_s) if calibrated is not None else None)
        row = {"run_id": r.run_id, "suite": r.suite, "framework": str(r.framework.get("name")),
               "benchmark": r.benchmark, "batch": r.workload.batch_size, "workers": workers,
               "precision": r.workload.precision,
               "measured_s": measured, "predicted_s": predicted, "profile": profile, "sources": sources,
               "error": predicted / measured - 1 if predicted and measured else None,
               "started_at": r.started_at.isoformat(), "speed_ratio": ratio}
        sheet = match_datasheet(r.machine) if match_datasheet and r.workload.device == "cuda" else None
        if sheet in sheet_predictors:
            batch = (r.distributed.per_worker_batch if r.distributed and r.distributed.per_worker_batch
                     else r.workload.batch_size)
            pred = sheet_predictors[sheet](network=r.network.definition, batch=batch, mode=r.workload.mode,
                                           precision=r.workload.precision, framework=row["framework"],
                                           workers=workers)
            on_sheet = pred.get("iteration_s")
            row.update({"datasheet": f"datasheet:{sheet}", "datasheet_predicted_s": on_sheet,
                        "datasheet_error": on_sheet / measured - 1 if on_sheet and measured else None,
                        **({"datasheet_problem": pred["error"]} if pred.get("error") else {})})
        rows.append(row)
    _scale_by_drift(rows)
    return rows


def _scale_by_drift(rows: list[dict]) -> None:
    """Each row with a speed ratio gets `drift` (the median ratio of it and the framework's runs just
    before and after it, within DRIFT_WINDOW_S) and `scaled_error`; the others get None."""
    timed: dict[str, list[tuple[float, dict]]] = {}
    for row in rows:
        row["drift"] = row["scaled_error"] = None
        if row["speed_ratio"] is not None:
            started = datetime.fromisoformat(row["started_at"]).timestamp()
            timed.setdefault(row["framework"], []).append((started, row))
    for runs in timed.values():
        runs.sort(key=lambda pair: pair[0])
        for i, (started, row) in enumerate(runs):
            near = [other["speed_ratio"] for t, other in runs[max(0, i - 1): i + 2] if abs(t - started) <= DRIFT_WINDOW_S]
            row["drift"] = statistics.median(near)
            if row["predicted_s"] and row["measured_s"]:
                row["scaled_error"] = row["predicted_s"] * row["drift"] / row["measured_s"] - 1


def accuracy_table_rows(rows: list[dict]) -> list[dict]:
    """Per suite and framework (then per suite; per framework over every suite where runs of several
    suites were scored; then all), and per precision over everything when runs of more than one
    precision were scored: runs, predicted runs, median |error|, share within
    25%, median signed error. A reduced precision is predicted from the kernel suite's bfloat16 or
    float16 kernels (workload.decompose), so its accuracy is that of those measurements."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["suite"], row["framework"], "all"), []).append(row)
        groups.setdefault((row["suite"], "all", "all"), []).append(row)
        groups.setdefault(("all", row["framework"], "all"), []).append(row)
        groups.setdefault(("all", "all", "all"), []).append(row)
    if len({row.get("precision", "fp32") for row in rows}) > 1:
        for row in rows:
            groups.setdefault(("all", "all", row.get("precision", "fp32")), []).append(row)
    out_rows = []
    for (suite, framework, precision), members in sorted(
            groups.items(), key=lambda kv: (kv[0][0] == "all", kv[0][0], kv[0][1] == "all", kv[0][1],
                                            kv[0][2] == "all", kv[0][2])):
        if framework == "all" and suite != "all" and len({m["framework"] for m in members}) < 2:
            continue  # a suite's total is worth a row only over several frameworks
        if suite == "all" and framework != "all" and len({m["suite"] for m in members}) < 2:
            continue  # and a framework's total only over several suites
        errors = [m["error"] for m in members if m["error"] is not None]
        split = [m["sources"] for m in members if m["error"] is not None and m.get("sources")]
        on_sheets = [m["datasheet_error"] for m in members if m.get("datasheet_error") is not None]
        scaled = [m for m in members if m.get("scaled_error") is not None]
        out_rows.append({"suite": suite, "framework": framework, "precision": precision,
                         "runs": len(members), "predicted": len(errors),
                         "median_abs_error": statistics.median(abs(e) for e in errors) if errors else None,
                         "within_25": sum(abs(e) <= 0.25 for e in errors) / len(errors) if errors else None,
                         "median_error": statistics.median(errors) if errors else None,
                         "scaled": len(scaled),
                         "scaled_median_abs_error": statistics.median(abs(m["scaled_error"]) for m in scaled) if scaled else None,
                         "scaled_within_25": sum(abs(m["scaled_error"]) <= 0.25 for m in scaled) / len(scaled) if scaled else None,
                         "median_drift": statistics.median(m["drift"] for m in scaled) if scaled else None,
                         # the mean share of each source over the predictions that say it (schema 12 on)
                         "sources": {s: sum(x.get(s, 0.0) for x in split) / len(split) for s in SOURCES
                                     if any(x.get(s) for x in split)} if split else {},
                         "datasheet_predicted": len(on_sheets),
                         "datasheet_median_abs_error": statistics.median(abs(e) for e in on_sheets) if on_sheets else None,
                         "datasheet_median_error": statistics.median(on_sheets) if on_sheets else None})
    return out_rows
