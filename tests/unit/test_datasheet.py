"""Datasheet machines (suites/machines/): the shipped files validate and name a source for every
figure, a bad file is one error naming file and field, a datasheet prediction equals the one
computed by hand, the machine comparison's rows are ranked, and `predict --machine h200` needs no
calibrated profile. Framework-free and fast."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dlbench.cli import app
from dlbench.definitions.loader import DefinitionError, load_network
from dlbench.definitions.machines import OP_CLASSES, load_efficiency, load_machine_sheet
from dlbench.performance.choice import ChoiceRow, Job, compare_machines
from dlbench.performance.datasheet import DatasheetMachines, parse_efficiency_setting
from dlbench.performance.model import FrameworkFacts, PredictionError, predict
from dlbench.performance.workload import decompose

ROOT = Path(__file__).resolve().parents[2]
MACHINES = ROOT / "suites" / "machines"
EAGER = FrameworkFacts(step="eager", schedule="wfbp")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def machines() -> DatasheetMachines:
    return DatasheetMachines(MACHINES)


def dense_network(tmp_path: Path, features: int = 4096, units: int = 4096) -> dict:
    path = tmp_path / "one_dense.yaml"
    path.write_text(yaml.safe_dump({"name": "one_dense", "input": {"kind": "tensor", "shape": [features],
                                                                   "classes": units},
                                    "layers": [{"type": "dense", "units": units}],
                                    "loss": "softmax_cross_entropy"}))
    return load_network(path).resolved


def test_shipped_machines_validate_and_name_every_source(machines):
    assert {"a100", "h100", "h200", "l4", "mi300x"} <= set(machines.names())
    for name in machines.names():
        sheet = load_machine_sheet(MACHINES / f"{name}.yaml")
        figures = dict(sheet.figures())
        assert "memory_gb_per_s" in figures and any(k.startswith("peak_tflops.") for k in figures), name
        for where, figure in figures.items():
            source = sheet.sources[figure.source]  # every figure names a source the file gives
            assert source.url.startswith("https://") and source.document, (name, where)
        profile = machines.profile(name, ["torch"])
        assert profile.source == "datasheet" and profile.ref == f"datasheet:{name}"
        assert set(profile.efficiency) == set(OP_CLASSES) - {"all_reduce"}
    defaults = load_efficiency(MACHINES / "efficiency.yaml", complete=True)
    assert set(defaults.efficiency) == set(OP_CLASSES) and all(f.why for f in defaults.efficiency.values())
    # a figure left out is said so, not guessed: the MI300X's float32 rate
    mi300x = load_machine_sheet(MACHINES / "mi300x.yaml")
    assert mi300x.peak_tflops.float32 is None and any("float32" in n for n in mi300x.not_found)


@pytest.mark.parametrize("change, field", [
    (lambda d: d["peak_tflops"]["float32"].update(source="brochure"), "peak_tflops.float32.source"),
    (lambda d: d["memory_gb_per_s"].update(value=-1), "memory_gb_per_s.value"),
    (lambda d: d["gpu_link"].update(topology="ring"), "gpu_link.topology"),
    (lambda d: d["sources"]["datasheet"].update(url="http://example.com"), "sources.datasheet.url"),
    (lambda d: d.update(colour="green"), "colour"),
    (lambda d: d.update(peak_tflops={}), "peak_tflops"),
])
def test_a_bad_machine_file_is_one_error_naming_file_and_field(tmp_path, change, field):
    data = yaml.safe_load((MACHINES / "a100.yaml").read_text())
    change(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(DefinitionError) as e:
        load_machine_sheet(path)
    assert e.value.path == str(path) and e.value.field == field


def test_efficiency_defaults_must_state_every_class(tmp_path):
    data = yaml.safe_load((MACHINES / "efficiency.yaml").read_text())
    del data["efficiency"]["attention"]
    path = tmp_path / "efficiency.yaml"
    path.write_text(yaml.safe_dump(data))
    load_efficiency(path)  # a user's file may give any part
    with pytest.raises(DefinitionError, match=r"efficiency\.yaml: efficiency\.attention: missing"):
        load_efficiency(path, complete=True)
    assert parse_efficiency_setting("matmul=0.6") == ("matmul", 0.6)
    for bad in ("matmul", "matmul=x", "matmul=1.5", "tensor=0.5"):
        with pytest.raises(ValueError):
            parse_efficiency_setting(bad)


def test_a_datasheet_prediction_by_hand(tmp_path, machines):
    """One dense layer, inference, eager, on the H200's sheet: the GEMM's FLOPs over the float32 peak
    times the matmul efficiency (its bytes over the bandwidth are less), the bias pass by its bytes
    over the bandwidth times the element-wise efficiency, and the launch overhead per operation."""
    batch, k, n = 256, 4096, 4096
    sheet = load_machine_sheet(MACHINES / "h200.yaml")
    eff = machines.efficiency
    peak = sheet.peak_tflops.float32.value * 1e12
    bandwidth = sheet.memory_gb_per_s.value * 1e9 * eff.factors["elementwise"]
    gemm_flops, gemm_bytes = 2 * batch * n * k, 4 * (batch * k + k * n + batch * n)
    gemm = max(gemm_flops / (peak * eff.factors["matmul"]), gemm_bytes / bandwidth)
    assert gemm == gemm_flops / (peak * eff.factors["matmul"])  # matmul-dominated
    bias = max(batch * n / peak, 4 * batch * n / bandwidth)
    by_hand = gemm + bias + 2 * eff.launch_overhead_s
    work = decompose(dense_network(tmp_path, k, n), batch, "infer")
    p = predict(work, "torch", machines.profile("h200", ["torch"]), facts=EAGER)
    assert p.iteration_s == pytest.approx(by_hand, rel=1e-9)
    assert any(note.startswith("datasheet prediction (datasheet:h200)") for note in p.notes)
    assert "datasheet prediction" in " ".join(p.to_record()["notes"])
    # the efficiency is what it divides by: half of it, twice the GEMM's time
    half = DatasheetMachines(MACHINES, eff.overridden(values={"matmul": eff.factors["matmul"] / 2}))
    p_half = predict(work, "torch", half.profile("h200", ["torch"]), facts=EAGER)
    assert p_half.iteration_s == pytest.approx(by_hand + gemm, rel=1e-9)
    # tf32 takes the TF32 rate for the products, and nothing else
    tf32 = predict(decompose(dense_network(tmp_path, k, n), batch, "infer", "tf32"), "torch",
                   machines.profile("h200", ["torch"]), facts=EAGER)
    tf32_gemm = max(gemm_flops / (sheet.peak_tflops.tf32.value * 1e12 * eff.factors["matmul"]), gemm_bytes / bandwidth)
    assert tf32.iteration_s == pytest.approx(tf32_gemm + bias + 2 * eff.launch_overhead_s, rel=1e-9)


def test_a_datasheet_refuses_what_it_does_not_give(tmp_path, machines):
    work = decompose(dense_network(tmp_path, 64, 64), 8, "train")
    with pytest.raises(PredictionError, match="one node of up to 8 GPUs; 16 workers"):
        predict(work, "torch", machines.profile("h200", ["torch"]), workers=16, facts=EAGER)
    with pytest.raises(PredictionError, match="mi300x gives no peak rate for float32"):
        predict(work, "torch", machines.profile("mi300x", ["torch"]), facts=EAGER)
    bf16 = decompose(dense_network(tmp_path, 64, 64), 8, "train", "amp_bf16")
    assert predict(bf16, "torch", machines.profile("mi300x", ["torch"]), facts=EAGER).iteration_s > 0
    # 8 workers on one node: the ring over one direction of NVLink at the all-reduce efficiency
    p = predict(work, "torch", machines.profile("h200", ["torch"]), workers=8, schedule_kind="none", facts=EAGER)
    eff = machines.efficiency
    beta = 1 / (900e9 / 2 * eff.factors["all_reduce"])
    grad = 4 * (64 * 64 + 64)
    assert p.communication_s == pytest.approx(14 * eff.step_latency_s + 14 / 8 * beta * grad, rel=1e-9)


def test_machines_compared_and_ranked(tmp_path, machines):
    network = dense_network(tmp_path, 1024, 1024)
    jobs = [Job("one_dense-train", network, 64, "train"), Job("one_dense-infer", network, 64, "infer")]
    profiles = [machines.profile(m, ["torch"]) for m in ("l4", "h200", "a100")]
    rows = compare_machines(jobs, {"torch": EAGER}, profiles, [1, 8, 16])
    assert list(rows[0].to_dict()) == ["benchmark", "batch", "precision", "framework", "machine", "source",
                                       "workers", "iteration_s", "samples_per_s", "power_w", "energy_per_sample_j",
                                       "rank", "error", "sources"]
    assert all(r.sources == {"datasheet": pytest.approx(1.0)} for r in rows if r.rank is not None)
    train = [r for r in rows if r.benchmark == "one_dense-train"]
    ranked = [r for r in train if r.rank is not None]
    assert [r.rank for r in ranked] == list(range(1, len(ranked) + 1))
    assert [r.samples_per_s for r in ranked] == sorted((r.samples_per_s for r in ranked), reverse=True)
    assert {(r.machine, r.workers) for r in ranked} == {(m, w) for m in ("datasheet:l4", "datasheet:h200",
                                                                         "datasheet:a100") for w in (1, 8)}
    refused = train[len(ranked):]  # 16 workers: more than one node holds, last and unranked
    assert {r.workers for r in refused} == {16} and all(r.rank is None and "one node" in r.error for r in refused)
    for r in ranked:
        assert r.samples_per_s == pytest.approx(r.workers * 64 / r.iteration_s)
        board = {"datasheet:l4": 72, "datasheet:h200": 700, "datasheet:a100": 400}[r.machine]
        assert r.energy_per_sample_j == pytest.approx(board * r.iteration_s / 64)
    infer = [r for r in rows if r.benchmark == "one_dense-infer"]
    assert {r.workers for r in infer} == {1} and [r.rank for r in infer] == [1, 2, 3]
    assert isinstance(rows[0], ChoiceRow) and json.dumps([r.to_dict() for r in rows])


def test_frameworks_are_ranked_together_by_their_step_kind(tmp_path, machines):
    """Several frameworks share one ranking per benchmark: on the same machine a compiled step (one
    launch per iteration) comes out ahead of an eager one (a launch per operation) by exactly the
    launches it saves."""
    network = dense_network(tmp_path, 256, 256)
    compiled = FrameworkFacts(step="graph", schedule="wfbp")
    rows = compare_machines([Job("one_dense-train", network, 32, "train")], {"torch": EAGER, "jax": compiled},
                            [machines.profile(m, ["torch", "jax"]) for m in ("h200", "l4")], [1])
    assert [r.rank for r in rows] == [1, 2, 3, 4]
    assert {(r.framework, r.machine) for r in rows} == {(f, m) for f in ("torch", "jax")
                                                       for m in ("datasheet:h200", "datasheet:l4")}
    h200 = {r.framework: r for r in rows if r.machine == "datasheet:h200"}
    assert h200["jax"].rank < h200["torch"].rank
    saved = (h200["torch"].iteration_s - h200["jax"].iteration_s) / machines.efficiency.launch_overhead_s
    assert saved >= 2 and saved == pytest.approx(round(saved), abs=1e-6)  # whole launches, nothing else
    # two compiled frameworks a datasheet cannot tell apart tie: one rank for both, the next one after them
    rows = compare_machines([Job("one_dense-train", network, 32, "train")],
                            {"jax": compiled, "tensorflow": compiled, "torch": EAGER},
                            [machines.profile("h200", ["jax", "tensorflow", "torch"])], [1])
    assert [(r.framework, r.rank) for r in rows] == [("jax", 1), ("tensorflow", 1), ("torch", 3)]


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, ANSI.sub("", result.stdout), " ".join(ANSI.sub("", result.stderr).split())


def test_predict_on_a_datasheet_machine_needs_no_calibration(tmp_path, monkeypatch):
    monkeypatch.setenv("DLBENCH_STORE", str(tmp_path / "empty-store"))
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = invoke("predict", "--network", "resnet50", "--framework", "torch", "--batch", "64",
                            "--machine", "h200")
    assert code == 0, err
    assert "datasheet:h200 (datasheet, not measured)" in " ".join(out.split()) and "datasheet prediction" in err
    code, out, _ = invoke("predict", "--network", "resnet50", "--framework", "torch", "--batch", "64",
                          "--machine", "h200", "--efficiency", "convolution=0.3", "--format", "json")
    slower = json.loads(out)
    assert code == 0 and slower["source"] == "datasheet" and "convolution 0.3" in slower["notes"][0]
    code, _, err = invoke("predict", "--network", "resnet50", "--framework", "torch", "--batch", "64",
                          "--machine", "h200", "--efficiency", "convolution=3")
    assert code == 2 and "must be in (0, 1]" in err
    code, _, err = invoke("predict", "--network", "resnet50", "--framework", "torch", "--batch", "64",
                          "--machine", "datasheet:h900")
    assert code == 2 and "no datasheet machine 'h900'" in err


def test_predict_suite_prints_the_ranked_table(tmp_path, monkeypatch):
    monkeypatch.setenv("DLBENCH_STORE", str(tmp_path / "empty-store"))
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = invoke("predict", "--suite", "fcn", "--framework", "torch", "--machine", "a100",
                            "--machine", "h200", "--machine", "l4", "--workers", "1", "--workers", "2")
    assert code == 0, err
    header = next(line for line in out.splitlines() if "machine" in line)
    for col in ("rank", "machine", "source", "workers", "iteration ms", "samples/s", "J/sample"):
        assert col in header
    assert "fcn5-train" in out and "ranked by samples/s" in err
    code, out, _ = invoke("predict", "--suite", "fcn", "--framework", "torch", "--machine", "a100",
                          "--machine", "h200", "--format", "json")
    rows = json.loads(out)["rows"]
    first = [r for r in rows if r["benchmark"] == rows[0]["benchmark"] and r["batch"] == rows[0]["batch"]]
    assert [r["rank"] for r in first] == [1, 2] and first[0]["samples_per_s"] >= first[1]["samples_per_s"]
    assert all(r["source"] == "datasheet" and math.isfinite(r["energy_per_sample_j"]) for r in rows)


def test_predict_suite_without_framework_ranks_every_framework(tmp_path, monkeypatch):
    """The issue's command as written: no --framework means every runner present, ranked together."""
    monkeypatch.setenv("DLBENCH_STORE", str(tmp_path / "empty-store"))
    code, out, err = invoke("predict", "--suite", "cnn", "--machine", "a100", "--machine", "h100",
                            "--machine", "h200", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    rows = [r for r in data["rows"] if r["benchmark"] == "resnet50-train"]
    assert {r["framework"] for r in rows} == set(data["frameworks"]) and len(data["frameworks"]) >= 2
    ranks = [r["rank"] for r in rows]  # ranked rows in order; ties share a rank
    assert len(rows) == 3 * len(data["frameworks"]) and ranks[0] == 1 and ranks == sorted(ranks)
    assert all(rank <= i for i, rank in enumerate(ranks, 1)) and len(set(ranks)) >= 3
    code, _, err = invoke("predict", "--suite", "cnn", "--framework", "caffe", "--machine", "h200")
    assert code == 2 and "caffe" in err
