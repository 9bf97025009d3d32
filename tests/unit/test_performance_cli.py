"""`dlbench run --suite kernels`, `kernels`, `calibrate` and `predict` end to end with the fake runner
(its kernels sleep as a 50 GFLOP/s, 10 GB/s machine would take), and their input checks."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from dlbench.cli import app
from dlbench.performance.yardstick import YARDSTICK
from dlbench.reporting.charts import fmt
from dlbench.store.kernels import KernelStore
from dlbench.workflows import calibration as calibrate_workflow
from dlbench.workflows import kernels as kernels_workflow
from dlbench.store.profiles import ProfileStore
from dlbench.store.store import Store

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, ANSI.sub("", result.stdout), " ".join(ANSI.sub("", result.stderr).split())


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.delenv("DLBENCH_FAKE_BEHAVIOUR", raising=False)
    monkeypatch.delenv("DLBENCH_FAKE_KERNEL", raising=False)
    monkeypatch.setenv("DLBENCH_STORE", str(tmp_path / "default-store"))
    monkeypatch.setenv("DLBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DLBENCH_FAKE_STEP_S", "0.0005")
    # every dtype runs, whatever this CPU has (dtype_support itself is tested on its own)
    every = lambda device: {"float32": None, "float16": None, "bfloat16": None}  # noqa: E731
    monkeypatch.setattr(kernels_workflow, "dtype_support_of", every)
    monkeypatch.setattr(calibrate_workflow, "dtype_support_of", every)
    monkeypatch.chdir(tmp_path)


def kernels(store, *extra):
    return invoke("run", "--suite", "kernels", "--framework", "fake", "--profile", "smoke", "--device", "cpu",
                  "--env", "current", "--threads", "1", "--store", str(store), *extra)


def test_kernels_calibrate_predict_run_accuracy(project, tmp_path, monkeypatch):
    store = tmp_path / "s"
    monkeypatch.setenv("DLBENCH_FAKE_KERNEL", "refuse_bfloat16")
    code, out, err = kernels(store)
    assert code == 0, err
    records = list(KernelStore(Store(store)).records())
    assert sorted(r.benchmark for r in records) == ["cnn-layers", "fcn-layers", "matmul", "rnn-layers",
                                                    "transformer-layers", "transpose"]
    matmul = next(r for r in records if r.benchmark == "matmul")
    by_dtype = {(k.spec["dtype"], k.status) for k in matmul.kernels}
    assert by_dtype == {("float32", "ok"), ("float16", "ok"), ("bfloat16", "skipped")}
    assert "not available in bfloat16: TypeError: the fake framework has no bfloat16" in err
    assert "matmul" in out and "GFLOP/s" in out and "no machine profile when these ran" in out
    # alexnet_r's poolings are layer shapes too, memory-bound (bytes/s): no schema of their own
    cnn = next(r for r in records if r.benchmark == "cnn-layers")
    pools = [k for k in cnn.kernels if k.spec["kind"].startswith("pool2d")]
    assert {k.spec["kind"] for k in pools} == {"pool2d_fwd", "pool2d_bwd"}
    assert all(k.status == "ok" and k.unit == "B/s" and k.achieved > 0 for k in pools)

    code, out, err = invoke("calibrate", "--framework", "fake", "--env", "current", "--device", "cpu",
                            "--threads", "1", "--store", str(store), "--quick")
    assert code == 0, err
    profile = ProfileStore(Store(store)).latest(records[0].machine["machine_id"])
    assert profile.revision == 1 and profile.threads == 1
    # the fake sleeps at most 1/50e9 s per FLOP: no framework can beat the machine it pretends to be
    assert 0 < profile.matmul_peak["float32"].flops_per_s <= 5e10
    assert "bfloat16" not in profile.matmul_peak and profile.dispatch_s["fake"] > 0
    assert len(profile.kernels["fake"]) > 20 and "peak matmul float32" in out

    code, out, err = invoke("predict", "--network", "fcn5", "--framework", "fake", "--batch", "16",
                            "--threads", "1", "--store", str(store), "--format", "json")
    assert code == 0, err
    p = json.loads(out)
    assert p["profile"] == profile.ref and p["unmeasured_kernels"] == 0 and p["measured_share"] > 0.2
    assert p["iteration_s"] == pytest.approx(sum(v for k, v in p["phases"].items() if k != "communication"))
    code, out, _ = invoke("predict", "--network", "fcn5", "--framework", "fake", "--batch", "16", "--threads", "1",
                          "--store", str(store), "--layers")
    assert code == 0 and "iteration" in out and "000 dense" in out
    # the transformers: transformer_tiny at the smoke profile's batch and sequence (4 x 32) has every
    # kernel measured (attention's core, layer norm, GELU with the rest); the others none, and every
    # operation is still predicted
    for name, batch, unmeasured in (("transformer_tiny", "4", 0), ("vit_b16", "2", None), ("gpt2_small", "1", None)):
        code, out, err = invoke("predict", "--network", name, "--framework", "fake", "--batch", batch,
                                "--threads", "1", "--store", str(store), "--format", "json")
        assert code == 0, err
        p = json.loads(out)
        assert p["iteration_s"] > 0 and p["phases"]["backward"] > 0 and p["phases"]["forward"] > 0, name
        # from class fits the backward's twice the work shows; transformer_tiny's measured microsecond
        # kernels can time the other way round on a shared VM (forward 14.0 ms, backward 12.8 ms once)
        assert unmeasured == 0 or p["phases"]["backward"] > p["phases"]["forward"], name
        assert (p["unmeasured_kernels"] == 0) is (unmeasured == 0), (name, p["unmeasured_kernels"])
    code, out, _ = invoke("predict", "--network", "transformer_tiny", "--framework", "fake", "--batch", "4",
                          "--mode", "infer", "--threads", "1", "--store", str(store), "--layers")
    assert code == 0 and "003 transformer_block" in out and "006 lm_head" in out

    code, _, err = invoke("run", "--no-check", "--suite", "fcn", "--framework", "fake", "--profile", "smoke", "--device", "cpu",
                          "--env", "current", "--threads", "1", "--store", str(store))
    assert code == 0 and f"predictions: machine profile {profile.ref}" in err
    runs = list(Store(store).records())
    assert len(runs) == 2 and all(r.prediction.profile == profile.ref and r.prediction.iteration_s > 0 for r in runs)
    code, out, _ = invoke("predict", "--accuracy", "--store", str(store), "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert [(g["suite"], g["framework"], g["runs"], g["predicted"]) for g in data["groups"]] == [
        ("fcn", "fake", 2, 2), ("all", "all", 2, 2)]
    row = data["runs"][0]
    assert row["error"] == pytest.approx(row["predicted_s"] / row["measured_s"] - 1)
    code, out, _ = invoke("predict", "--accuracy", "--recompute", "--store", str(store), "--runs")
    assert code == 0 and "predicted again from profile" in " ".join(out.split()) and "fcn5-train" in out

    code, out, _ = invoke("kernels", "--store", str(store), "--framework", "fake", "--benchmark", "matmul")
    assert code == 0 and "m=256 n=256 k=256" in out

    # the report's run page: predicted against measured, with the error
    code, _, err = invoke("report", "--store", str(store), "--out", str(tmp_path / "site"))
    assert code == 0, err
    page = " ".join(re.sub(r"<[^>]+>", " ", (tmp_path / "site" / "runs" / f"{row['run_id']}.html").read_text()).split())
    assert f"Predicted {fmt(row['predicted_s'] * 1e3, 4)} ms per iteration" in page  # as the page writes numbers
    assert f"(error {100 * row['error']:+.1f}% against the measured median)" in page
    assert f"against {fmt(row['measured_s'] * 1e3, 4)} ms measured" in page
    # and where the prediction came from: every share the record keeps, named
    stored = next(r for r in runs if r.run_id == row["run_id"]).prediction.sources
    assert stored and sum(stored.values()) == pytest.approx(1.0)
    words = {"shape": "from kernels measured at their shape", "class": "from measured class efficiencies",
             "ceilings": "from the roofline at the measured ceilings"}
    for source, share in stored.items():
        assert f"{fmt(100 * share, 2)}% {words[source]}" in page
    assert f"machine profile {profile.ref}" in page


def test_calibrate_probes_the_operation_classes_and_predictions_say_so(project, tmp_path):
    """calibrate alone (no kernels suite run): per class one layer shape of the smoke profile's
    (--quick: in one run), timed by the fake's kernel code; shapes nobody timed take their class's efficiency, and
    the prediction says which share came from where."""
    store = tmp_path / "s"
    code, out, err = invoke("calibrate", "--framework", "fake", "--env", "current", "--device", "cpu",
                            "--threads", "1", "--store", str(store), "--quick")
    assert code == 0, err
    assert "class probes" in err and "operation classes per framework" in err and "dlbench calibrate took" in err
    records = list(KernelStore(Store(store)).records())
    probe_runs = [r for r in records if r.benchmark.startswith("probes-")]
    assert [r.benchmark for r in probe_runs] == ["probes-all"]  # --quick: one worker start
    assert all(r.policy["min_iters"] == 1 and r.policy["max_iters"] == 2 for r in probe_runs)
    profile = ProfileStore(Store(store)).latest(records[0].machine["machine_id"])
    probes = profile.class_probes["fake"]
    kinds = {p.spec["kind"] for p in probes}
    assert {"matmul", "conv2d_fwd", "conv2d_bwd", "lstm_layer_fwd", "attention_fwd", "layer_norm_fwd", "gelu_fwd",
            "pool2d_fwd", "pool2d_bwd", "softmax_xent_fwd", "sgd_momentum"} <= kinds
    assert sorted(profile.sources["class_probes"]["fake"]) == sorted(r.run_id for r in probe_runs)
    assert "efficiency per operation class" in out and "matmul float32" in out
    # alexnet_r at batch 16: its convolutions were probed at the smoke batch (8) only, so every one takes
    # its class's efficiency
    code, out, err = invoke("predict", "--network", "alexnet_r", "--framework", "fake", "--batch", "16",
                            "--threads", "1", "--store", str(store), "--format", "json")
    assert code == 0, err
    p = json.loads(out)
    assert p["sources"]["class"] > 0.5 and sum(p["sources"].values()) == pytest.approx(1.0)
    assert set(p["sources"]) <= {"shape", "class", "ceilings"}
    convs = [layer for layer in p["layers"] if "conv2d" in layer["label"]]
    assert convs and all(set(layer["sources_s"]) == {"class"} for layer in convs)
    pools = [layer for layer in p["layers"] if "pool" in layer["label"]]  # and so does every pooling
    assert len(pools) == 3 and all(set(layer["sources_s"]) == {"class"} for layer in pools)
    code, out, _ = invoke("predict", "--network", "alexnet_r", "--framework", "fake", "--batch", "16",
                          "--threads", "1", "--store", str(store), "--layers")
    text = " ".join(out.split())
    assert code == 0 and "measured class efficiencies" in text and "class 100%" in text


def test_a_failing_kernel_exits_1_and_is_recorded(project, tmp_path, monkeypatch):
    monkeypatch.setenv("DLBENCH_FAKE_KERNEL", "fail_conv")
    code, _, err = kernels(tmp_path / "s", "--benchmark", "cnn-layers")
    assert code == 1 and "fake convolution failure" in err
    (record,) = KernelStore(Store(tmp_path / "s")).records()
    convs = [k for k in record.kernels if k.spec["kind"].startswith("conv2d")]
    assert convs and all(k.status == "failed" and "RuntimeError" in k.reason for k in convs)
    assert all(k.status == "ok" for k in record.kernels if k.spec["kind"] == "matmul")


def test_backward_kernels_timed_with_their_forward_are_the_difference(project, tmp_path, monkeypatch):
    monkeypatch.setenv("DLBENCH_FAKE_KERNEL", "backward_with_forward")
    code, _, err = kernels(tmp_path / "s", "--benchmark", "rnn-layers")
    assert code == 0, err
    (record,) = KernelStore(Store(tmp_path / "s")).records()
    bwd = next(k for k in record.kernels if k.spec["kind"] == "lstm_step_bwd")
    assert bwd.settings["backward_time"] == "forward+backward minus forward (median of paired calls)"
    assert 0 < bwd.median_s < max(bwd.times_s)


@pytest.mark.parametrize("args, words", [
    (("predict", "--network", "nonet", "--framework", "fake", "--batch", "4"), "unknown network 'nonet'"),
    (("predict", "--network", "fcn5", "--batch", "4"), "predict needs --framework"),
    (("predict", "--accuracy", "--network", "fcn5"), "--network is for one prediction"),
    (("predict", "--network", "fcn5", "--framework", "fake", "--batch", "4", "--runs"), "go with --accuracy"),
    (("predict", "--network", "fcn5", "--framework", "fake", "--batch", "4", "--schedule", "ring"),
     "unknown schedule 'ring'"),
    (("predict", "--network", "fcn5", "--framework", "fake", "--batch", "4", "--workers", "2", "--mode", "infer"),
     "needs --mode train"),
    (("predict", "--network", "fcn5", "--framework", "fake", "--batch", "4"), "run `dlbench calibrate` first"),
    (("run", "--suite", "kernels", "--framework", "fake", "--workers", "2"), "--workers is not taken by suite 'kernels' of kind kernels"),
    (("calibrate", "--framework", "fake", "--full", "--quick"), "--full and --quick exclude each other"),
    (("run", "--suite", "kernels", "--framework", "fake", "--benchmark", "fft"), "unknown benchmark 'fft'"),
])
def test_bad_input_exits_2_with_one_message(project, tmp_path, args, words):
    code, _, err = invoke(*args, "--store", str(tmp_path / "s"))
    assert code == 2 and words in err
    assert not (tmp_path / "s" / "kernels").exists() and not (tmp_path / "s" / "machines").exists()


def test_a_bad_kernel_suite_file_is_named_with_its_field(project, tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text((project / "suites" / "kernels.yaml").read_text().replace("suite: rnn", "suite: rnnn", 1))
    code, _, err = invoke("run", "--suite", str(path), "--framework", "fake", "--store", str(tmp_path / "s"))
    assert code == 2 and str(path) in err and "benchmarks[4].suite" in err and "unknown suite 'rnnn'" in err


def test_a_machine_slower_during_the_runs_than_when_calibrated_is_scored_at_its_own_speed(project, tmp_path,
                                                                                          monkeypatch):
    """Every worker times the yardstick first: calibrate's (into the profile) and each run's (into its
    repeats). The fake runner sleeps twice as long for everything with DLBENCH_FAKE_SLOWDOWN=2, as a
    VM whose neighbours woke up: the same runs' raw errors move by that factor, the scaled ones not."""
    store = tmp_path / "s"
    code, _, err = invoke("calibrate", "--framework", "fake", "--env", "current", "--device", "cpu",
                          "--threads", "1", "--store", str(store), "--quick")
    assert code == 0, err
    (profile,) = [ProfileStore(Store(store)).latest(m) for m in ProfileStore(Store(store)).machines()]
    stick = profile.yardstick["fake"]
    calibration = list(KernelStore(Store(store)).records())
    assert stick.workers == sum(len(r.repeats) for r in calibration) >= 3  # ceilings, the cold call, probes
    # the fake sleeps a 512^3 matmul at 50 GFLOP/s and 32 MiB moved at 10 GB/s, plus its 20 us call
    matmul, relu = YARDSTICK
    assert matmul.kind == "matmul" and stick.median_s[matmul.key] >= 2 * 512**3 / 5e10
    assert relu.kind == "relu" and stick.median_s[relu.key] >= 8 * (4 << 20) / 1e10
    assert stick.fastest <= 1.0 <= stick.slowest

    def fcn(slowdown: str) -> None:  # fcn5-train and fcn8-train, one after the other
        monkeypatch.setenv("DLBENCH_FAKE_SLOWDOWN", slowdown)
        code, _, err = invoke("run", "--no-check", "--suite", "fcn", "--framework", "fake", "--profile", "smoke",
                              "--device", "cpu", "--env", "current", "--threads", "1", "--store", str(store),
                              "--mode", "train", "--no-telemetry")
        assert code == 0, err

    fcn("1")
    fcn("2")
    runs = sorted(Store(store).records(), key=lambda r: r.started_at)
    assert len(runs) == 4 and all(rep.yardstick and len(rep.yardstick) == 2 for r in runs for rep in r.repeats)
    code, out, _ = invoke("predict", "--accuracy", "--recompute", "--store", str(store), "--format", "json")
    assert code == 0
    rows = {row["run_id"]: row for row in json.loads(out)["runs"]}
    # the same network in both periods: fcn5-train's second run is the slow one
    normal, slow = (rows[r.run_id] for r in runs if r.benchmark == "fcn5-train")
    assert normal["predicted_s"] == pytest.approx(slow["predicted_s"])  # one profile, one network
    assert 0.8 < normal["speed_ratio"] < 1.25 and 1.6 < slow["speed_ratio"] < 2.5
    assert 0.8 < normal["drift"] < 1.25 and 1.6 < slow["drift"] < 2.5  # its neighbours ran at its speed
    assert slow["scaled_error"] == pytest.approx(slow["predicted_s"] * slow["drift"] / slow["measured_s"] - 1)
    # raw: the slow run's error is the normal one's over two (1 + e halves); scaled: the same error
    assert (1 + slow["error"]) / (1 + normal["error"]) < 0.65
    assert 0.8 < (1 + slow["scaled_error"]) / (1 + normal["scaled_error"]) < 1.25
    code, out, _ = invoke("predict", "--accuracy", "--recompute", "--store", str(store), "--runs")
    text = " ".join(out.split())
    assert code == 0 and "drift" in text and "speed ratio" in text and "scaled |error|" in text
    # the stored predictions (made before each run from the same profile) are scored the same way
    code, out, _ = invoke("predict", "--accuracy", "--store", str(store), "--format", "json")
    stored = {row["run_id"]: row for row in json.loads(out)["runs"]}
    assert stored[slow["run_id"]]["speed_ratio"] == pytest.approx(slow["speed_ratio"])
    assert stored[slow["run_id"]]["scaled_error"] is not None


def test_bad_choices_of_full_calibrations_layer_sets_exit_2_before_timing(project, tmp_path):
    for args, words in ((["--suite", "fcn"], "give --full too"), (["--precision", "fp32"], "give --full too"),
                        (["--full", "--suite", "nope"], "--suite nope: the kernels suite times the layers of cnn, fcn"),
                        (["--full", "--precision", "tf32"], "precision")):
        code, _, err = invoke("calibrate", "--framework", "fake", "--env", "current", "--device", "cpu",
                              "--store", str(tmp_path / "t"), *args)
        assert code == 2 and words in err, (args, err)
        assert not (tmp_path / "t" / "kernels").exists()
