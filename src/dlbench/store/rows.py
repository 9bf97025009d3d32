"""Records as flat rows: the columns of `dlbench results` (and of the report's tables)."""

from __future__ import annotations

from .record import Record

COLUMNS = (
    "run_id", "started_at", "suite", "benchmark", "network", "mode", "framework", "framework_version",
    "device", "batch_size", "precision", "threads", "status", "ms_per_iter", "samples_per_s", "iqr_ms",
    "cv", "first_iter_ms", "repeats", "iterations", "params", "params_described", "flops_per_sample",
    "avg_power_w", "joules_per_sample", "mean_sm_clock_mhz", "throttled_pct", "peak_mem_mb",
    "machine", "equivalence", "reason",
)


TELEMETRY_COLUMNS = ("avg_power_w", "joules_per_sample", "mean_sm_clock_mhz", "throttled_pct", "peak_mem_mb")


def _telemetry_columns(r: Record) -> dict:
    summary = r.telemetry.get("summary") or {}
    return {c: summary.get(c) for c in TELEMETRY_COLUMNS}


def run_row(r: Record) -> dict:
    s = r.summary
    return {
        "run_id": r.run_id,
        "started_at": r.started_at.isoformat(timespec="seconds"),
        "suite": r.suite,
        "benchmark": r.benchmark,
        "network": r.network.name,
        "mode": r.workload.mode,
        "framework": r.framework.get("name"),
        "framework_version": r.framework.get("version"),
        "device": r.workload.device,
        "batch_size": r.workload.batch_size,
        "precision": r.workload.precision,
        "threads": r.settings.threads_requested,
        "status": r.status,
        "ms_per_iter": s.ms_per_iter if s else None,
        "samples_per_s": s.samples_per_s if s else None,
        "iqr_ms": s.iqr_s * 1e3 if s else None,
        "cv": s.cv if s else None,
        "first_iter_ms": s.first_iter_s * 1e3 if s and s.first_iter_s is not None else None,
        "repeats": s.repeats if s else len(r.repeats),
        "iterations": s.iterations if s else 0,
        "params": r.params,
        "params_described": r.network.params_described,
        "flops_per_sample": r.network.flops_per_sample,
        **_telemetry_columns(r),
        "machine": r.machine.get("hostname"),
        "equivalence": r.equivalence.get("status"),
        "reason": r.reason,
    }
