"""The convergence suite (issue 21) without a framework: definitions, the dataset files and their
readers (controller and runner side), the score, the learning-rate schedule, the MLLOG files and
the record, through `dlbench run --suite PATH --framework fake` (the fake runner's numpy softmax
regression really trains on the digits)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from runners.common import datasets as runner_datasets  # runners/common/datasets.py (tests/conftest.py puts it on the path)
import mllog_reader
from dataset_files import request_dataset, write_cifar_set, write_idx_set
from runners.common.convergence import learning_rate
from dlbench.analysis.convergence import score
from dlbench.cli import app
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.definitions.convergence import DATASETS
from dlbench.definitions.loader import DefinitionError
from dlbench.execution.datasets import DataError, check_data, digits_folder, digits_split
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[2]
SUITE = """
name: conv_test
kind: convergence
runs: {smoke: 3, default: 3, paper: 3}
tasks:
  - name: digits_linear
    network: digits_fcn5
    dataset: {name: digits}
    batch_size: 32
    optimizer: {name: sgd_momentum, learning_rate: 0.05, momentum: 0.9, weight_decay: 0.0001,
                warmup_epochs: 1, decay: {kind: cosine}}
    target: {value: TARGET}
    max_epochs: EPOCHS
"""


def suite_file(tmp_path: Path, target=0.9, epochs=10, text: str = SUITE) -> Path:
    path = tmp_path / "conv_test.yaml"
    path.write_text(text.replace("TARGET", str(target)).replace("EPOCHS", str(epochs)))
    return path


def load(path: Path, profile="smoke"):
    return SuiteCatalog(ROOT / "suites").load_convergence_suite(path, profile, "cpu")


# --------------------------------------------------------------------------- definitions


def test_the_shipped_suite_loads_with_its_digits_tasks():
    catalog = SuiteCatalog(ROOT / "suites")
    assert "convergence" in catalog.convergence_suite_names()
    assert "convergence" not in catalog.suite_names()  # `--suite all` stays the throughput suites
    tasks = catalog.load_convergence_suite(catalog.suite_path("convergence"), "default", "cpu")
    assert [t.name for t in tasks] == ["digits_cnn", "digits_fcn5"]
    assert all(t.spec.target.value == 0.97 and t.dataset.name == "digits" and len(t.seeds) == 3 for t in tasks)
    cnn, fcn5 = tasks
    assert cnn.network.resolved["input"]["shape"] == [1, 8, 8] and fcn5.network.resolved["input"]["shape"] == [64]
    # FCN-5's layers (suites/networks/fcn5.yaml) on 64 inputs, every weight drawn N(0, 16/F) in every framework
    dense = [layer for layer in fcn5.network.resolved["layers"] if layer["type"] == "dense"]
    assert [layer["units"] for layer in dense] == [2048, 4096, 1024, 10]
    assert [layer["type"] for layer in fcn5.network.resolved["layers"]].count("sigmoid") == 3
    assert all(layer["init"] == {"distribution": "normal", "scale": 16.0, "mode": "fan_in"} for layer in dense)


@pytest.mark.parametrize(("old", "new", "field"), [
    ("batch_size: 32", "batch_size: 0", "tasks[0].batch_size"),
    ("decay: {kind: cosine}", "decay: {kind: linear}", "tasks[0].optimizer.decay"),
    ("target: {value: TARGET}", "target: {value: 1.5}", "tasks[0].target.value"),
    ("dataset: {name: digits}", "dataset: {name: imagenet}", "tasks[0].dataset.name"),
    ("network: digits_fcn5", "network: fcn5", "tasks[0].network"),  # 784 inputs for 8x8 images
    ("network: digits_fcn5", "network: no_such_net", "tasks[0].network"),
    ("max_epochs: EPOCHS", "max_epochs: 1", "tasks[0]"),  # warm-up (1 epoch) must end before the last
    ("batch_size: 32", "batch_size: 32\n    shuffle: true", "tasks[0].shuffle"),
])
def test_a_mistake_is_one_error_naming_the_file_and_the_field(tmp_path, old, new, field):
    path = suite_file(tmp_path, text=SUITE.replace(old, new))
    with pytest.raises(DefinitionError) as info:
        load(path)
    message = str(info.value)
    assert str(path) in message and field in message


def test_step_boundaries_must_increase_and_fit(tmp_path):
    text = SUITE.replace("decay: {kind: cosine}", "decay: {kind: step, boundaries: [5, 3]}")
    with pytest.raises(DefinitionError, match=r"tasks\[0\]\.optimizer\.decay.*increase"):
        load(suite_file(tmp_path, text=text))
    text = SUITE.replace("decay: {kind: cosine}", "decay: {kind: step, boundaries: [3, 12]}")
    with pytest.raises(DefinitionError, match="below max_epochs"):
        load(suite_file(tmp_path, text=text))


def test_a_crop_needs_an_image_network(tmp_path):
    text = SUITE.replace("    max_epochs: EPOCHS", "    max_epochs: EPOCHS\n    augmentation: {crop_padding: 2}")
    with pytest.raises(DefinitionError, match=r"tasks\[0\]\.augmentation\.crop_padding"):
        load(suite_file(tmp_path, text=text))


# --------------------------------------------------------------------------- the schedule


def test_learning_rate_warms_up_linearly_then_decays():
    opt = {"learning_rate": 0.1, "warmup_epochs": 1, "decay": {"kind": "cosine", "final_fraction": 0.0}}
    rates = [learning_rate(s, 10, opt, 5) for s in range(50)]
    assert rates[0] == pytest.approx(0.01) and rates[9] == pytest.approx(0.1)
    assert rates[10] == pytest.approx(0.1)  # the cosine starts at the end of warm-up
    assert rates[30] == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert all(a >= b for a, b in zip(rates[10:], rates[11:]))
    step = {"learning_rate": 0.1, "warmup_epochs": 0, "decay": {"kind": "step", "boundaries": [2, 4], "factor": 0.1}}
    assert [round(learning_rate(s, 10, step, 6), 6) for s in (0, 19, 20, 39, 40)] == [0.1, 0.1, 0.01, 0.01, 0.001]
    assert learning_rate(7, 10, {"learning_rate": 0.3, "warmup_epochs": 0, "decay": {"kind": "constant"}}, 3) == 0.3


# --------------------------------------------------------------------------- the score


def test_the_score_drops_the_fastest_and_the_slowest():
    assert score([10.0, 12.0, 11.0, 30.0, 9.0]).seconds == pytest.approx(11.0)
    s = score([10.0, None, 11.0, 12.0, 9.0])  # one miss allowed: it is the slowest, dropped
    assert s.seconds == pytest.approx(11.0) and s.scored == (0, 2, 3)
    s = score([10.0, None, None, 12.0, 9.0])
    assert s.seconds is None and "2 of 5 runs did not reach" in s.reason
    assert score([4.0]).seconds == 4.0 and score([4.0, None]).seconds is None


# --------------------------------------------------------------------------- files and readers


@pytest.mark.parametrize("gz", [False, True])
def test_idx_files_read_back_plain_or_gzipped(tmp_path, gz):
    arrays = write_idx_set(tmp_path, gz=gz)
    assert check_data(DATASETS["mnist"], tmp_path) == {"train": 12, "eval": 5}
    x, y = runner_datasets.read_split(request_dataset("mnist"), tmp_path, "train")
    assert x.shape == (12, 1, 28, 28) and np.array_equal(x[:, 0], arrays["train-images-idx3-ubyte"])
    assert np.array_equal(y, arrays["train-labels-idx1-ubyte"]) and y.dtype == np.int64


def test_cifar_binary_files_read_back_in_order(tmp_path):
    images, labels = write_cifar_set(tmp_path)
    assert check_data(DATASETS["cifar10"], tmp_path) == {"train": 15, "eval": 3}
    x, y = runner_datasets.read_split(request_dataset("cifar10"), tmp_path, "train")
    assert np.array_equal(x, np.concatenate(images[:5])) and np.array_equal(y, np.concatenate(labels[:5]))
    x, y = runner_datasets.read_split(request_dataset("cifar10"), tmp_path, "eval")
    assert np.array_equal(x, images[5]) and np.array_equal(y, labels[5])


@pytest.mark.parametrize("damage", ["missing", "truncated", "longer", "header", "bad_gzip"])
def test_a_bad_file_is_named_by_both_readers(tmp_path, damage):
    write_idx_set(tmp_path, gz=damage == "bad_gzip")
    name = "train-images-idx3-ubyte"
    path = tmp_path / (name + (".gz" if damage == "bad_gzip" else ""))
    raw = path.read_bytes()
    if damage == "missing":
        path.unlink()
    elif damage == "truncated":
        path.write_bytes(raw[:-7])
    elif damage == "longer":
        path.write_bytes(raw + b"\0")
    elif damage == "header":
        path.write_bytes(b"\x01" + raw[1:])
    else:
        path.write_bytes(raw[:len(raw) // 2])
    with pytest.raises(DataError) as controller:
        check_data(DATASETS["mnist"], tmp_path)
    with pytest.raises(runner_datasets.DatasetError) as runner:
        runner_datasets.read_split(request_dataset("mnist"), tmp_path, "train")
    for e in (controller.value, runner.value):
        assert name in str(e)
    if damage in ("truncated", "longer"):
        word = "truncated" if damage == "truncated" else "wrong size"
        assert word in str(controller.value) and word in str(runner.value)


def test_a_truncated_cifar_file_is_named(tmp_path):
    write_cifar_set(tmp_path)
    path = tmp_path / "data_batch_3.bin"
    path.write_bytes(path.read_bytes()[:-1])
    for reader, error in ((lambda: check_data(DATASETS["cifar10"], tmp_path), DataError),
                          (lambda: runner_datasets.read_split(request_dataset("cifar10"), tmp_path, "train"),
                           runner_datasets.DatasetError)):
        with pytest.raises(error, match="data_batch_3.bin.*whole number"):
            reader()


def test_the_digits_are_exported_once_as_idx_with_a_fixed_stratified_split(tmp_path):
    folder = digits_folder(tmp_path, DATASETS["digits"])
    assert check_data(DATASETS["digits"], folder) == {"train": 1438, "eval": 359}
    assert digits_folder(tmp_path, DATASETS["digits"]) == folder  # reused
    xt, yt, xe, ye = digits_split()
    assert np.bincount(ye).min() >= 35 and xt.max() == 255
    x, y = runner_datasets.read_split(request_dataset("digits"), folder, "eval")
    assert np.array_equal(x[:, 0], xe) and np.array_equal(y, ye)
    from sklearn.datasets import load_digits

    assert len(xt) + len(xe) == len(load_digits().target) == 1797


def test_crop_and_flip_keep_the_shape_and_move_pixels():
    rng = np.random.default_rng(0)
    x = rng.integers(1, 256, (64, 3, 8, 8), dtype=np.uint8)
    out = runner_datasets.crop_flip(x, 2, True, np.random.default_rng(5))
    assert out.shape == x.shape and out.dtype == x.dtype
    assert (out == 0).any()  # padding came in
    same = runner_datasets.crop_flip(x, 2, True, np.random.default_rng(5))
    assert np.array_equal(out, same)  # seeded: the same augmentation wherever it runs
    assert np.array_equal(runner_datasets.crop_flip(x, 0, False, rng), x)


# --------------------------------------------------------------------------- a run, end to end


@pytest.fixture
def conv_project(project, tmp_path, monkeypatch):
    monkeypatch.setenv("DLBENCH_CACHE", str(tmp_path / "cache"))
    return project


def run_cli(*args):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def test_a_convergence_run_writes_its_record_and_strict_mllog_files(conv_project, tmp_path):
    store = tmp_path / "store"
    result = run_cli("run", "--suite", str(suite_file(tmp_path)), "--framework", "fake", "--env", "current",
                     "--profile", "smoke", "--store", str(store))
    assert result.exit_code == 0, result.output
    assert "time to accuracy" in result.output and "3/3" in result.output
    (record,) = list(Store(store).records())
    c = record.convergence
    assert record.status == "ok" and record.workload.mode == "convergence" and record.benchmark == "digits_linear"
    assert [r.seed for r in c.runs] == [0, 1, 2] and c.reached == 3 and c.target == 0.9
    times = sorted(r.time_to_target_s for r in c.runs)
    assert c.score_s == pytest.approx(times[1])  # 3 runs: fastest and slowest dropped
    for run in c.runs:
        assert run.reached and run.evals[-1]["accuracy"] >= 0.9 and run.epochs_to_target == run.evals[-1]["epoch"]
        assert run.init_s >= 0 and run.time_to_target_s <= run.run_s + 1e-9
        assert 0 <= run.input_bound_share <= 1 and run.train_samples == 1438 and run.eval_samples == 359
        path = store / run.mllog
        assert hashlib.sha256(path.read_bytes()).hexdigest() == run.mllog_sha256
        events = mllog_reader.read(path)
        by_key = {e["key"]: e for e in events}
        assert by_key["seed"]["value"] == run.seed and by_key["global_batch_size"]["value"] == 32
        assert by_key["run_stop"]["metadata"]["status"] == "success"
        assert by_key["submission_benchmark"]["value"] == "digits_linear"
        assert by_key["train_samples"]["value"] == 1438 and by_key["eval_samples"]["value"] == 359
        assert [a for _, a in mllog_reader.accuracies(events)] == [e["accuracy"] for e in run.evals]
    shown = run_cli("results", "--store", str(store), "--columns",
                    "benchmark,mode,status,time_to_target_s,epochs_to_target,reached,input_bound_pct")
    assert shown.exit_code == 0, shown.output
    assert "digits_linear" in shown.output and "convergence" in shown.output and "3/3" in shown.output
    assert "time to accuracy" in shown.output and "≥90%" in shown.output


def test_a_target_not_reached_is_reported_and_fails_the_command(conv_project, tmp_path):
    store = tmp_path / "store"
    result = run_cli("run", "--suite", str(suite_file(tmp_path, target=0.999, epochs=2)), "--framework", "fake",
                     "--env", "current", "--profile", "smoke", "--store", str(store))
    assert result.exit_code == 1
    (record,) = list(Store(store).records())
    assert record.status == "failed" and "3 of 3 runs did not reach the target" in record.reason
    for run in record.convergence.runs:
        assert not run.reached and run.epochs == 2
        events = mllog_reader.read(store / run.mllog)
        assert [e for e in events if e["key"] == "run_stop"][0]["metadata"]["status"] == "aborted"


def test_a_worker_that_fails_is_recorded_and_the_suite_goes_on(conv_project, tmp_path, monkeypatch):
    monkeypatch.setenv("DLBENCH_FAKE_BEHAVIOUR", "raise")
    store = tmp_path / "store"
    result = run_cli("run", "--suite", str(suite_file(tmp_path)), "--framework", "fake", "--env", "current",
                     "--profile", "smoke", "--store", str(store))
    assert result.exit_code == 1
    (record,) = list(Store(store).records())
    assert record.status == "failed" and "fake failure while building the network" in record.reason
    assert [r.status for r in record.convergence.runs] == ["failed"] * 3


def test_missing_data_stops_before_anything_runs(conv_project, tmp_path):
    text = SUITE.replace("network: digits_fcn5", "network: fcn5").replace("{name: digits}", "{name: mnist}")
    path = suite_file(tmp_path, text=text)
    store = tmp_path / "store"
    result = run_cli("run", "--suite", str(path), "--framework", "fake", "--env", "current", "--profile", "smoke",
                     "--store", str(store))
    assert result.exit_code == 2 and "--data" in result.output
    write_idx_set(tmp_path / "mnist")
    (tmp_path / "mnist" / "t10k-labels-idx1-ubyte").unlink()
    result = run_cli("run", "--suite", str(path), "--framework", "fake", "--env", "current", "--profile", "smoke",
                     "--store", str(store), "--data", str(tmp_path / "mnist"))
    assert result.exit_code == 2 and "t10k-labels-idx1-ubyte" in result.output and "missing" in result.output
    assert not list(Store(store).records())


def test_the_report_shows_time_to_accuracy_per_run_and_per_benchmark(tmp_path):
    """The v11 fixture (a fake-runner convergence record) in a store: its run page has the score,
    the per-seed table and the accuracy chart; its benchmark page the framework's row and curve."""
    store = tmp_path / "store"
    (store / "runs").mkdir(parents=True)
    fixture = ROOT / "tests" / "fixtures" / "records" / "v11.json"
    data = json.loads(fixture.read_text())
    (store / "runs" / f"{data['run_id']}.json").write_bytes(fixture.read_bytes())
    result = run_cli("report", "--store", str(store), "--out", str(tmp_path / "site"))
    assert result.exit_code == 0, result.output
    run_page = (tmp_path / "site" / "runs" / f"{data['run_id']}.html").read_text()
    c = data["convergence"]
    assert "Time to accuracy" in run_page and "time-to-target" in run_page and "<polyline" in run_page
    assert all(f"seed-{r['seed']}.log" in run_page for r in c["runs"])
    (bench,) = (tmp_path / "site" / "benchmarks").glob("*.html")
    text = bench.read_text()
    assert "Time to accuracy" in text and "3/3" in text and "class=\"marker\"" in text and data["run_id"] in text


def _result(**convergence) -> str:
    run = {"seed": 0, "init_s": 1.0, "reached": True, "epochs": 2, "epochs_to_target": 2, "time_to_target_s": 3.0,
           "run_s": 3.0, "evals": [{"epoch": 1, "accuracy": 0.5, "time_s": 1.0}, {"epoch": 2, "accuracy": 0.98,
                                                                                "time_s": 3.0}],
           "train_s": 2.5, "input_wait_s": 0.1, "input_bound_share": 0.04, "steps": 90, "steps_per_epoch": 45,
           "train_samples": 1438, "eval_samples": 359, **convergence}
    return json.dumps({"protocol": 1, "status": "ok", "framework": {"name": "x"}, "convergence": run})


@pytest.mark.parametrize(("change", "field"), [
    ({"evals": [{"epoch": 1, "accuracy": 1.5, "time_s": 1.0}]}, "convergence.evals[0].accuracy"),
    ({"time_to_target_s": None}, "convergence"),
    ({"input_wait_s": -1.0}, "convergence.input_wait_s"),
    ({"steps": True}, "convergence.steps"),
])
def test_a_worker_convergence_result_is_validated_at_the_boundary(change, field):
    from dlbench.execution.worker_result import ResultError, parse_result

    assert parse_result(_result(), "convergence").convergence.time_to_target_s == 3.0
    with pytest.raises(ResultError) as info:
        parse_result(_result(**change), "convergence")
    assert info.value.field.startswith(field)
    with pytest.raises(ResultError, match="convergence"):
        parse_result(json.dumps({"protocol": 1, "status": "ok", "framework": {"name": "x"}}), "convergence")


def test_list_shows_the_tasks():
    result = run_cli("list", "--suite", "convergence")
    assert result.exit_code == 0, result.output
    for text in ("digits_cnn", "151,306", "digits_fcn5", "12,731,402", "top1 0.97", "0,1,2"):
        assert text in result.output


def test_mllog_files_travel_with_their_record_and_verify_proves_them(conv_project, tmp_path):
    from dlbench.store.merge import merge
    from dlbench.store.verify import verify

    source = tmp_path / "source"
    result = run_cli("run", "--suite", str(suite_file(tmp_path)), "--framework", "fake", "--env", "current",
                     "--profile", "smoke", "--store", str(source))
    assert result.exit_code == 0, result.output
    (record,) = list(Store(source).records())
    logs = [run.mllog for run in record.convergence.runs]
    assert len(logs) == 3 and not verify(Store(source)).problems

    merged = tmp_path / "merged"
    report = merge(Store(merged), [source])
    assert len(report.added) == 1 and not report.unreadable
    for log in logs:  # copied, byte for byte, before the record
        assert (merged / log).read_bytes() == (source / log).read_bytes()
    assert not verify(Store(merged)).problems

    (merged / logs[1]).write_text("not the log the record lists\n")
    problems = verify(Store(merged)).problems
    assert len(problems) == 1 and "checksum mismatch" in problems[0].reason and logs[1] in str(problems[0].path)

    (source / logs[0]).unlink()  # a source record whose MLLOG file is gone is kept out of a merge
    report = merge(Store(tmp_path / "other"), [source])
    assert not report.added and "MLLOG file" in report.unreadable[0][1]
