"""Scoring predictions against runs, and the predictor `dlbench run` hands the orchestrators."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from store_records import make_record

from dlbench.definitions.loader import load_network
from dlbench.performance.accuracy import accuracy_table_rows, prediction_errors
from dlbench.performance.runtime import RunPredictor, run_predictor
from dlbench.store.profiles import BandwidthPoint, CommFit, MachineProfile, MatmulCeiling, ProfileStore
from dlbench.store.record import DistributedInfo, Prediction
from dlbench.store.store import Store

NETWORKS = Path(__file__).resolve().parents[2] / "suites" / "networks"


def profile(threads=2, device="cpu", comm=()) -> MachineProfile:
    return MachineProfile(machine_id="m" * 64, created_at=datetime(2026, 12, 1, tzinfo=timezone.utc), dlbench={},
                          machine={"hostname": "box"}, device=device, threads=threads,
                          matmul_peak={"float32": MatmulCeiling(flops_per_s=1e11, framework="torch", kernel="k")},
                          copy_bandwidth=[BandwidthPoint(bytes=1 << 20, bytes_per_s=1e10, framework="torch")],
                          comm=list(comm))


def predicted(record, seconds):
    record.prediction = Prediction(model_version=1, profile="p@1", iteration_s=seconds)
    return record


def test_errors_per_suite_and_framework():
    # make_record's iterations: repeat i measures 0.01 (i + 1) + 0.001 k: medians pooled over 3 repeats
    runs = [predicted(make_record(framework="torch"), 0.02), predicted(make_record(framework="jax"), 0.03),
            make_record(framework="jax"), make_record(framework="jax", status="failed")]
    measured = runs[0].summary.median_s
    rows = prediction_errors(runs)
    assert len(rows) == 3  # a failed run has no measured time to score
    assert rows[0]["error"] == pytest.approx(0.02 / measured - 1)
    assert rows[2]["predicted_s"] is None and rows[2]["error"] is None
    groups = {(g["suite"], g["framework"]): g for g in accuracy_table_rows(rows)}
    assert {g["precision"] for g in accuracy_table_rows(rows)} == {"all"}  # one precision: no per-precision rows
    assert groups[("fcn", "jax")]["runs"] == 2 and groups[("fcn", "jax")]["predicted"] == 1
    assert groups[("fcn", "jax")]["median_abs_error"] == pytest.approx(abs(0.03 / measured - 1))
    both = groups[("fcn", "all")]
    assert both["median_abs_error"] == pytest.approx((abs(0.02 / measured - 1) + abs(0.03 / measured - 1)) / 2)
    assert both["within_25"] == sum(abs(e) <= 0.25 for e in (0.02 / measured - 1, 0.03 / measured - 1)) / 2
    assert list(groups)[-1] == ("all", "all")


def test_recomputed_predictions_use_the_per_worker_batch():
    fcn5 = load_network(NETWORKS / "fcn5.yaml")
    single = make_record(batch_size=64)
    single.network = single.network.model_copy(update={"definition": fcn5.resolved})
    double = make_record(batch_size=64)
    double.network = single.network
    double.suite = "distributed"
    double.distributed = DistributedInfo(workers=2, hosts=["h"], placement="local", launch="ranks",
                                         threads_per_worker=1, per_worker_batch=32, global_batch=64)
    fit = CommFit(framework="torch", workers=2, startup_s=1e-4, per_byte_s=1e-9, alpha_s=5e-5, beta_s_per_byte=1e-9,
                  r2=1.0, points=4, min_bytes=4, max_bytes=1 << 20, run_ids=["c"])
    rows = prediction_errors([single, double], recompute_with=profile(comm=[fit]))
    one = RunPredictor(profile())(network=fcn5.resolved, batch=64, mode="train", precision="fp32",
                                  framework="torch")
    assert rows[0]["predicted_s"] == pytest.approx(one["iteration_s"])
    two = RunPredictor(profile(comm=[fit]))(network=fcn5.resolved, batch=32, mode="train", precision="fp32",
                                            framework="torch", workers=2)
    assert rows[1]["predicted_s"] == pytest.approx(two["iteration_s"]) and rows[1]["workers"] == 2
    assert two["phases"]["communication"] > 0 and two["schedule"] == "mgwfbp"


def test_a_run_the_profile_cannot_predict_says_why():
    fcn5 = load_network(NETWORKS / "fcn5.yaml")
    out = RunPredictor(profile())(network=fcn5.resolved, batch=8, mode="train", precision="fp32",
                                  framework="torch", workers=4)
    assert out.get("iteration_s") is None
    assert "no all-reduce fit" in out["error"]
    Prediction.model_validate(out)  # what the record keeps


def test_run_prefers_the_profile_of_its_thread_count(tmp_path):
    store = Store(tmp_path)
    assert run_predictor(store, "m" * 64, "cpu", 2, {})[0] is None
    profiles = ProfileStore(store)
    profiles.write(profile(threads=1))
    profiles.write(profile(threads=2))
    profiles.write(profile(threads=2, device="cuda"))
    predictor, said = run_predictor(store, "m" * 64, "cpu", 1, {})
    assert predictor.profile.revision == 1 and "(1 threads)" in said
    assert run_predictor(store, "m" * 64, "cpu", 2, {})[0].profile.revision == 2
    assert run_predictor(store, "m" * 64, "cpu", 8, {})[0].profile.revision == 2  # newest on the device
    predictor, said = run_predictor(Store(tmp_path / "empty"), "m" * 64, "cpu", 2, {})
    assert predictor is None and "dlbench calibrate" in said


def test_accuracy_per_precision_where_several_were_predicted():
    runs = [predicted(make_record(framework="torch"), 0.02), predicted(make_record(framework="torch"), 0.04)]
    runs[1].workload = runs[1].workload.model_copy(update={"precision": "amp_bf16"})
    measured = runs[0].summary.median_s
    groups = {(g["suite"], g["framework"], g["precision"]): g for g in accuracy_table_rows(prediction_errors(runs))}
    assert groups[("all", "all", "fp32")]["median_error"] == pytest.approx(0.02 / measured - 1)
    assert groups[("all", "all", "amp_bf16")]["median_error"] == pytest.approx(0.04 / runs[1].summary.median_s - 1)
    assert groups[("all", "all", "all")]["runs"] == 2
