"""Checks on the records of a GPU run (scripts/gpu-check.sh): every run ok on cuda, NVML telemetry
present with power > 0 and SM clock > 0, and where the GPU has an energy counter, the counter's
energy and the integral of sampled power agree within 5% over each measured window; and every
attention network's run on CUDA in half precision got a fused attention kernel (not torch's math
path of separate products), the kernel printed per run."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from dlbench.store.store import Store


def integrated_vs_counter(rep) -> tuple[float, float] | None:
    t = np.asarray(rep.telemetry["t_ns"], dtype=float)
    series = rep.telemetry["gpu"]["series"][0]
    power = series.get("power_instant_w") or series.get("power_w")
    energy = series.get("energy_mj")
    if not power or not energy:
        return None
    start, end = rep.window_monotonic_ns
    inside = (t >= start) & (t <= end)
    ok = inside & np.array([p is not None and e is not None for p, e in zip(power, energy)])
    if ok.sum() < 3:
        return None
    ts = t[ok] / 1e9
    integrated = float(np.trapezoid(np.asarray(power, dtype=float)[ok], ts))
    counter = float((np.asarray(energy, dtype=float)[ok][-1] - np.asarray(energy, dtype=float)[ok][0]) / 1e3)
    return integrated, counter


def main(store_dir: str) -> int:
    problems, lines = [], []
    for r in Store(Path(store_dir)).records():
        name = f"{r.framework.get('name')} {r.benchmark} b={r.workload.batch_size}"
        if r.status != "ok" or r.workload.device != "cuda":
            problems.append(f"{name}: {r.status} on {r.workload.device}: {r.reason}")
            continue
        s = (r.telemetry.get("summary") or {})
        gpu = r.telemetry.get("gpu") or {}
        if not gpu.get("available"):
            problems.append(f"{name}: GPU telemetry unavailable: {gpu.get('reason')}")
            continue
        if not (s.get("avg_power_w") or 0) > 0 or not (s.get("mean_sm_clock_mhz") or 0) > 0:
            problems.append(f"{name}: power {s.get('avg_power_w')} W, SM clock {s.get('mean_sm_clock_mhz')} MHz")
        for rep in r.repeats:
            pair = integrated_vs_counter(rep)
            if pair is None:
                continue
            integrated, counter = pair
            gap = abs(integrated - counter) / max(counter, 1e-9)
            lines.append(f"{name} repeat {rep.index}: counter {counter:.2f} J, integrated {integrated:.2f} J, "
                         f"gap {100 * gap:.1f}%")
            if gap > 0.05:
                problems.append(lines[-1])
        attention = r.settings.runner.get("attention")
        if attention:
            kernel = attention.get("kernel")
            half = r.workload.precision in ("amp_bf16", "amp_fp16")
            kernels = set(kernel.values()) if isinstance(kernel, dict) else {kernel}
            print(f"{name}: attention {attention.get('function')} -> {kernel}")
            # torch's math backend is its unfused fallback; JAX's "xla" is XLA's own fusion, which is
            # what flax's attention gets with dropout on the probabilities (cuDNN's takes none)
            if half and any(k is None or k == "math" or str(k).startswith("unknown") for k in kernels):
                problems.append(f"{name}: attention in {r.workload.precision} ran {kernel}, not a fused kernel")
        print(f"{name}: {r.summary.samples_per_s:.1f} samples/s, {s.get('avg_power_w')} W, "
              f"{s.get('joules_per_sample')} J/sample, SM {s.get('mean_sm_clock_mhz')} MHz, "
              f"throttled {s.get('throttled_pct')}%, peak {s.get('peak_mem_mb')} MiB, method {s.get('energy_method')}")
    print("\n".join(lines))
    for p in problems:
        print("PROBLEM:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
