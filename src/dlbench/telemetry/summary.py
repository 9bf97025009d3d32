"""One run's telemetry figures from its repeats' (each repeat is its own measured window)."""

from __future__ import annotations

import numpy as np

MIB = 1024 * 1024


def _values(derived: list[dict], key: str) -> list:
    return [d[key] for d in derived if d.get(key) is not None]


def summarise_repeats(derived: list[dict], batch_size: int, iterations: list[int]) -> dict:
    """Energy figures over every measured window of the run; None (with a reason) where any repeat
    lacks them, because a partial sum would understate the energy."""
    out: dict = {"repeats": len(derived), "covered": bool(derived) and all(d["covered"] for d in derived),
                 "samples": sum(d["samples"] for d in derived), "missing": {}}
    windows = np.array([d["window_s"] for d in derived], dtype=float)
    energies = [d.get("energy_j") for d in derived]
    if derived and all(e is not None for e in energies):
        total = float(sum(energies))
        samples = batch_size * sum(iterations)
        out.update(energy_j=total, energy_method=",".join(sorted({d["energy_method"] for d in derived})),
                   avg_power_w=total / float(windows.sum()), joules_per_sample=total / samples,
                   samples_per_joule=samples / total if total > 0 else None)
    else:
        reason = next((d["missing"].get("energy_j") for d in derived if d.get("energy_j") is None), "no repeat")
        for key in ("energy_j", "energy_method", "avg_power_w", "joules_per_sample", "samples_per_joule"):
            out[key] = None
            out["missing"][key] = reason
    clocks = [(d["mean_sm_clock_mhz"], d["window_s"]) for d in derived if d.get("mean_sm_clock_mhz") is not None]
    out["mean_sm_clock_mhz"] = (float(np.average([c for c, _ in clocks], weights=[w for _, w in clocks]))
                                if len(clocks) == len(derived) and clocks else None)
    throttled = [((d.get("throttled_pct") or {}).get("any"), d["window_s"]) for d in derived]
    out["throttled_pct"] = (float(np.average([t for t, _ in throttled], weights=[w for _, w in throttled]))
                            if derived and all(t is not None for t, _ in throttled) else None)
    temps = _values(derived, "peak_temp_c")
    out["peak_temp_c"] = max(temps) if temps else None
    gpu_mem, rss = _values(derived, "peak_gpu_mem_mb"), _values(derived, "peak_rss_mb")
    out["peak_gpu_mem_mb"] = max(gpu_mem) if gpu_mem else None
    out["peak_rss_mb"] = max(rss) if rss else None
    # The memory that limits the batch: the GPU's on a GPU run, the worker's resident set otherwise.
    out["peak_mem_mb"] = out["peak_gpu_mem_mb"] if gpu_mem else out["peak_rss_mb"]
    cpu = _values(derived, "mean_cpu_util_pct")
    out["mean_cpu_util_pct"] = float(np.mean(cpu)) if cpu else None
    steal = _values(derived, "mean_steal_pct")
    out["mean_steal_pct"] = float(np.mean(steal)) if steal else None
    # Where a figure is missing, say why with the first repeat's reason for its source figure.
    for key, source in (("mean_sm_clock_mhz", "mean_sm_clock_mhz"), ("throttled_pct", "throttled_pct"),
                        ("peak_temp_c", "peak_temp_c"), ("peak_mem_mb", "peak_rss_mb")):
        if out[key] is None:
            out["missing"][key] = next((d["missing"][source] for d in derived if d["missing"].get(source)),
                                       "not measured")
    return out
