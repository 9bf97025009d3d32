"""How well the model predicted: each completed run's stored prediction (or one made again from a
machine profile) against its measured iteration time, and the errors summarised per suite and
framework, and per precision where runs of several were predicted (`dlbench predict --accuracy`)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from ..store.profiles import MachineProfile
from .model import FrameworkFacts
from .runtime import RunPredictor


def prediction_errors(records, recompute_with: MachineProfile | None = None,
                      frameworks: Mapping[str, FrameworkFacts] | None = None) -> list[dict]:
    """One row per completed run with a prediction: suite, framework, benchmark, batch, measured and
    predicted seconds per iteration, and the relative error (predicted / measured - 1). With
    `recompute_with`, every run is predicted again from that profile instead of the stored prediction,
    each framework with its `frameworks` facts (RunPredictor)."""
    predictor = RunPredictor(recompute_with, frameworks=frameworks) if recompute_with is not None else None
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
            predicted, profile = pred.get("iteration_s"), pred.get("profile")
        elif r.prediction is not None:
            predicted, profile = r.prediction.iteration_s, r.prediction.profile
        else:
            predicted = profile = None
        measured = r.summary.median_s
        rows.append({"run_id": r.run_id, "suite": r.suite, "framework": str(r.framework.get("name")),
                     "benchmark": r.benchmark, "batch": r.workload.batch_size, "workers": workers,
                     "precision": r.workload.precision,
                     "measured_s": measured, "predicted_s": predicted, "profile": profile,
                     "error": predicted / measured - 1 if predicted and measured else None})
    return rows


def accuracy_table_rows(rows: list[dict]) -> list[dict]:
    """Per suite and framework (then per suite, then all), and per precision over everything when
    runs of more than one precision were scored: runs, predicted runs, median |error|, share within
    25%, median signed error. A reduced precision is predicted from the kernel suite's bfloat16 or
    float16 kernels (workload.decompose), so its accuracy is that of those measurements."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["suite"], row["framework"], "all"), []).append(row)
        groups.setdefault((row["suite"], "all", "all"), []).append(row)
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
        errors = [m["error"] for m in members if m["error"] is not None]
        out_rows.append({"suite": suite, "framework": framework, "precision": precision,
                         "runs": len(members), "predicted": len(errors),
                         "median_abs_error": statistics.median(abs(e) for e in errors) if errors else None,
                         "within_25": sum(abs(e) <= 0.25 for e in errors) / len(errors) if errors else None,
                         "median_error": statistics.median(errors) if errors else None})
    return out_rows
