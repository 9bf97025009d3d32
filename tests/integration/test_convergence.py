"""The convergence suite (issue 21) in every framework's real environment: small IDX and
CIFAR-binary files written here and read back through each framework's own input pipeline
(DataLoader, tf.data, grain, Gluon DataLoader); resnet56 trained end to end on a tiny CIFAR-binary
set (the path, no target); the digits_cnn task reaching its 97% target (one seed each, the `smoke`
profile), with MLLOG files that the strict reader accepts; and digits_fcn5, as the shipped suite
trains it, leaving the sigmoid plateau within its first two epochs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from dlbench import paths
from dlbench.cli import app
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.definitions.convergence import DATASETS
from dlbench.execution.convergence import convergence_request
from dlbench.execution.environments import VenvBackend
from dlbench.execution.registry import RunnerRegistry
from dlbench.store.store import Store

import mllog_reader

from dataset_files import write_cifar_set, write_idx_set

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = ["torch", "tensorflow", "jax", "mxnet"]
PROBE = Path(__file__).with_name("convergence_pipeline_probe.py")
TASKS = """
name: conv_paths
kind: convergence
runs: {smoke: 1, default: 1, paper: 1}
tasks:
  - name: NAME
    network: NETWORK
    dataset: {name: DATASET, train_samples: 16, eval_samples: 6}
    batch_size: 4
    optimizer: {name: sgd_momentum, learning_rate: 0.01, momentum: 0.9, weight_decay: 0.0005, warmup_epochs: 0.5,
                decay: {kind: step, boundaries: [1]}}
    target: {value: 1.0}
    max_epochs: 2
    AUGMENT
    loader_workers: 1
"""


def suite(tmp_path: Path, name: str, network: str, dataset: str, augment: str = "") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(TASKS.replace("NAME", name).replace("NETWORK", network).replace("DATASET", dataset)
                    .replace("AUGMENT", augment or "precision: fp32"))
    return path


@pytest.fixture(scope="module", params=FRAMEWORKS)
def framework_env(request):
    runner = RunnerRegistry(paths.runners_dir()).get(request.param)
    return runner, VenvBackend(paths.cache_dir()).ensure(runner, "cpu")


def probe(framework_env, tmp_path, task_file: Path, data: Path) -> dict:
    runner, env = framework_env
    (task,) = SuiteCatalog(ROOT / "suites").load_convergence_suite(task_file, "smoke", "cpu")
    req = convergence_request(task, runner.name, 0, "cpu", 1, data, tmp_path / "unused.log", "test")
    (tmp_path / "request.json").write_text(json.dumps(req))
    out = tmp_path / "batches.npz"
    done = subprocess.run([str(env.python), str(PROBE), str(runner.worker.parent), str(tmp_path / "request.json"),
                           str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with np.load(out) as f:
        return {k: f[k] for k in f.files}


def expected(x_uint8, dataset: str, flat: bool, channels_last: bool):
    d = DATASETS[dataset]
    m = np.asarray(d.mean, np.float32).reshape(1, -1, 1, 1)
    s = np.asarray(d.std, np.float32).reshape(1, -1, 1, 1)
    x = (x_uint8.astype(np.float32) / 255.0 - m) / s
    if flat:
        return x.reshape(len(x), -1)
    return x.transpose(0, 2, 3, 1) if channels_last else x


def gathered(batches: dict, prefix: str):
    keys = sorted((k for k in batches if k.startswith(f"{prefix}_x")), key=lambda k: int(k[len(prefix) + 2:]))
    xs, ys = [], []
    for k in keys:
        i = k[len(prefix) + 2:]
        n = int(batches[f"{prefix}_n{i}"]) if f"{prefix}_n{i}" in batches else len(batches[f"{prefix}_y{i}"])
        xs.append(batches[k][:n])
        ys.append(batches[f"{prefix}_y{i}"][:n])
    return np.concatenate(xs), np.concatenate(ys).astype(np.int64)


def test_idx_files_read_back_through_the_frameworks_pipeline(framework_env, tmp_path):
    arrays = write_idx_set(tmp_path / "mnist", n_train=16, n_eval=6, gz=True)
    batches = probe(framework_env, tmp_path, suite(tmp_path, "mnist_fcn5", "fcn5", "mnist"), tmp_path / "mnist")
    x, y = gathered(batches, "eval")  # in file order, unaugmented
    want = expected(arrays["t10k-images-idx3-ubyte"][:, None], "mnist", flat=True, channels_last=False)
    np.testing.assert_allclose(x.reshape(len(x), -1), want, rtol=1e-6, atol=1e-6)
    assert np.array_equal(y, arrays["t10k-labels-idx1-ubyte"].astype(np.int64))
    assert int(batches["eval_count"]) == 6
    x, y = gathered(batches, "train")  # one epoch: 4 batches of 4, shuffled, every sample once
    train = expected(arrays["train-images-idx3-ubyte"][:, None], "mnist", flat=True, channels_last=False)
    assert len(y) == 16
    order = [int(np.argmin(np.abs(train - row).sum(axis=1))) for row in x.reshape(len(x), -1)]
    assert sorted(order) == list(range(16))
    np.testing.assert_allclose(x.reshape(len(x), -1), train[order], rtol=1e-6, atol=1e-6)
    assert np.array_equal(y, arrays["train-labels-idx1-ubyte"].astype(np.int64)[order])


def test_cifar_binary_files_read_back_through_the_frameworks_pipeline(framework_env, tmp_path):
    images, labels = write_cifar_set(tmp_path / "cifar", per_file=8)
    task = suite(tmp_path, "cifar_alexnet_r", "alexnet_r", "cifar10",  # the pipeline, on a network quick to build
                 "augmentation: {crop_padding: 4, horizontal_flip: true}")
    batches = probe(framework_env, tmp_path, task, tmp_path / "cifar")
    channels_last = framework_env[0].name in ("tensorflow", "jax")
    x, y = gathered(batches, "eval")
    want = expected(images[5][:6], "cifar10", flat=False, channels_last=channels_last)  # the task's first 6
    np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-5)
    assert np.array_equal(y, labels[5][:6].astype(np.int64))
    x, y = gathered(batches, "train")  # augmented: shapes and labels, and the crops show padding
    assert x.shape == ((16, 32, 32, 3) if channels_last else (16, 3, 32, 32))
    assert set(y.tolist()) <= set(np.concatenate(labels[:5]).tolist())
    zero = expected(np.zeros((1, 3, 1, 1), np.uint8), "cifar10", flat=False, channels_last=False).reshape(3)
    axis = -1 if channels_last else 1
    padded = np.all(np.isclose(np.moveaxis(x, axis, -1), zero, atol=1e-5), axis=-1)
    assert padded.any()  # random crops of zero-padded images bring padding in


def run_cli(*args):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def test_resnet56_trains_end_to_end_on_a_tiny_cifar_set(framework_env, tmp_path):
    write_cifar_set(tmp_path / "cifar", per_file=8)
    store = tmp_path / "store"
    task = suite(tmp_path, "cifar_resnet56", "resnet56", "cifar10",
                 "augmentation: {crop_padding: 4, horizontal_flip: true}")
    result = run_cli("run", "--suite", str(task), "--framework", framework_env[0].name, "--profile", "smoke",
                     "--threads", "2", "--data", str(tmp_path / "cifar"), "--store", str(store))
    (record,) = list(Store(store).records())
    (run,) = record.convergence.runs
    assert run.status == "ok", (record.reason, record.output_tail)
    assert run.epochs == 2 and run.steps == 8 and len(run.evals) == 2 and run.train_samples == 16
    assert result.exit_code == (0 if run.reached else 1)
    events = mllog_reader.read(store / run.mllog)
    assert [e for e in events if e["key"] == "augmentation"][0]["value"] == {"crop_padding": 4, "horizontal_flip": True}


@pytest.mark.parametrize("task", ["digits_cnn"])
def test_the_digits_reach_their_target(framework_env, tmp_path, task):
    store = tmp_path / "store"
    result = run_cli("run", "--suite", "convergence", "--framework", framework_env[0].name, "--profile", "smoke",
                     "--benchmark", task, "--threads", "2", "--store", str(store))
    (record,) = list(Store(store).records())
    assert result.exit_code == 0, (record.reason, record.output_tail[-2000:])
    (run,) = record.convergence.runs
    assert run.reached and run.evals[-1]["accuracy"] >= 0.97 and record.convergence.score_s == run.time_to_target_s
    events = mllog_reader.read(store / run.mllog)
    assert mllog_reader.accuracies(events)[-1][1] >= 0.97


def test_fcn5_leaves_the_sigmoid_plateau_in_two_epochs(framework_env, tmp_path):
    """The shipped digits_fcn5 task, cut to 2 epochs (its warm-up, then the cosine) with a 50%
    target: at the frameworks' own initialisations it stayed at chance (10%) for tens of epochs;
    with the network's described N(0, 16/F) weights torch was at 61-79% after one in trials. Seconds per
    framework, where the full task to 97% takes minutes."""
    shipped = yaml.safe_load((ROOT / "suites" / "convergence.yaml").read_text())
    (task,) = [t for t in shipped["tasks"] if t["name"] == "digits_fcn5"]
    task.update(max_epochs=2, target={"metric": "top1", "value": 0.5})
    path = tmp_path / "fcn5_two_epochs.yaml"
    path.write_text(yaml.safe_dump({"name": "fcn5_two_epochs", "kind": "convergence",
                                    "runs": {"smoke": 1, "default": 1, "paper": 1}, "tasks": [task]}))
    store = tmp_path / "store"
    result = run_cli("run", "--suite", str(path), "--framework", framework_env[0].name, "--profile", "smoke",
                     "--threads", "2", "--store", str(store))
    (record,) = list(Store(store).records())
    assert result.exit_code == 0, (record.reason, record.output_tail[-2000:])
    (run,) = record.convergence.runs
    assert run.reached and run.evals[-1]["accuracy"] >= 0.5, run.evals
