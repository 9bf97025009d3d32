"""The yardstick (performance/yardstick.py): what a worker times before its work, how several workers'
times pool, the speed ratio of a run against a profile, and predictions scored at the run's speed."""

from __future__ import annotations

import math

import pytest
from store_records import make_record

from dlbench.performance import yardstick
from dlbench.performance.accuracy import accuracy_table_rows, prediction_errors
from dlbench.performance.calibration import yardsticks
from dlbench.store.kernels import KernelRecord
from dlbench.store.profiles import Yardstick
from dlbench.store.record import Prediction

MATMUL, RELU = (spec.key for spec in yardstick.YARDSTICK)


def test_the_speed_ratio_is_the_geometric_mean_over_the_kernels_both_timed():
    base = {MATMUL: 0.002, RELU: 0.004}
    assert yardstick.speed_ratio({MATMUL: 0.004, RELU: 0.004}, base) == pytest.approx(math.sqrt(2))
    assert yardstick.speed_ratio({MATMUL: 0.003}, base) == pytest.approx(1.5)  # the relu failed in the run
    assert yardstick.speed_ratio({"other": 1.0}, base) is None
    assert yardstick.speed_ratio(None, base) is None and yardstick.speed_ratio(base, {}) is None


def test_times_keep_the_ok_entries_and_pooled_takes_the_median_per_kernel():
    entries = [{"spec": spec.to_dict(), "status": "ok", "median_s": t} for spec, t in zip(yardstick.YARDSTICK, (1.0, 2.0))]
    entries[1] = dict(entries[1], status="failed", median_s=None)
    assert yardstick.times(entries) == {MATMUL: 1.0}
    assert yardstick.times([entries[1]]) is None and yardstick.times(None) is None
    assert yardstick.pooled([{MATMUL: 1.0}, {MATMUL: 3.0, RELU: 2.0}, None, {MATMUL: 2.0}]) == {MATMUL: 2.0, RELU: 2.0}
    assert yardstick.pooled([None]) is None


def test_the_request_part_is_plain_data_with_a_warm_policy():
    req = yardstick.request()
    assert [k["kind"] for k in req["kernels"]] == ["matmul", "relu"]
    assert req["policy"]["flush_bytes"] == 0 and req["policy"]["min_iters"] >= 5


def test_a_worker_times_the_yardstick_first_and_a_framework_that_cannot_still_runs_its_work():
    from runners.common import harness
    order = []

    class Kernel:
        def __init__(self, spec):
            self.spec = spec

        def step(self):
            order.append(self.spec["kind"])

        def synchronize(self):
            pass

    class Prepared:
        params, output_shape, settings = 1, (1,), {}

        def step(self):
            order.append("step")

        def synchronize(self):
            pass

    class Runner:
        name = "fakefw"

        def __init__(self, refuse_relu=False):
            self.refuse_relu = refuse_relu

        def configure_threads(self, n):
            return {}

        def framework_info(self, device):
            return {"name": "fakefw"}

        def device_available(self, device):
            return None

        def prepare_kernel(self, spec, device):
            if self.refuse_relu and spec["kind"] == "relu":
                raise RuntimeError("no relu here")
            return Kernel(spec)

        def prepare(self, request):
            order.append("prepare")
            return Prepared()

    policy = {"warmup": {"window": 2, "tolerance": 0.5, "min_iters": 1, "max_iters": 2, "max_time_s": 1},
              "measure": {"min_iters": 2, "min_time_s": 0, "max_iters": 2}}
    request = {"protocol": harness.PROTOCOL_VERSION, "action": "benchmark", "device": "cpu", "threads": 1,
               "policy": policy, "yardstick": yardstick.request()}
    res = harness.run_request(Runner(), request)
    assert res["status"] == "ok" and order.index("prepare") > order.index("relu") > order.index("matmul") == 0
    assert yardstick.times(res["yardstick"]).keys() == {MATMUL, RELU}
    order.clear()
    res = harness.run_request(Runner(refuse_relu=True), request)
    assert res["status"] == "ok" and len(res["iter_s"]) == 2
    assert yardstick.times(res["yardstick"]) == {MATMUL: pytest.approx(res["yardstick"][0]["median_s"])}
    assert res["yardstick"][1]["status"] == "failed" and "no relu here" in res["yardstick"][1]["reason"]
    del request["yardstick"]
    order.clear()
    assert harness.run_request(Runner(), request)["status"] == "ok" and "matmul" not in order  # not asked: not timed


def kernel_record(framework: str, sticks: list[dict | None]) -> KernelRecord:
    from datetime import datetime, timezone

    now = datetime(2026, 12, 3, tzinfo=timezone.utc)
    return KernelRecord(run_id=f"k-{framework}-{len(sticks)}", started_at=now, ended_at=now, dlbench={}, suite="kernels",
                        benchmark="ceilings", source="calibrate", profile="default", device="cpu",
                        framework={"name": framework}, environment={}, machine={}, threads_requested=1,
                        timeout_s=60, policy={}, status="ok",
                        repeats=[{"index": i, "status": "ok", **({"yardstick": s} if s else {})}
                                 for i, s in enumerate(sticks)])


def test_a_profile_keeps_each_frameworks_yardstick_and_how_far_it_moved_during_calibration():
    records = [kernel_record("torch", [{MATMUL: 1.0, RELU: 1.0}, {MATMUL: 2.0, RELU: 2.0}]),
               kernel_record("torch", [{MATMUL: 1.5, RELU: 1.5}]), kernel_record("jax", [None])]
    found = yardsticks(records)
    assert set(found) == {"torch"}  # jax's workers timed none
    torch = found["torch"]
    assert torch.median_s == {MATMUL: 1.5, RELU: 1.5} and torch.workers == 3
    assert torch.slowest == pytest.approx(2.0 / 1.5) and torch.fastest == pytest.approx(1.0 / 1.5)


def test_predictions_are_scored_at_the_speed_of_the_machine_when_the_run_ran():
    run = make_record(framework="torch")
    for rep in run.repeats:
        rep.yardstick = {MATMUL: 0.004, RELU: 0.002}  # twice the profile's times: the machine ran at half speed
    run.prediction = Prediction(model_version=1, profile="p@1", iteration_s=run.summary.median_s / 2)
    other = make_record(framework="jax")  # no yardstick in its repeats: a record before schema 14
    other.prediction = Prediction(model_version=1, profile="p@1", iteration_s=other.summary.median_s)
    base = {"torch": Yardstick(median_s={MATMUL: 0.002, RELU: 0.001}, workers=4, slowest=1.1, fastest=0.9),
            "jax": Yardstick(median_s={MATMUL: 0.002, RELU: 0.001}, workers=4, slowest=1.1, fastest=0.9)}
    rows = {r["framework"]: r for r in prediction_errors([run, other], yardsticks={"p@1": base})}
    assert rows["torch"]["error"] == pytest.approx(-0.5)
    assert rows["torch"]["speed_ratio"] == pytest.approx(2.0) and rows["torch"]["scaled_error"] == pytest.approx(0.0)
    assert rows["jax"]["speed_ratio"] is None and rows["jax"]["scaled_error"] is None
    assert prediction_errors([run])[0]["scaled_error"] is None  # the profile's yardstick unknown: raw only
    groups = {(g["suite"], g["framework"]): g for g in accuracy_table_rows(list(rows.values()))}
    assert groups[("fcn", "torch")]["scaled"] == 1 and groups[("fcn", "torch")]["scaled_median_abs_error"] == 0
    assert groups[("fcn", "torch")]["median_drift"] == pytest.approx(2.0)
    assert groups[("fcn", "all")]["scaled"] == 1 and groups[("fcn", "jax")]["scaled_median_abs_error"] is None


def test_a_run_is_scaled_by_the_median_of_its_own_and_its_neighbours_speed_ratios():
    """One burst in one worker's yardstick is voted down by the runs beside it; a machine that stays
    slower is followed; a run 20 minutes away is another period and votes on nothing."""
    from datetime import timedelta

    from store_records import T0

    base = {"torch": Yardstick(median_s={MATMUL: 0.002, RELU: 0.001}, workers=4, slowest=1.1, fastest=0.9)}
    ratios, starts = [1.0, 1.5, 1.0, 2.0, 2.0, 1.0], [0, 60, 120, 180, 240, 240 + 21 * 60]
    runs = []
    for ratio, offset in zip(ratios, starts):
        run = make_record(framework="torch", started=T0 + timedelta(seconds=offset))
        for rep in run.repeats:
            rep.yardstick = {MATMUL: 0.002 * ratio, RELU: 0.001 * ratio}
        run.prediction = Prediction(model_version=1, profile="p@1", iteration_s=run.summary.median_s)
        runs.append(run)
    rows = prediction_errors(list(reversed(runs)), yardsticks={"p@1": base})  # in any order
    by_start = sorted(rows, key=lambda r: r["started_at"])
    assert [r["speed_ratio"] for r in by_start] == pytest.approx(ratios)
    # the burst (1.5) between two 1.0s is voted down; the step to 2.0 is followed from its 2nd run;
    # the last run, 21 minutes after its neighbour, has only itself
    assert [r["drift"] for r in by_start] == pytest.approx([1.25, 1.0, 1.5, 2.0, 2.0, 1.0])
    assert all(r["scaled_error"] == pytest.approx(r["drift"] - 1) for r in by_start)  # predicted = measured
