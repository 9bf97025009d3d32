"""Figures for one measured window, derived from a sampler's result.

Only samples inside [start, end] of the window count. They cover the window when the first lies
within one interval after its start and the last within one interval before its end (give or take
COVERAGE_SLACK of an interval: a sample is taken when the sampler wakes, a little after its tick).
Energy is the mean power over the sampled span times the window's length: the span falls short of
the window by about one interval at most at each edge, and power there is taken to be the span's
mean.

The mean power over the span comes from an energy counter where the device has one (a difference
of two readings, "counter"), else from the time integral of sampled power (trapezoidal,
"integrated_power"). Energy is the measured device's: the GPUs' for a run that asked for GPUs, the
CPU packages' (plus DRAM where readable) through RAPL for a run that asked for none.

Every figure that cannot be derived is None and `missing[figure]` says why: never a silent zero.
Memory figures (`_mb`) are in MiB (2**20 bytes), as nvidia-smi counts them.
"""

from __future__ import annotations

import numpy as np

MIB = 2**20
COVERAGE_SLACK = 0.25
_FIGURES = ("energy_j", "avg_power_w", "energy_per_iter_j", "joules_per_sample",
            "samples_per_joule", "mean_sm_clock_mhz", "throttled_pct", "peak_temp_c", "peak_gpu_mem_mb",
            "mean_cpu_util_pct", "mean_steal_pct", "peak_rss_mb", "cpu_package_energy_j", "cpu_dram_energy_j")
_GPU_FIGURES = ("energy_j", "avg_power_w", "mean_sm_clock_mhz", "throttled_pct",
                "peak_temp_c", "peak_gpu_mem_mb")
# numpy 2 renamed trapz to trapezoid (and later removed trapz); pyproject allows numpy >= 1.24
_trapezoid = getattr(np, "trapezoid", None) or np.trapz


class _Window:
    """The window, and the sample rows that fall inside it."""

    def __init__(self, t_ns: list[int], window_ns: tuple[int, int], interval_s: float):
        self.start, self.end = (int(w) for w in window_ns)
        self.seconds = (self.end - self.start) / 1e9
        self.interval_s = interval_s
        t = np.asarray(t_ns, dtype=np.int64)
        self.inside = (t >= self.start) & (t <= self.end)
        self.t_s = (t - self.start) / 1e9  # seconds from the window's start: small numbers, full precision

    def valid(self, column: list | None) -> tuple[np.ndarray, np.ndarray]:
        """(seconds from start, values) of the samples inside the window that have a value."""
        if column is None:
            return np.empty(0), np.empty(0)
        values = np.array([np.nan if v is None else v for v in column], dtype=float)
        keep = self.inside & ~np.isnan(values)
        return self.t_s[keep], values[keep]

    def covers(self, t_s: np.ndarray) -> bool:
        interval = self.interval_s * (1 + COVERAGE_SLACK)
        return bool(t_s.size and t_s[0] <= interval and t_s[-1] >= self.seconds - interval)

    def rows(self, before_ns: int | None = None) -> np.ndarray:
        """Indices of the samples inside the window (and before `before_ns`)."""
        keep = self.inside.copy()
        if before_ns is not None:
            keep &= self.t_s < (before_ns - self.start) / 1e9
        return np.flatnonzero(keep)


def _window_energy_j(window: _Window, t_s: np.ndarray, span_energy_j: float) -> float:
    """Energy over the sampled span, scaled to the whole window at the span's mean power."""
    return float(span_energy_j / (t_s[-1] - t_s[0]) * window.seconds)


def _counter_energy_j(window: _Window, t_s: np.ndarray, counter_j: np.ndarray, wrap_j: float | None = None) -> float:
    steps = np.diff(counter_j)
    if wrap_j is not None:  # the counter went past its range and restarted from zero
        steps = np.where(steps < 0, steps + wrap_j, steps)
    return _window_energy_j(window, t_s, steps.sum())


def _enough(t_s: np.ndarray) -> bool:
    return t_s.size >= 2 and t_s[-1] > t_s[0]


def _gpu_energy(window: _Window, series: dict, unsupported: dict) -> tuple:
    """(energy_j, method, why not) for one GPU: its counter, else its integrated power."""
    t_s, mj = window.valid(series.get("energy_mj"))
    if _enough(t_s):
        return _counter_energy_j(window, t_s, mj / 1000), "counter", None
    too_few = "fewer than 2 readings in the window"
    why = [f"energy counter: {unsupported.get('nvmlDeviceGetTotalEnergyConsumption') or too_few}"]
    # the instant field where the driver has it: GetPowerUsage is a 1 s average on recent GPUs
    for column, query in (("power_instant_w", "NVML_FI_DEV_POWER_INSTANT"), ("power_w", "nvmlDeviceGetPowerUsage")):
        t_s, watts = window.valid(series.get(column))
        if _enough(t_s):
            return _window_energy_j(window, t_s, _trapezoid(watts, t_s)), "integrated_power", None
        why.append(f"{column}: {unsupported.get(query) or too_few}")
    return None, "unavailable", "; ".join(why)


def _throttled_pct(masks: np.ndarray, bits: dict[str, int]) -> dict[str, float]:
    """Share of samples (%) with each reason active; "any" leaves out the idle bit (not a slowdown)."""
    masks = masks.astype(np.int64)
    shares = {name: float(np.mean((masks & bit) != 0) * 100) for name, bit in bits.items()}
    shares["any"] = float(np.mean((masks & ~bits.get("gpu_idle", 0)) != 0) * 100)
    return shares


def _gpu(window: _Window, gpu: dict, i: int) -> dict:
    static, series, unsupported, lost = gpu["static"][i], gpu["series"][i], gpu["unsupported"][i], gpu["lost"][i]
    out: dict = {"index": static["index"], "name": static.get("name"), **dict.fromkeys(_GPU_FIGURES), "missing": {}}
    missing = out["missing"]
    lost_ns = None if lost is None else lost["t_ns"]
    if lost is not None and lost_ns is None:
        lost_ns = window.start  # never reachable: nothing of it counts
    rows = window.rows(lost_ns)
    out["samples"] = int(rows.size)
    out["covered"] = window.covers(window.t_s[rows])
    if lost is not None and lost_ns <= window.end:
        when = ("before the window" if lost_ns <= window.start
                else f"{(lost_ns - window.start) / 1e9:.3f} s into the window")
        missing["energy_j"] = f"GPU lost {when}: {lost['reason']}"
        out["energy_method"] = "unavailable"
    else:
        out["energy_j"], out["energy_method"], why = _gpu_energy(window, series, unsupported)
        if why:
            missing["energy_j"] = why
    if out["energy_j"] is not None:
        out["avg_power_w"] = out["energy_j"] / window.seconds
    else:
        missing["avg_power_w"] = missing["energy_j"]

    def column(name: str, query: str, figure: str, reduce):
        _, values = window.valid(series.get(name))  # a lost GPU's columns are None from the loss on
        if values.size:
            out[figure] = reduce(values)
        else:
            missing[figure] = unsupported.get(query) or "no sample in the window"

    column("sm_clock_mhz", "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)", "mean_sm_clock_mhz", lambda v: float(np.mean(v)))
    column("temp_c", "nvmlDeviceGetTemperature", "peak_temp_c", lambda v: float(np.max(v)))
    column("mem_used_bytes", "nvmlDeviceGetMemoryInfo", "peak_gpu_mem_mb", lambda v: float(np.max(v) / MIB))
    column("clock_events", "nvmlDeviceGetCurrentClocksEventReasons", "throttled_pct",
           lambda v: _throttled_pct(v, gpu["clock_event_bits"]))
    return out


def _gpus_together(out: dict, gpus: list[dict], gpu: dict) -> None:
    """Top-level GPU figures: energy and power summed over GPUs, the rest from the worst GPU."""
    missing = out["missing"]
    if not gpus:
        for figure in ("energy_j", "mean_sm_clock_mhz", "throttled_pct", "peak_temp_c", "peak_gpu_mem_mb"):
            missing[figure] = gpu.get("reason") or "no GPU sampled"
        return
    lacking = [f"GPU {g['index']}: {g['missing']['energy_j']}" for g in gpus if g["energy_j"] is None]
    if lacking:
        missing["energy_j"] = "; ".join(lacking)
    else:
        out["energy_j"] = float(sum(g["energy_j"] for g in gpus))
        methods = {g["energy_method"] for g in gpus}
        out["energy_method"] = methods.pop() if len(methods) == 1 else "mixed"

    def worst(figure: str, reduce):
        values = [g[figure] for g in gpus if g[figure] is not None]
        if values:
            out[figure] = reduce(values)
        else:
            missing[figure] = "; ".join(f"GPU {g['index']}: {g['missing'][figure]}" for g in gpus)

    worst("mean_sm_clock_mhz", lambda v: float(np.mean(v)))
    worst("peak_temp_c", max)
    worst("peak_gpu_mem_mb", max)
    worst("throttled_pct", lambda v: {name: max(s[name] for s in v) for name in v[0]})


def _rapl_energy_j(window: _Window, rapl: dict, domain: str) -> tuple[float | None, str | None]:
    """Energy over the window of every RAPL zone of one kind ("package" or "dram"), summed."""
    if not rapl["available"]:
        return None, rapl["reason"]
    unreadable = [z for z in rapl["unreadable"] if z["name"] is None or z["name"].startswith(domain)]
    if unreadable:  # a sum without them would be too small
        return None, "; ".join(f"{z['zone']} ({z['name'] or 'name unreadable'}): {z['reason']}" for z in unreadable)
    zones = [d for d in rapl["domains"] if d["name"].startswith(domain)]
    if not zones:
        return None, f"no {domain} zone among {', '.join(d['zone'] for d in rapl['domains'])}"
    total = 0.0
    for zone in zones:
        t_s, uj = window.valid(rapl["series"][zone["zone"]])
        if not _enough(t_s):
            return None, f"{zone['zone']} ({zone['name']}): fewer than 2 readings in the window"
        total += _counter_energy_j(window, t_s, uj / 1e6, zone["max_energy_range_uj"] / 1e6)
    return total, None


def _cpu(out: dict, window: _Window, cpu: dict) -> None:
    missing, series = out["missing"], cpu["series"]
    rows = window.rows()
    if rows.size:
        util = np.asarray([series["util_pct_per_core"][r] for r in rows], dtype=float)
        out["mean_cpu_util_pct"] = float(util.mean())
    else:
        missing["mean_cpu_util_pct"] = "no sample in the window"
    _, steal = window.valid(series.get("steal_pct"))
    if steal.size:
        out["mean_steal_pct"] = float(steal.mean())
    else:
        missing["mean_steal_pct"] = cpu["unavailable"].get("steal_pct") or "no sample in the window"
    _, rss = window.valid(series.get("rss_bytes"))
    if rss.size:
        out["peak_rss_mb"] = float(rss.max() / MIB)
    else:
        stopped = cpu.get("rss_stopped")
        missing["peak_rss_mb"] = (cpu["unavailable"].get("rss_bytes") or (stopped and stopped["reason"])
                                  or "no sample in the window")
    for figure, domain in (("cpu_package_energy_j", "package"), ("cpu_dram_energy_j", "dram")):
        out[figure], why = _rapl_energy_j(window, cpu["rapl"], domain)
        if why:
            missing[figure] = why


def _cpu_is_the_device(out: dict) -> None:
    """A run without GPUs: its energy is the CPU packages', plus DRAM where it is readable."""
    package, dram, missing = out["cpu_package_energy_j"], out["cpu_dram_energy_j"], out["missing"]
    if package is None:
        out["energy_j"], out["energy_method"] = None, "unavailable"
        missing["energy_j"] = missing["cpu_package_energy_j"]
    else:
        out["energy_j"], out["energy_method"] = package + (dram or 0.0), "counter"
        missing.pop("energy_j", None)


def _per_work(out: dict, iterations: int, batch_size: int) -> None:
    energy, missing = out["energy_j"], out["missing"]
    if energy is None:
        for figure in ("avg_power_w", "energy_per_iter_j", "joules_per_sample", "samples_per_joule"):
            missing[figure] = missing["energy_j"]
        return
    out["avg_power_w"] = energy / out["window_s"]
    out["energy_per_iter_j"] = energy / iterations
    out["joules_per_sample"] = energy / (iterations * batch_size)
    if energy > 0:
        out["samples_per_joule"] = iterations * batch_size / energy
    else:
        missing["samples_per_joule"] = "no energy measured over the window"


def derive(result: dict, window_ns: tuple[int, int], iterations: int, batch_size: int) -> dict:
    """Figures for the window [start, end] (time.monotonic_ns) in which `iterations` steps of
    `batch_size` samples ran; see the module docstring for how each is derived."""
    start, end = window_ns
    if end <= start:
        raise ValueError(f"window end {end} is not after its start {start}")
    if iterations < 1 or batch_size < 1:
        raise ValueError(f"iterations and batch_size must be positive, got {iterations} and {batch_size}")
    out: dict = {"window_s": (end - start) / 1e9, "interval_s": result["interval_s"], "samples": 0,
                 "covered": False, "edge_gaps_s": None, "energy_source": None, "energy_method": "unavailable",
                 **dict.fromkeys(_FIGURES), "gpus": [], "missing": {}}
    if result.get("error"):
        out["missing"] = dict.fromkeys(_FIGURES, f"no telemetry: {result['error']}")
        return out
    window = _Window(result["t_ns"], window_ns, result["interval_s"])
    rows = window.rows()
    out["samples"] = int(rows.size)
    out["covered"] = window.covers(window.t_s[rows])
    if rows.size:
        out["edge_gaps_s"] = [float(window.t_s[rows[0]]), float(window.seconds - window.t_s[rows[-1]])]

    gpu = result["gpu"]
    gpus = [_gpu(window, gpu, i) for i in range(len(gpu["static"]))]
    out["gpus"] = gpus
    _gpus_together(out, gpus, gpu)
    _cpu(out, window, result["cpu"])
    # No GPU sampled (a cpu run, or a host without one): the energy is the CPU's (RAPL).
    out["energy_source"] = "cpu" if gpu["requested"] == [] or not gpu["static"] else "gpu"
    if out["energy_source"] == "cpu":
        _cpu_is_the_device(out)
    _per_work(out, iterations, batch_size)
    return out
