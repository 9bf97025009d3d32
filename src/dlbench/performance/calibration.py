"""What a machine profile is made of: ceilings from the calibration kernels, the latest kernel times of
each framework, and the all-reduce line fitted to the `comm` suite's records.

Ceilings, over every framework at hand (the machine's, not one framework's):
- peak matmul FLOP/s per dtype: the fastest square matmul of any framework;
- the smallest-operation time per framework: the median time of a copy of `dispatch_bytes`;
- copy bandwidth per working set: bytes / (time − that framework's smallest-operation time), the
  best framework's, so that bytes / bandwidth + smallest-operation time gives back the copy's time;
- each framework's element-wise bandwidth per working set, the same way from its relu, at the sizes
  where the work is at least half the relu's time (where the call dominates, the difference of two
  noisy times says nothing; the model then interpolates from the sizes it has, or uses the copy's).

All-reduce and all-to-all (communication.COSTS): for each collective, framework and worker count,
the comm records' (bytes, median time) of every size whose result was correct, fitted by linear
least squares to t = startup + per_byte · bytes with both terms non-negative
(`scipy.optimize.lsq_linear`). Sizes span 4 B to 256 MiB, so the residuals are relative (each row
divided by its time): plain least squares would fit the largest sizes only and leave the start-up,
which decides small messages, to chance. The link's α and β follow from the collective's model
(communication.AllReduceCost.link: the ring's 2(n−1) messages of M/n; AllToAllCost.link: n−1
messages of B/n). R² is that of the times themselves.
"""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np

from ..store.profiles import BandwidthPoint, CommFit, KernelTime, MachineProfile, MatmulCeiling, Yardstick
from . import yardstick
from .communication import COSTS
from .kernel_suite import KernelBenchmark, KernelPolicy
from .kernels import KernelSpec


class CalibrationError(Exception):
    pass


def calibration_specs(ceilings, support: dict) -> list[KernelSpec]:
    """The kernels `dlbench calibrate` times in each framework (suites/kernels.yaml: `ceilings`)."""
    specs = [KernelSpec.of("matmul", d, m=n, n=n, k=n) for d in ceilings.dtypes if not support.get(d)
             for n in ceilings.matmul_sizes]
    for nbytes in [ceilings.dispatch_bytes, *ceilings.copy_bytes]:
        specs.append(KernelSpec.of("copy", "float32", elements=max(1, nbytes // 8)))  # read + write, 4 B each
    for nbytes in ceilings.copy_bytes:
        specs.append(KernelSpec.of("relu", "float32", elements=max(1, nbytes // 8)))
    return specs


def ceilings(results: dict[str, list], dispatch_bytes: int):
    """(matmul_peak per dtype, copy bandwidth points, smallest-operation time per framework, each
    framework's element-wise bandwidth points) from each framework's calibration results
    (KernelResult lists)."""
    dispatch_elements = max(1, dispatch_bytes // 8)
    peak: dict[str, MatmulCeiling] = {}
    dispatch: dict[str, float] = {}
    for framework, kernels in results.items():
        for k in kernels:
            spec = KernelSpec.from_dict(k.spec)
            if k.status == "ok" and k.median_s and spec.kind == "copy" and spec["elements"] == dispatch_elements:
                dispatch[framework] = k.median_s
    best_copy: dict[int, BandwidthPoint] = {}
    elementwise: dict[str, list[BandwidthPoint]] = {}
    for framework, kernels in results.items():
        for k in kernels:
            if k.status != "ok" or not k.median_s:
                continue
            spec = KernelSpec.from_dict(k.spec)
            if spec.kind == "relu":
                net = k.median_s - dispatch.get(framework, 0.0)
                if net < k.median_s / 2:
                    continue  # mostly the call (a tf.function's is ~0.2 ms): the work is lost in its noise
                elementwise.setdefault(framework, []).append(BandwidthPoint(
                    bytes=spec.bytes, bytes_per_s=spec.bytes / net, framework=framework))
                continue
            if spec.kind == "matmul":
                rate = spec.flops / k.median_s
                if spec.dtype not in peak or rate > peak[spec.dtype].flops_per_s:
                    peak[spec.dtype] = MatmulCeiling(flops_per_s=rate, framework=framework, kernel=spec.key)
            elif spec.kind == "copy" and spec["elements"] != dispatch_elements:
                net = k.median_s - dispatch.get(framework, 0.0)
                rate = spec.bytes / max(net, k.median_s / 2)  # never credit more than half the time to dispatch
                if spec.bytes not in best_copy or rate > best_copy[spec.bytes].bytes_per_s:
                    best_copy[spec.bytes] = BandwidthPoint(bytes=spec.bytes, bytes_per_s=rate, framework=framework)
    return (peak, [best_copy[b] for b in sorted(best_copy)], dispatch,
            {fw: sorted(points, key=lambda p: p.bytes) for fw, points in elementwise.items()})


def kernel_times(latest: dict[str, dict[str, tuple[float, str, str]]]) -> dict[str, dict[str, KernelTime]]:
    """KernelStore.latest_times as the profile keeps it: (median, run id, cache) per key."""
    return {fw: {key: KernelTime(median_s=t, run_id=run_id, cache=cache) for key, (t, run_id, cache) in times.items()}
            for fw, times in latest.items()}


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """(startup_s, per_byte_s, r2) of t = startup + per_byte * bytes, relative least squares, both >= 0."""
    from scipy.optimize import lsq_linear

    pts = [(b, t) for b, t in points if t and t > 0]
    if len(pts) < 2 or len({b for b, _ in pts}) < 2:
        raise CalibrationError(f"a collective's line needs at least two message sizes with a time; got {len(pts)}")
    sizes = np.array([b for b, _ in pts], dtype=float)
    times = np.array([t for _, t in pts], dtype=float)
    a = np.column_stack([np.ones_like(sizes), sizes]) / times[:, None]
    scale = np.array([1.0, 1.0 / sizes.max()])  # columns of similar size for the solver
    solution = lsq_linear(a * scale, np.ones_like(times), bounds=(0, np.inf))
    startup, per_byte = solution.x * scale
    fitted = startup + per_byte * sizes
    ss_res = float(np.sum((times - fitted) ** 2))
    ss_tot = float(np.sum((times - times.mean()) ** 2))
    return float(startup), float(per_byte), 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0


def comm_fits(records, machine_id: str, device: str, workers: int | None = None) -> tuple[list[CommFit], list[str]]:
    """The fits of every collective of communication.COSTS (all-reduce, all-to-all) per framework and
    worker count from the store's comm records of this machine (the latest record of each
    collective, framework and worker count), and notes on what was left out."""
    latest: dict[tuple[str, int, str], object] = {}
    for r in records:  # oldest first: the latest of each wins
        comm = getattr(r, "comm", None)
        if (comm is None or comm.collective not in COSTS or r.status != "ok"
                or r.machine.get("machine_id") != machine_id or r.workload.device != device):
            continue
        if workers is not None and comm.workers != workers:
            continue
        latest[(str(r.framework.get("name")), comm.workers, comm.collective)] = r
    fits, notes = [], []
    order = list(COSTS)
    for (framework, n, collective), r in sorted(latest.items(), key=lambda kv: (*kv[0][:2], order.index(kv[0][2]))):
        points = [(float(s.bytes or s.size_bytes), s.time_s) for s in r.comm.sizes
                  if s.time_s is not None and s.correct is not False and not s.skipped]
        try:
            startup, per_byte, r2 = fit_line(points)
        except CalibrationError as e:
            notes.append(f"{framework} {collective}, {n} workers (run {r.run_id}): {e}")
            continue
        alpha, beta = COSTS[collective](n, startup, per_byte).link() if n > 1 else (0.0, 0.0)
        fits.append(CommFit(framework=framework, workers=n, collective=collective, startup_s=startup,
                            per_byte_s=per_byte, alpha_s=alpha, beta_s_per_byte=beta, r2=r2, points=len(points),
                            min_bytes=int(min(b for b, _ in points)), max_bytes=int(max(b for b, _ in points)),
                            run_ids=[r.run_id]))
    if workers is not None and not any(c == "all_reduce" for _, _, c in latest):
        notes.append(f"no all-reduce records for {workers} workers of this machine in the store: "
                     f"run `dlbench run --suite comm --workers {workers}` first")
    return fits, notes


def calibration_benchmarks(suite, suite_path, support: dict) -> tuple[KernelBenchmark, KernelBenchmark]:
    """What `dlbench calibrate` times in each framework: the kernel suite's `ceilings`, and the
    smallest operation again, timed cold as the kernels suite times kernels: what a call costs a
    framework whose code and data were evicted with the operands (model.op_time takes it off)."""
    policy = KernelPolicy(**suite.ceilings.policy.model_dump())
    bench = KernelBenchmark(suite.name, "ceilings", tuple(calibration_specs(suite.ceilings, support)), "calibrate",
                            policy, f"ceilings of {suite_path.name}")
    smallest = KernelSpec.of("copy", "float32", elements=max(1, suite.ceilings.dispatch_bytes // 8))
    cold = KernelBenchmark(suite.name, "smallest-cold", (smallest,), "calibrate",
                           policy.model_copy(update={"cache": "cold"}), "the smallest operation, timed cold")
    return bench, cold


def yardsticks(records) -> dict[str, Yardstick]:
    """Each framework's yardstick over the workers of `records` (kernel records: every worker of a
    calibration times it first): the median per kernel, and the slowest and fastest worker against it."""
    per_framework: dict[str, list[dict[str, float]]] = {}
    for r in records:
        for repeat in r.repeats:
            if repeat.get("yardstick"):
                per_framework.setdefault(str(r.framework.get("name")), []).append(repeat["yardstick"])
    out = {}
    for framework, measured in per_framework.items():
        median = yardstick.pooled(measured)
        ratios = [x for m in measured if (x := yardstick.speed_ratio(m, median)) is not None]
        if median and ratios:
            out[framework] = Yardstick(median_s=median, workers=len(measured), slowest=max(ratios),
                                       fastest=min(ratios))
    return out


def build_profile(*, machine: dict, provenance: dict, device: str, threads: int, ceiling_records: list,
                  cold_records: list, dispatch_bytes: int, latest: dict, fits: list[CommFit],
                  notes: list[str], class_probes: dict | None = None,
                  probe_runs: dict[str, list[str]] | None = None, probe_records: list | None = None) -> MachineProfile:
    """The machine profile from the ceilings' kernel records (one per framework), the cold smallest
    operation's, the latest kernel times of this machine (store.kernels.KernelStore.latest_times)
    and the all-reduce fits, each figure's sources kept; `class_probes`: each framework's class probe
    times (performance/probes.py class_probes), from the runs `probe_runs` names. The yardstick is
    that of every worker of the ceilings, the cold smallest operation and `probe_records`."""
    results = {str(r.framework.get("name")): r.kernels for r in ceiling_records if r.status == "ok"}
    peak, bandwidth, dispatch, elementwise = ceilings(results, dispatch_bytes)
    dispatch_cold = {str(r.framework.get("name")): k.median_s for r in cold_records if r.status == "ok"
                     for k in r.kernels if k.status == "ok" and k.median_s}
    return MachineProfile(
        machine_id=machine["machine_id"], created_at=datetime.now(timezone.utc), dlbench=provenance,
        machine=machine, device=device, threads=threads, matmul_peak=peak, copy_bandwidth=bandwidth,
        dispatch_s=dispatch, dispatch_cold_s=dispatch_cold, elementwise_bandwidth=elementwise,
        kernels=kernel_times(latest), comm=fits, class_probes=class_probes or {},
        yardstick=yardsticks([*ceiling_records, *cold_records, *(probe_records or [])]),
        sources={"ceilings": {str(r.framework.get("name")): {"run_id": r.run_id, "status": r.status,
                                                             "version": r.framework.get("version")}
                              for r in ceiling_records},
                 "kernels": {fw: sorted({run_id for _, run_id, _ in times.values()}) for fw, times in latest.items()},
                 "comm": [run for f in fits for run in f.run_ids],
                 **({"class_probes": probe_runs} if probe_runs else {})},
        notes=notes)
