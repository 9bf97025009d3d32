"""The yardstick: two fixed kernels every worker times before its own work, so that how fast the machine
was at that moment is on record beside what it measured.

A shared machine (a cloud VM with other tenants, a laptop that throttles) does not run at one speed:
the same benchmark can take 1.2-1.5x as long an hour later, every kernel slower together. A machine
profile measured in a fast hour then over-predicts nothing and under-predicts everything in a slow
one, and its accuracy says more about the hour than about the model. So every worker of `dlbench
run` (action benchmark) and of the kernels it times (the kernels suite, `dlbench calibrate`) first
times the yardstick in the framework it runs, with the framework's own kernels: a float32
512 x 512 x 512 matrix product (compute: the core's speed, steal time, clocks) and a relu over
16 MiB (memory: bandwidth shared with other tenants). A record keeps each repeat's yardstick times
(`Repeat.yardstick`, record schema 14; a kernel record's `repeats[].yardstick`), a profile each
framework's yardstick over the calibration's workers (`MachineProfile.yardstick`, format 3).

`speed_ratio` of a run against a profile is the geometric mean over the two kernels of the run's
time over the profile's: 1.3 says the machine ran the same kernels 1.3x as long as when it was
calibrated. `dlbench predict --accuracy` scores each prediction raw and scaled by that ratio; the
scaled error is the model's, the gap between the two is the machine's drift. The yardstick is timed
warm, with the calls of each kernel between two synchronisations as every kernel is timed
(runners/common/harness.py), in well under a second per worker.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping

from .kernels import KernelSpec

YARDSTICK = (KernelSpec.of("matmul", "float32", m=512, n=512, k=512),
             KernelSpec.of("relu", "float32", elements=4 << 20))
# a warm policy of its own: a profile's smoke policy must not change what the yardstick is
POLICY = {"warmup_iters": 2, "min_iters": 5, "min_time_s": 0.03, "max_iters": 200, "flush_bytes": 0}


def request() -> dict:
    """The request's `yardstick` part: the kernels and how the worker times them."""
    return {"kernels": [spec.to_dict() for spec in YARDSTICK], "policy": dict(POLICY)}


def times(entries: Iterable[dict] | None) -> dict[str, float] | None:
    """The worker's yardstick entries (harness.measure_kernels' form) as kernel key -> median seconds,
    the ok ones only; None when none was timed."""
    out = {}
    for entry in entries or []:
        if entry.get("status") == "ok" and entry.get("median_s"):
            out[KernelSpec.from_dict(entry["spec"]).key] = float(entry["median_s"])
    return out or None


def pooled(measurements: Iterable[Mapping[str, float] | None]) -> dict[str, float] | None:
    """Several workers' yardstick times as one: the median per kernel."""
    per_key: dict[str, list[float]] = {}
    for m in measurements:
        for key, seconds in (m or {}).items():
            per_key.setdefault(key, []).append(seconds)
    return {key: statistics.median(v) for key, v in per_key.items()} or None


def speed_ratio(measured: Mapping[str, float] | None, base: Mapping[str, float] | None) -> float | None:
    """How much longer the machine took for the yardstick in `measured` than in `base`: the geometric
    mean of the time ratios of the kernels both timed; None when they share none."""
    shared = [key for key in (measured or {}) if key in (base or {}) and measured[key] > 0 and base[key] > 0]
    if not shared:
        return None
    return math.exp(sum(math.log(measured[key] / base[key]) for key in shared) / len(shared))
