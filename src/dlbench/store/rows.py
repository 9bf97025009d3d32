"""Records as flat rows: the columns of `dlbench results` (and of the report's tables)."""

from __future__ import annotations

from ..axes import OTHER_AXES
from .intervals import reported_interval
from .record import Record, Summary
from .utilisation import model_flops_per_iter, model_tflops, tokens_per_s

COLUMNS = (
    "run_id", "started_at", "suite", "benchmark", "network", "mode", "framework", "framework_version",
    "device", "batch_size", "precision", "compile", *(a.field for a in OTHER_AXES), "threads", "status", "ms_per_iter", "samples_per_s", "tokens_per_s", "iqr_ms",
    "cv", "ci_low_ms", "ci_high_ms", "ci_pct", "samples_per_s_low", "samples_per_s_high", "ci_level", "stability",
    "first_iter_ms", "compile_ms", "alloc_peak_mb", "repeats", "iterations", "repeat_stop", "params", "params_described", "flops_per_sample",
    "model_flops_per_iter", "model_tflops", "mfu", "mfu_reason",
    "avg_power_w", "joules_per_sample", "mean_sm_clock_mhz", "throttled_pct", "peak_mem_mb",
    "workers", "oversubscribed", "scaling_efficiency", "exposed_comm_ms", "peak_busbw_gbps",
    "scenario", "loadgen_result", "latency_p50_ms", "latency_p90_ms", "latency_p99_ms", "server_qps", "loadgen_reason",
    "prompt_tokens", "new_tokens", "ttft_ms", "ttft_p99_ms", "tpot_ms", "tpot_p99_ms",
    "time_to_target_s", "epochs_to_target", "reached", "input_bound_pct",
    "machine", "equivalence", "reason", "stability_reason",
)
LOADGEN_COLUMNS = ("scenario", "loadgen_result", "latency_p50_ms", "latency_p90_ms", "latency_p99_ms", "server_qps",
                   "loadgen_reason")


TELEMETRY_COLUMNS = ("avg_power_w", "joules_per_sample", "mean_sm_clock_mhz", "throttled_pct", "peak_mem_mb")


def _telemetry_columns(r: Record) -> dict:
    summary = r.telemetry.get("summary") or {}
    return {c: summary.get(c) for c in TELEMETRY_COLUMNS}


def _stability(s: Summary | None) -> str | None:
    if s is None or s.stability is None:
        return None  # failed runs, and records from before the check
    if s.stability.unstable:
        return "unstable"
    return "stable" if s.stability.kruskal_p is not None else "untested"


def _distributed_columns(r: Record) -> dict:
    """Multi-worker runs (schema 5): workers, efficiency against one worker, exposed communication,
    and for a collective its highest bus bandwidth over the sizes (the whole curve: `dlbench results`
    prints it under the table, the report charts it); a job whose ranks were time-sliced on too few
    cores (--oversubscribe, schema 18) says its threads and cores."""
    d = r.distributed
    scaling = d.scaling if d else None
    busbw = [s.busbw_gbps for s in r.comm.sizes if s.busbw_gbps is not None] if r.comm else []
    return {
        "workers": d.workers if d else None,
        "oversubscribed": (f"{d.oversubscribed.threads} threads/{d.oversubscribed.cores} cores"
                           if d and d.oversubscribed else None),
        "scaling_efficiency": scaling.efficiency if scaling else None,
        "exposed_comm_ms": d.exposed_comm_s * 1e3 if d and d.exposed_comm_s is not None else None,
        "peak_busbw_gbps": max(busbw) if busbw else None,
    }


def _loadgen_columns(r: Record) -> dict:
    """A LoadGen scenario run (schema 9): LoadGen's verdict, its per-sample latency percentiles (ms),
    the server's rate that met the bound, and why LoadGen called the run INVALID."""
    info = r.loadgen
    if info is None:
        return {c: None for c in LOADGEN_COLUMNS} | {"scenario": r.workload.scenario}
    latency = info.result.latency_ns
    return {
        "scenario": info.scenario,
        "loadgen_result": info.result.validity,
        **{f"latency_p{p}_ms": latency[f"{p}.00"] / 1e6 if f"{p}.00" in latency else None for p in (50, 90, 99)},
        "server_qps": info.metric_value if info.scenario == "server" else None,
        "loadgen_reason": "; ".join(info.result.invalid_reasons) or None,
    }


def _generation_columns(r: Record) -> dict:
    """Mode generate (schema 10): the request's shape and the medians and 99th percentiles of time to
    first token and time per output token, in ms; for generation's LoadGen server (schema 13),
    LoadGen's own percentiles of the chosen test."""
    g = r.generation
    info = r.loadgen
    if g is None and info is not None and info.generation:
        ttft, tpot = info.result.ttft_ns, info.result.tpot_ns

        def pct_ms(values, p):
            return values[p] / 1e6 if p in values else None

        return {"prompt_tokens": info.generation.get("prompt_length"), "new_tokens": info.generation.get("new_tokens"),
                "ttft_ms": pct_ms(ttft, "50.00"), "ttft_p99_ms": pct_ms(ttft, "99.00"),
                "tpot_ms": pct_ms(tpot, "50.00"), "tpot_p99_ms": pct_ms(tpot, "99.00")}

    def ms(dist, key):
        return getattr(dist, key) * 1e3 if dist is not None else None

    return {
        "prompt_tokens": g.prompt_length if g else None,
        "new_tokens": g.new_tokens if g else None,
        "ttft_ms": ms(g.ttft, "median") if g else None,
        "ttft_p99_ms": ms(g.ttft, "p99") if g else None,
        "tpot_ms": ms(g.tpot, "median") if g else None,
        "tpot_p99_ms": ms(g.tpot, "p99") if g else None,
    }


def run_tokens_per_s(r: Record, samples_per_s: float | None) -> float | None:
    """Tokens per second: generated tokens (batch x new tokens per median request) for a generate
    run, else samples/s x sequence length of a token network (utilisation.tokens_per_s)."""
    if r.generation is not None:
        return samples_per_s * r.generation.new_tokens if samples_per_s is not None else None
    if r.loadgen is not None and r.loadgen.generation:
        return r.loadgen.result.tokens_per_s  # LoadGen's completed tokens/s
    return tokens_per_s(r.network.definition, samples_per_s)


def _convergence_columns(r: Record) -> dict:
    """Time to accuracy (schema 11): the score (MLPerf's olympic mean), mean epochs of the scored
    runs, runs that reached the target of all, and the mean input-bound share in percent."""
    c = r.convergence
    return {
        "time_to_target_s": c.score_s if c else None,
        "epochs_to_target": c.epochs_to_target if c else None,
        "reached": f"{c.reached}/{len(c.runs)}" if c else None,
        "input_bound_pct": c.input_bound_share * 100 if c and c.input_bound_share is not None else None,
    }


def allocator_peak_mb(r: Record) -> float | None:
    """The framework allocator's peak device memory, highest over the repeats (MB, 1e6 bytes);
    None where no repeat's runner could read one (on the CPU most cannot: Repeat.memory says why)."""
    peaks = [m["peak_allocated_bytes"] for rep in r.repeats if (m := rep.memory) and m.get("peak_allocated_bytes") is not None]
    return max(peaks) / 1e6 if peaks else None


def run_row(r: Record) -> dict:
    """The row of one record. `mfu` and `mfu_reason` are left empty here: they depend on the machine
    profiles in the store, not on the record alone (utilisation.Peaks.attach fills them as rows are
    read, so the row index never caches them)."""
    s = r.summary
    ci = reported_interval(s, r.workload.batch_size)
    # a LoadGen run has no summary: its throughput is LoadGen's (store/loadgen.py: THROUGHPUT_KEYS)
    samples_per_s = s.samples_per_s if s else r.loadgen.result.samples_per_s if r.loadgen else None
    flops_per_iter = model_flops_per_iter(r.workload.mode, r.workload.batch_size, r.network.flops_per_sample)
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
        "compile": r.workload.compile,
        **{a.field: getattr(r.workload, a.field) for a in OTHER_AXES},
        "threads": r.settings.threads_requested,
        "status": r.status,
        "ms_per_iter": s.ms_per_iter if s else None,
        "samples_per_s": samples_per_s,
        "tokens_per_s": run_tokens_per_s(r, samples_per_s),
        "iqr_ms": s.iqr_s * 1e3 if s else None,
        "cv": s.cv if s else None,
        # the interval of the median as reported (intervals.py: how, and why it is derived on read)
        "ci_low_ms": ci.median_s[0] * 1e3 if ci else None,
        "ci_high_ms": ci.median_s[1] * 1e3 if ci else None,
        "ci_pct": ci.half_width_pct if ci else None,
        "samples_per_s_low": ci.samples_per_s[0] if ci else None,
        "samples_per_s_high": ci.samples_per_s[1] if ci else None,
        "ci_level": ci.level if ci else None,
        "stability": _stability(s),
        "first_iter_ms": s.first_iter_s * 1e3 if s and s.first_iter_s is not None else None,
        "compile_ms": s.compile_s * 1e3 if s and s.compile_s is not None else None,
        "alloc_peak_mb": allocator_peak_mb(r),
        "repeats": s.repeats if s else len(r.repeats),
        "iterations": s.iterations if s else 0,
        "repeat_stop": r.repeat_policy.stopped if r.repeat_policy else None,
        "params": r.params,
        "params_described": r.network.params_described,
        "flops_per_sample": r.network.flops_per_sample,
        # forward x 3 for training, x 1 for inference (utilisation.py); TFLOP/s over the median iteration
        "model_flops_per_iter": flops_per_iter,
        "model_tflops": model_tflops(flops_per_iter, s.median_s if s else None),
        "mfu": None,
        "mfu_reason": None,
        **_telemetry_columns(r),
        **_distributed_columns(r),
        **_loadgen_columns(r),
        **_generation_columns(r),
        **_convergence_columns(r),
        "machine": r.machine.get("hostname"),
        "equivalence": r.equivalence.get("status"),
        "reason": r.reason,
        "stability_reason": s.stability.reason if s and s.stability else None,
    }
