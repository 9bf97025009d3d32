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


def test_each_framework_over_every_suite_where_several_were_scored():
    """A framework's runs of several suites get a row of their own (is every framework within the
    bound?), placed before the total; over one suite they would repeat the suite's row and are left out."""
    runs = [predicted(make_record(framework="torch"), 0.02), predicted(make_record(framework="jax"), 0.03)]
    one_suite = {(g["suite"], g["framework"]) for g in accuracy_table_rows(prediction_errors(runs))}
    assert ("all", "torch") not in one_suite and ("all", "jax") not in one_suite
    rows = prediction_errors(runs)
    rows.append({**rows[0], "suite": "cnn", "error": 0.5})  # a second suite's run of torch
    table = accuracy_table_rows(rows)
    groups = {(g["suite"], g["framework"]): g for g in table}
    torch_all = groups[("all", "torch")]
    assert torch_all["runs"] == 2 and torch_all["median_abs_error"] == pytest.approx((abs(rows[0]["error"]) + 0.5) / 2)
    assert ("all", "jax") not in groups  # one suite of jax: its suite row says it
    assert [(g["suite"], g["framework"]) for g in table][-2:] == [("all", "torch"), ("all", "all")]


def test_accuracy_per_precision_where_several_were_predicted():
    runs = [predicted(make_record(framework="torch"), 0.02), predicted(make_record(framework="torch"), 0.04)]
    runs[1].workload = runs[1].workload.model_copy(update={"precision": "amp_bf16"})
    measured = runs[0].summary.median_s
    groups = {(g["suite"], g["framework"], g["precision"]): g for g in accuracy_table_rows(prediction_errors(runs))}
    assert groups[("all", "all", "fp32")]["median_error"] == pytest.approx(0.02 / measured - 1)
    assert groups[("all", "all", "amp_bf16")]["median_error"] == pytest.approx(0.04 / runs[1].summary.median_s - 1)
    assert groups[("all", "all", "all")]["runs"] == 2


# ------------------------------------------------------------- the data term against convergence runs


def test_the_data_term_of_one_step_by_hand():
    from dlbench.performance.data_term import check_data_term

    # 100 steps of batch 32, 65 bytes a sample (64 pixels and a label), 2.0 s training of which 0.5 s
    # blocked in the pipeline: the step computes (2.0 - 0.5) / 100 = 15 ms
    hidden = check_data_term(batch=32, sample_bytes=65, steps=100, train_s=2.0, input_wait_s=0.5,
                             read_bytes_per_s=1e6)
    assert hidden["compute_s"] == pytest.approx(0.015)
    assert hidden["io_s"] == pytest.approx(32 * 65 / 1e6)  # 2.08 ms at 1 MB/s: hidden behind 15 ms
    assert hidden["predicted_exposed_s"] == 0.0 and hidden["predicted_share"] == 0.0
    assert hidden["unhidden_share"] == pytest.approx(0.00208 / (0.00208 + 0.015))
    assert hidden["measured_wait_s"] == pytest.approx(0.005) and hidden["measured_share"] == pytest.approx(0.25)
    # at 100 kB/s a batch takes 20.8 ms, 5.8 ms more than the step: that much is exposed
    slow = check_data_term(batch=32, sample_bytes=65, steps=100, train_s=2.0, input_wait_s=0.5,
                           read_bytes_per_s=1e5)
    assert slow["predicted_exposed_s"] == pytest.approx(0.0058)
    assert slow["predicted_share"] == pytest.approx(0.0058 / (0.0058 + 0.015))
    with pytest.raises(ValueError):
        check_data_term(batch=32, sample_bytes=65, steps=0, train_s=2.0, input_wait_s=0.5, read_bytes_per_s=1e5)


def _convergence_store(tmp_path: Path) -> tuple[Path, dict]:
    """A store holding the v11 fixture: a fake-runner convergence record of digits_fcn5, 3 seeds."""
    import json

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "records" / "v11.json"
    data = json.loads(fixture.read_text())
    store = tmp_path / "store"
    (store / "runs").mkdir(parents=True)
    (store / "runs" / f"{data['run_id']}.json").write_bytes(fixture.read_bytes())
    return store, data


def test_predict_accuracy_checks_the_data_term_of_convergence_records(tmp_path):
    import json

    from typer.testing import CliRunner

    from dlbench.cli import app

    store, data = _convergence_store(tmp_path)
    runs = data["convergence"]["runs"]
    steps, train_s, wait_s = (sum(r[k] for r in runs) for k in ("steps", "train_s", "input_wait_s"))
    read_bytes = sum((r["train_samples"] + r["eval_samples"]) * 65 for r in runs)
    result = CliRunner().invoke(app, ["predict", "--accuracy", "--store", str(store), "--format", "json"])
    assert result.exit_code == 0, result.output
    (check,) = json.loads(result.output)["data_term"]
    assert check["task"] == "digits_linear" and check["runs"] == 3 and check["bandwidth_source"] == "measured"
    assert check["bytes_per_batch"] == 32 * 65
    assert check["read_bytes_per_s"] == pytest.approx(read_bytes / sum(r["read_s"] for r in runs))
    assert check["measured_share"] == pytest.approx(wait_s / train_s)
    assert check["compute_s"] == pytest.approx((train_s - wait_s) / steps)
    assert check["unexplained_s"] == pytest.approx(wait_s / steps - check["predicted_exposed_s"])

    stated = CliRunner().invoke(app, ["predict", "--accuracy", "--store", str(store), "--format", "json",
                                      "--io-bandwidth", "0.000001"])  # 1 kB/s: 2 s a batch, nothing hidden
    (check,) = json.loads(stated.output)["data_term"]
    assert check["bandwidth_source"] == "stated" and check["io_s"] == pytest.approx(2.08)
    assert check["predicted_share"] > 0.99
    table = CliRunner().invoke(app, ["predict", "--accuracy", "--store", str(store)], terminal_width=200)
    assert table.exit_code == 0 and "data term" in table.output and "digits_linear" in table.output
    bad = CliRunner().invoke(app, ["predict", "--accuracy", "--store", str(store), "--io-bandwidth", "-1"])
    assert bad.exit_code == 2 and "--io-bandwidth" in bad.output
