"""The PyTorch runner in its real, dlbench-built venv (the `smoke` profile; minutes, not hours)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from dlbench import paths
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.definitions.loader import load_network
from dlbench.definitions.weights import random_weights
from dlbench.execution.environments import VenvBackend
from dlbench.execution.equivalence import _probe, make_inputs
from dlbench.execution.launcher import run_worker
from dlbench.execution.orchestrator import PROTOCOL_VERSION
from dlbench.execution.registry import RunnerRegistry
from dlbench.performance import yardstick

from .transformer_step import assert_tiny_step

pytestmark = pytest.mark.integration

NETWORKS = ["fcn5", "fcn8", "alexnet_r", "resnet56", "alexnet", "resnet50", "lstm32", "lstm64", "transformer_tiny"]
SMOKE_POLICY = {"warmup": {"min_iters": 1, "max_iters": 3, "max_time_s": 5, "window": 1, "tolerance": 0.5},
                "measure": {"min_iters": 5, "min_time_s": 0.0, "max_iters": 5}}


@pytest.fixture(scope="module")
def torch_env():
    runner = RunnerRegistry(paths.runners_dir()).get("torch")
    return runner, VenvBackend(paths.cache_dir()).ensure(runner, "cpu")


def _request(network: dict, action: str, mode: str = "train", batch: int = 2, precision: str = "fp32",
             compile: str | None = None) -> dict:
    req = {"protocol": PROTOCOL_VERSION, "action": action, "network": network, "mode": mode,
           "batch_size": batch, "precision": precision, "device": "cpu", "threads": 1,
           "learning_rate": 0.01, "momentum": 0.9, "seed": 0, "policy": SMOKE_POLICY}
    if compile is not None:
        req["compile"] = compile
    return req


def _assert_fp32_pinned(eff: dict, reductions_pinned: bool = True):
    """TF32 off on every backend torch has, as torch reads it back (the same code runs on the GPU)."""
    assert eff["torch.backends.cuda.matmul.allow_tf32"] is False
    assert eff["torch.backends.cudnn.allow_tf32"] is False
    assert eff["torch.get_float32_matmul_precision()"] == "highest"
    knobs = {k: v for k, v in eff.items() if k.endswith(".fp32_precision")}
    assert "torch.backends.cuda.matmul.fp32_precision" in knobs  # torch 2.13 has the per-backend knobs
    assert set(knobs.values()) == {"ieee"}, knobs
    reductions = [v for k, v in eff.items() if k.endswith("_reduced_precision_reduction")]
    assert len(reductions) == 2 and (not reductions_pinned or not any(reductions))


def test_environment_is_isolated_and_pinned(torch_env):
    runner, env = torch_env
    assert env.python != Path(sys.executable)
    assert any(p.lower().startswith("torch==2.13.0") for p in env.packages)
    # The controller is not in the framework environment (typer is now: transformers' hub CLI needs it).
    assert not any(p.lower().startswith("dlbench==") for p in env.packages)


@pytest.mark.parametrize("name", NETWORKS)
def test_parameter_count_built_by_torch_equals_description(torch_env, name):
    runner, env = torch_env
    summary = load_network(paths.suites_dir() / "networks" / f"{name}.yaml")
    outcome = run_worker(env.python, runner.worker, _request(summary.resolved, "inspect"), timeout_s=300)
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    assert outcome.result["params"] == summary.params
    assert tuple(outcome.result["output_shape"]) == summary.output_shape
    assert outcome.result["framework"]["version"].startswith("2.13.0")


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_worker_measures_and_applies_threads(torch_env, mode):
    runner, env = torch_env
    summary = load_network(paths.suites_dir() / "networks" / "alexnet_r.yaml")
    request = _request(summary.resolved, "benchmark", mode, 4)
    if mode == "train":
        request["yardstick"] = yardstick.request()
    outcome = run_worker(env.python, runner.worker, request, timeout_s=300)
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    res = outcome.result
    assert len(res["iter_s"]) == 5 and all(t > 0 for t in res["iter_s"])
    assert res["first_iter_s"] > 0
    assert res["threads"]["intra_op"] == 1
    # the yardstick, asked for in training only, timed in this framework before the network was built
    if mode == "train":
        assert [e["status"] for e in res["yardstick"]] == ["ok", "ok"], res["yardstick"]
        assert set(yardstick.times(res["yardstick"])) == {spec.key for spec in yardstick.YARDSTICK}
    else:
        assert "yardstick" not in res
    # fp32 eager, the runner's default compile mode: read back and recorded
    settings = res["settings"]
    assert settings["precision"] == "fp32"
    eff = settings["precision_effective"]
    _assert_fp32_pinned(eff)
    assert eff["first_layer_output_dtype"] == eff["logits_dtype"] == "float32"
    assert eff["autocast"] is None and eff["loss_scale"] is None
    assert settings["compile"]["mode"] == "eager" and settings["compile"]["requested"] is None
    assert res["memory"] == {"unavailable": "torch keeps no allocator statistics for the CPU"}
    assert "compile" not in res  # no compiler ran, no counters
    start, end = res["window_monotonic_ns"]
    assert end - start >= int(sum(res["iter_s"]) * 1e9 * 0.99)


def test_cuda_request_on_a_cpu_host_is_skipped(torch_env):
    runner, env = torch_env
    summary = load_network(paths.suites_dir() / "networks" / "fcn5.yaml")
    req = _request(summary.resolved, "inspect")
    req["device"] = "cuda"
    outcome = run_worker(env.python, runner.worker, req, timeout_s=300)
    assert outcome.status == "skipped"
    assert "CUDA" in outcome.reason


@pytest.mark.parametrize("suite", ["cnn", "fcn", "rnn"])
def test_cli_runs_suite_records_and_reports(torch_env, tmp_path, suite):
    store, site = tmp_path / "store", tmp_path / "site"
    dlbench = [sys.executable, "-m", "dlbench.cli"]
    run = subprocess.run(dlbench + ["run", "--no-check", "--suite", suite, "--framework", "torch", "--profile", "smoke",
                                    "--device", "cpu", "--store", str(store)],
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = json.loads(subprocess.run(dlbench + ["results", "--store", str(store), "--format", "json"],
                                     capture_output=True, text=True, check=True).stdout)
    benchmarks = SuiteCatalog(paths.suites_dir()).load_suite(paths.suites_dir() / f"{suite}.yaml", "smoke", "cpu").benchmarks
    assert sorted(r["benchmark"] for r in rows) == sorted(b.name for b in benchmarks)
    for r in rows:
        assert r["status"] == "ok" and r["framework"] == "torch"
        assert r["params"] == r["params_described"]
        repeats = SuiteCatalog(paths.suites_dir()).profiles().smoke.repeats
        assert r["repeats"] == repeats and r["iterations"] >= 5 * repeats
        assert r["samples_per_s"] > 0
    rep = subprocess.run(dlbench + ["report", "--store", str(store), "--out", str(site)],
                         capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr
    html = (site / "index.html").read_text()
    for b in benchmarks:
        assert b.name in html


def test_quick_calibrate_measures_class_efficiencies_that_predictions_use(torch_env, tmp_path):
    """`calibrate --quick` on torch alone: the ceilings, then one layer shape per operation class in one
    worker; the profile keeps them, each class's efficiency is a positive fraction of the roofline,
    and a network none of whose shapes was timed is predicted mostly from them."""
    from dlbench.machine import fingerprint
    from dlbench.performance.model import class_points
    from dlbench.store.profiles import ProfileStore
    from dlbench.store.store import Store

    store = tmp_path / "store"
    dlbench = [sys.executable, "-m", "dlbench.cli"]
    cal = subprocess.run(dlbench + ["calibrate", "--quick", "--framework", "torch", "--device", "cpu", "--threads", "1",
                                    "--store", str(store)], capture_output=True, text=True, timeout=600)
    assert cal.returncode == 0, cal.stdout + cal.stderr
    profile = ProfileStore(Store(store)).latest(fingerprint()["machine_id"])
    assert "torch" in profile.class_probes, cal.stderr
    kinds = {p.spec["kind"] for p in profile.class_probes["torch"]}
    # the cheap classes always fit the budget (a slow one may be left out on a loaded machine, and says so)
    assert {"matmul", "conv2d_fwd", "conv2d_bwd", "attention_fwd", "layer_norm_fwd", "gelu_fwd", "pool2d_fwd",
            "pool2d_bwd", "softmax_xent_fwd", "sgd_momentum"} <= kinds
    points = class_points(profile, "torch")
    assert len(points) >= 10 and all(0 < q.efficiency for pts in points.values() for q in pts)
    # alexnet_r at batch 16: its convolutions were probed at the smoke profile's batch (8) only
    pred = subprocess.run(dlbench + ["predict", "--network", "alexnet_r", "--framework", "torch", "--batch", "16",
                                     "--threads", "1", "--store", str(store), "--format", "json"],
                          capture_output=True, text=True, timeout=120)
    assert pred.returncode == 0, pred.stderr
    p = json.loads(pred.stdout)
    assert p["sources"]["class"] > 0.5 and p["iteration_s"] > 0


# ------------------------------------------------------------------ precision x compile mode
# Tiny networks: a conv first layer (autocast runs it in the AMP dtype), a dense-only one for the one
# torch.compile of this module (inductor's C++ build of a small graph: ~25-45 s on 2 cores), an LSTM.
ZOO = {
    "zoo_image": """
input: {kind: tensor, shape: [3, 8, 8], classes: 5}
layers:
  - {type: conv2d, filters: 4, kernel: 3, padding: 1}
  - {type: relu}
  - {type: max_pool, size: 2, stride: 2}
  - {type: flatten}
  - {type: dense, units: 5}
""",
    "zoo_dense": """
input: {kind: tensor, shape: [16], classes: 5}
layers:
  - {type: dense, units: 8}
  - {type: relu}
  - {type: dense, units: 5}
""",
    "zoo_sequence": """
input: {kind: tokens, vocabulary: 20, sequence_length: 4}
layers:
  - {type: embedding, vocabulary: 20, dim: 8}
  - {type: lstm, hidden: 8, layers: 1}
  - {type: dense, units: 20}
""",
}
TF32_ON_CPU = ("tf32: TF32 is a tensor-core mode of NVIDIA GPUs of compute capability 8.0 or newer; "
               "this run is on the CPU")
# (network, mode, precision, compile): the compiled ok run is the only torch.compile here, amp_fp16
# (autocast, GradScaler and inductor together); it starts first, the eager ones run beside it.
RUNS = [
    ("zoo_dense", "train", "amp_fp16", "compiled"),
    ("zoo_dense", "train", "tf32", "compiled"),
    ("zoo_image", "train", "tf32", "eager"),
    ("zoo_image", "train", "amp_bf16", "eager"),
    ("zoo_image", "train", "amp_fp16", "eager"),
    ("zoo_image", "infer", "amp_bf16", "eager"),
    ("zoo_sequence", "train", "amp_fp16", "eager"),
    ("zoo_image", "train", "float32", "eager"),  # the old name: refused
]


@functools.lru_cache(maxsize=None)
def _zoo(name: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="dlbench-torch-zoo-") as tmp:
        path = Path(tmp) / f"{name}.yaml"
        path.write_text(f"name: {name}\n" + ZOO[name])
        return load_network(path).resolved


@pytest.fixture(scope="module")
def precision_runs(torch_env):
    """Every run of RUNS, two at a time: key -> outcome (or the exception)."""
    runner, env = torch_env

    def run(key):
        name, mode, precision, compile = key
        try:
            return run_worker(env.python, runner.worker, _request(_zoo(name), "benchmark", mode, 2, precision, compile),
                              timeout_s=600)
        except Exception as e:  # noqa: BLE001 - reported by the test that reads it
            return e

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(RUNS, pool.map(run, RUNS)))


def _outcome(runs, *key):
    outcome = runs[key]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


@pytest.mark.parametrize("compile", ["eager", "compiled"])
def test_tf32_is_skipped_on_the_cpu(precision_runs, compile):
    network = "zoo_image" if compile == "eager" else "zoo_dense"
    outcome = _outcome(precision_runs, network, "train", "tf32", compile)
    assert outcome.status == "skipped", outcome.reason or outcome.output_tail
    assert outcome.reason == TF32_ON_CPU


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_amp_bf16_runs_the_network_in_bfloat16(precision_runs, mode):
    outcome = _outcome(precision_runs, "zoo_image", mode, "amp_bf16", "eager")
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    res = outcome.result
    assert len(res["iter_s"]) == 5
    eff = res["settings"]["precision_effective"]
    assert res["settings"]["precision"] == "amp_bf16"
    assert eff["autocast"] == "torch.autocast(device_type='cpu', dtype=torch.bfloat16)"
    assert eff["first_layer_output_dtype"] == "bfloat16"  # the convolution, autocast to bfloat16
    assert eff["logits_dtype"] == "bfloat16"  # the last dense layer's output
    assert eff["grad_scaler"] is None and eff["loss_scale"] is None
    _assert_fp32_pinned(eff, reductions_pinned=False)  # what autocast keeps in float32 stays IEEE
    assert res["settings"]["compile"]["mode"] == "eager"


def test_amp_fp16_trains_with_dynamic_loss_scaling_on_the_cpu(precision_runs):
    outcome = _outcome(precision_runs, "zoo_image", "train", "amp_fp16", "eager")
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    eff = outcome.result["settings"]["precision_effective"]
    assert eff["autocast"] == "torch.autocast(device_type='cpu', dtype=torch.float16)"
    assert eff["grad_scaler"] == "torch.amp.GradScaler('cpu')"
    assert eff["loss_scale"] == 65536.0  # GradScaler's initial scale
    assert eff["first_layer_output_dtype"] == eff["logits_dtype"] == "float16"


def test_amp_on_a_layer_torch_cannot_run_in_it_is_skipped_naming_it(precision_runs):
    outcome = _outcome(precision_runs, "zoo_sequence", "train", "amp_fp16", "eager")
    # this CPU's oneDNN has no float16 LSTM (AVX2 host); on one that has, the run is ok in float16
    if outcome.status == "ok":
        assert outcome.result["settings"]["precision_effective"]["logits_dtype"] == "float16"
        return
    assert outcome.status == "skipped", outcome.reason or outcome.output_tail
    assert outcome.reason.startswith("amp_fp16: torch 2.13.0")
    assert "layer 1 (lstm, SequenceLSTM)" in outcome.reason and "(it runs in float32)" in outcome.reason


def test_compiled_runs_torch_compile_and_reports_its_counters(precision_runs):
    outcome = _outcome(precision_runs, "zoo_dense", "train", "amp_fp16", "compiled")
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    res = outcome.result
    settings = res["settings"]
    assert settings["compile"]["mode"] == "compiled" and settings["compile"]["requested"] == "compiled"
    assert settings["compile"]["framework"] == "torch.compile(mode='default', backend='inductor')"
    assert settings["compile"]["suppress_errors"] is False  # a compile error fails the run, never eager
    eff = settings["precision_effective"]
    assert eff["first_layer_output_dtype"] == eff["logits_dtype"] == "float16" and eff["loss_scale"] == 65536.0
    stats = res["compile"]
    assert stats["graph_breaks"] == 0 and stats["recompiles"] == 0
    assert stats["unique_graphs"] == 1 and stats["frames"]["ok"] >= 1
    assert stats["compilations"]["forward"] == 1
    # AOTAutograd's backward: compiled, or served from its cache (a warm TORCHINDUCTOR_CACHE_DIR)
    assert stats["compilations"]["backward"] + stats["aot_autograd"].get("autograd_cache_hit", 0) >= 1
    assert res["first_iter_s"] > 10 * max(res["iter_s"])  # the first iteration paid the compilation
    assert res["memory"] == {"unavailable": "torch keeps no allocator statistics for the CPU"}


def test_the_old_precision_name_is_refused_naming_the_accepted_ones(precision_runs):
    outcome = _outcome(precision_runs, "zoo_image", "train", "float32", "eager")
    assert outcome.status == "failed"
    # refused once, where the harness reads the request (contract.typed_request), before the runner builds anything
    assert ("ValueError: the request's 'precision': precision 'float32' is not one it accepts "
            "(fp32, tf32, amp_bf16, amp_fp16, float64)") in outcome.reason


# ------------------------------------------------------------------ transformers (issue 17): transformer_tiny
# A two-block causal decoder with dropout 0.1 and a tied head: smoke runs in fp32 and amp_bf16, the
# attention kernel torch chose, and the float64 check step against the numpy reference.
TRANSFORMER_RUNS = [("train", "fp32"), ("train", "amp_bf16"), ("infer", "amp_bf16")]
SDPA_KERNEL_NAMES = {"flash", "flash (torch's CPU kernel)", "memory-efficient", "cudnn", "math"}


@functools.lru_cache(maxsize=None)
def _transformer_tiny():
    return load_network(paths.suites_dir() / "networks" / "transformer_tiny.yaml")


@pytest.fixture(scope="module")
def transformer_runs(torch_env):
    """Every run of TRANSFORMER_RUNS, two at a time: key -> outcome (or the exception)."""
    runner, env = torch_env

    def run(key):
        mode, precision = key
        try:
            return run_worker(env.python, runner.worker,
                              _request(_transformer_tiny().resolved, "benchmark", mode, 2, precision), timeout_s=300)
        except Exception as e:  # noqa: BLE001 - reported by the test that reads it
            return e

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(TRANSFORMER_RUNS, pool.map(run, TRANSFORMER_RUNS)))


@pytest.mark.parametrize(("mode", "precision"), TRANSFORMER_RUNS)
def test_transformer_tiny_measures_and_records_its_attention_kernel(transformer_runs, mode, precision):
    outcome = _outcome(transformer_runs, mode, precision)
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    res = outcome.result
    assert len(res["iter_s"]) == 5 and all(t > 0 for t in res["iter_s"])
    assert res["params"] == _transformer_tiny().params and res["output_shape"] == [32, 512]
    settings = res["settings"]
    eff = settings["precision_effective"]
    assert eff["logits_dtype"] == ("bfloat16" if precision == "amp_bf16" else "float32")  # the head's product
    attention = settings["attention"]
    assert attention["function"] == "torch.nn.functional.scaled_dot_product_attention"
    assert set(attention["enabled"]) == {f"torch.backends.cuda.{n}_sdp_enabled()"
                                         for n in ("flash", "mem_efficient", "math", "cudnn")}
    assert attention["kernel"] in SDPA_KERNEL_NAMES, attention  # one kernel for both blocks
    # torch 2.13 on the CPU: its flash kernel, but the math backend for dropout on the probabilities
    # (training at rate 0.1); what it chose is read from the operator it dispatched to
    if mode == "train":
        assert attention["kernel"] == "math" and attention["operator"] == "aten.bmm (the math backend's products)"
    else:
        assert attention["kernel"] == "flash (torch's CPU kernel)"
        assert attention["operator"] == "aten._scaled_dot_product_flash_attention_for_cpu"


def test_transformer_tiny_check_step_matches_numpy_in_float64(torch_env, tmp_path):
    """The check action on transformer_tiny in float64 (dropout off): the canonical tensors exported
    (the tied head's weight only once, as 000.weight), logits and loss equal to the numpy reference's
    to 1e-9, and the tied table's step carries the head's gradient (rows of tokens absent from the
    input move, which only the head reaches)."""
    runner, env = torch_env
    net = _transformer_tiny()
    weights = random_weights(net.resolved, seed=5)
    inputs = make_inputs(net, 2, seed=5)
    np.savez(tmp_path / "weights.npz", **weights)
    np.savez(tmp_path / "inputs.npz", **inputs)
    arrays, reason, status = _probe(runner, env, net, tmp_path, "cpu", 300, tmp_path / "weights.npz",
                                    tmp_path / "inputs.npz", 2, precision="float64")
    assert arrays is not None, f"{status}: {reason}"
    assert_tiny_step(arrays, net, weights, inputs)


# ------------------------------------------------------------------ BERT's input and heads (issue 17)
# The layer-semantics case bert_segments_pretraining_heads (10 tokens, segments 0-4 and 5-9, 2 masked
# positions, a tied masked-LM decoder) with BERT's dropout 0.1 in its block: a training step in fp32
# and amp_bf16, two runs side by side.
BERT_TINY = """
name: bert_tiny
input: {kind: masked_tokens, vocabulary: 11, sequence_length: 10, mask_seed: 4}
layers:
  - {type: embedding, vocabulary: 11, dim: 8}
  - {type: position_embedding, max_length: 12}
  - {type: segment_embedding}
  - {type: layer_norm, eps: 1.0e-3}
  - {type: transformer_block, heads: 2, norm: post, gelu: erf, dropout: 0.1, eps: 1.0e-3}
  - {type: pretraining_heads, gelu: erf, eps: 1.0e-3, tied: true}
loss: masked_lm_and_next_sentence
"""
BERT_PRECISIONS = ["fp32", "amp_bf16"]


@pytest.fixture(scope="module")
def bert_runs(torch_env, tmp_path_factory):
    """(network summary, precision -> outcome or the exception) for a train step in each of BERT_PRECISIONS."""
    runner, env = torch_env
    path = tmp_path_factory.mktemp("bert") / "bert_tiny.yaml"
    path.write_text(BERT_TINY)
    net = load_network(path)

    def run(precision):
        try:
            return run_worker(env.python, runner.worker, _request(net.resolved, "benchmark", "train", 2, precision),
                              timeout_s=300)
        except Exception as e:  # noqa: BLE001 - reported by the test that reads it
            return e

    with ThreadPoolExecutor(2) as pool:
        return net, {(precision,): outcome for precision, outcome in zip(BERT_PRECISIONS, pool.map(run, BERT_PRECISIONS))}


@pytest.mark.parametrize("precision", BERT_PRECISIONS)
def test_masked_tokens_network_trains_with_pretraining_heads(bert_runs, precision):
    net, runs = bert_runs
    outcome = _outcome(runs, precision)
    assert outcome.status == "ok", outcome.reason or outcome.output_tail
    res = outcome.result
    assert len(res["iter_s"]) == 5 and all(t > 0 for t in res["iter_s"])
    masked = net.resolved["input"]["masked_positions"]
    assert len(masked) == 2
    # the tied decoder shares the embedding's table: counted once, as the description counts it
    assert res["params"] == net.params and res["output_shape"] == [2, 11]  # (M, V): the masked-LM logits
    eff = res["settings"]["precision_effective"]
    assert eff["logits_dtype"] == ("bfloat16" if precision == "amp_bf16" else "float32")  # the decoder's product
    attention = res["settings"]["attention"]
    assert attention["function"] == "torch.nn.functional.scaled_dot_product_attention"
    # torch 2.13 on the CPU trains with dropout on the probabilities in the math backend
    assert attention["kernel"] == "math" and attention["operator"] == "aten.bmm (the math backend's products)"
