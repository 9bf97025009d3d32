"""The kernels suite's file, its kernels, the device's dtypes, pooling worker results, kernel records,
and the calibration that turns them (and comm records) into a machine profile."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
from store_records import make_record

from dlbench.definitions.catalog import SuiteCatalog
from dlbench.definitions.loader import DefinitionError
from dlbench.execution.kernels import run_kernels
from dlbench.execution.launcher import WorkerOutcome
from dlbench.machine import dtype_support
from dlbench.performance.calibration import CalibrationError, calibration_specs, ceilings, comm_fits, fit_line
from dlbench.performance.kernel_suite import KernelPolicy, load_kernel_suite
from dlbench.performance.kernels import KernelSpec
from dlbench.store.kernels import KernelRecord, KernelResult, KernelStore
from dlbench.store.record import CommInfo, CommSize
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[2]
CATALOG = SuiteCatalog(ROOT / "suites")
KERNELS = ROOT / "suites" / "kernels.yaml"


# ------------------------------------------------------------------ the suite file

def test_shipped_suite_resolves_in_every_profile_and_smoke_stays_small():
    sizes = {}
    for profile in ("smoke", "default", "paper"):
        suite = load_kernel_suite(KERNELS, CATALOG, profile, "cpu")
        sizes[profile] = sum(len(b.specs) for b in suite.benchmarks)
    assert sizes["smoke"] < 100 < sizes["default"] <= sizes["paper"]
    smoke = {b.name: b for b in load_kernel_suite(KERNELS, CATALOG, "smoke", "cpu").benchmarks}
    assert "cnn-layers-reduced" not in smoke  # `networks: {smoke: []}` leaves it out of smoke
    keys = {s.key for s in smoke["fcn-layers"].specs}
    # fcn5 at the fcn suite's smoke batch (16): forward, input-gradient and weight-gradient GEMMs
    assert {"matmul m=16 n=2048 k=784 float32", "matmul m=16 n=2048 k=4096 float32",
            "matmul m=784 n=2048 k=16 float32"} <= keys
    assert "matmul m=16 n=784 k=2048 float32" not in keys  # the first layer has no input gradient
    default = {b.name: b for b in load_kernel_suite(KERNELS, CATALOG, "default", "cpu").benchmarks}
    assert {s.dtype for s in default["matmul"].specs} == {"float32", "bfloat16", "float16"}
    step = {"softmax_xent_fwd", "softmax_xent_bwd", "sgd_momentum"}  # the loss and the update
    pools = {"pool2d_fwd", "pool2d_bwd"}
    norms = {"batch_norm_fwd", "batch_norm_bwd"}  # the resnets' batch norms, in training
    assert {s.kind for s in default["cnn-layers"].specs} == {"conv2d_fwd", "conv2d_bwd", "matmul", "dense_bwd"} | pools | norms | step
    # resnet56's first stage at batch 32, its input gradient wanted (a convolution precedes every batch norm)
    assert {"batch_norm_fwd batch=32 channels=16 height=32 width=32 float32",
            "batch_norm_bwd batch=32 channels=16 height=32 width=32 input_grad=1 float32"} <= {
        s.key for s in default["cnn-layers"].specs}
    # alexnet_r's two max-pools and its average pool, resnet56's global average (the window of its 8x8 map)
    assert {s.pool_op for s in default["cnn-layers"].specs if s.kind in pools} == {"max", "avg", "global"}
    assert {s.kind for s in default["rnn-layers"].specs} == {"lstm_step_fwd", "lstm_step_bwd", "lstm_layer_fwd",
                                                             "lstm_layer_bwd", "matmul", "dense_bwd"} | step
    assert "sgd_momentum elements=14205962 float32" not in {s.key for s in default["fcn-layers"].specs}
    assert "sgd_momentum elements=8392704 float32" in {s.key for s in default["fcn-layers"].specs}  # a layer's
    assert {s.kind for s in default["cnn-layers-reduced"].specs} == {"conv2d_fwd", "conv2d_bwd", "matmul", "dense_bwd"} | pools | norms
    # the distributed suite's per-worker batches at 1 and 2 workers (strong scaling: half of each global batch)
    assert default["distributed-layers"].source == ("layers of fcn5 b=128, fcn5 b=64, resnet56 b=32, resnet56 b=16, "
                                                    "lstm32 b=32, lstm32 b=16, resnet50 b=8, resnet50 b=4, "
                                                    "moe_tiny b=32, moe_tiny b=16")
    assert "matmul m=64 n=2048 k=784 float32" in {s.key for s in default["distributed-layers"].specs}
    assert "distributed-layers" not in smoke
    # the transformer suite's networks at its CPU sequence lengths and batches: gpt2_small at 2 x 128
    # tokens (12 causal heads of 64, dropout 0.1 on the probabilities in training, none in inference),
    # vit_b16 at 4 x 197 tokens; attention's core fused and its batched products, layer norm, GELU
    layers = {s.key for s in default["transformer-layers"].specs}
    assert {"attention_fwd batch=2 heads=12 steps=128 head_size=64 causal=1 dropout=100 float32",
            "attention_bwd batch=2 heads=12 steps=128 head_size=64 causal=1 dropout=100 float32",
            "attention_fwd batch=2 heads=12 steps=128 head_size=64 causal=1 dropout=0 float32",
            "batched_matmul batch=24 m=128 n=128 k=64 float32", "batched_matmul batch=24 m=128 n=64 k=128 float32",
            "attention_fwd batch=4 heads=12 steps=197 head_size=64 causal=0 dropout=0 float32",
            "layer_norm_fwd rows=256 dim=768 float32", "layer_norm_bwd rows=788 dim=768 input_grad=1 float32",
            "gelu_fwd elements=786432 approximate=1 float32", "gelu_bwd elements=2420736 approximate=0 float32",
            "matmul m=256 n=50257 k=768 float32"} <= layers
    assert default["transformer-layers"].source == "layers of transformer_tiny b=16, gpt2_small b=2, bert_base b=2, vit_b16 b=4"
    assert {s["batch"] for s in smoke["transformer-layers"].specs if s.kind == "attention_fwd"} == {4}
    assert not {s.kind for s in default["transformer-layers-reduced"].specs} & step
    # the layer shapes follow the device's batch sizes (cnn: 64 on cpu, 1024 on cuda for alexnet_r)
    cuda = {b.name: b for b in load_kernel_suite(KERNELS, CATALOG, "default", "cuda").benchmarks}
    assert any(s.kind == "conv2d_fwd" and s["batch"] == 1024 for s in cuda["cnn-layers"].specs)


BASE = """name: k
kind: kernels
policy:
  smoke: {}
  default: {}
  paper: {}
ceilings: {matmul_sizes: [64], dtypes: [float32], copy_bytes: [4096], policy: {}}
benchmarks:
"""


@pytest.mark.parametrize("entries, field, words", [
    ("  - {name: a, kind: fft, sizes: {smoke: [1], default: [1], paper: [1]}, dtypes: [float32]}\n",
     "benchmarks[0]", "fft"),
    ("  - {name: a, kind: layer_shapes, suite: nope, dtypes: [float32]}\n", "benchmarks[0].suite", "unknown suite 'nope'"),
    ("  - {name: a, kind: layer_shapes, suite: fcn, networks: {smoke: [alexnet]}, dtypes: [float32]}\n",
     "benchmarks[0].networks.smoke[0]", "not a network of suite fcn"),
    ("  - {name: a, kind: layer_shapes, suite: fcn, dtypes: [float32, float32]}\n", "benchmarks[0].dtypes", "twice"),
    ("  - {name: a, kind: layer_shapes, suite: fcn, dtypes: [int8]}\n", "benchmarks[0].dtypes[0]", "float32"),
    ("  - {name: a, kind: layer_shapes, suite: fcn, dtypes: [float32]}\n  - {name: a, kind: layer_shapes, suite: rnn, "
     "dtypes: [float32]}\n", "benchmarks", "'a' is listed twice"),
    ("  - {name: a, kind: layer_shapes, suite: fcn, dtypes: [float32], colour: red}\n", "benchmarks[0].colour",
     "unknown field"),
    ("  - {name: a, kind: layer_shapes, suite: fcn, workers: [2], dtypes: [float32]}\n", "benchmarks[0].workers",
     "apply to a distributed suite"),
    ("  - {name: a, kind: layer_shapes, suite: distributed, workers: [3], dtypes: [float32]}\n",
     "benchmarks[0].workers", "3 workers cannot split"),
])
def test_a_bad_kernel_suite_names_file_and_field(tmp_path, entries, field, words):
    path = tmp_path / "mine.yaml"
    path.write_text(BASE + entries)
    with pytest.raises(DefinitionError) as info:
        load_kernel_suite(path, CATALOG, "smoke", "cpu")
    assert info.value.path == str(path) and info.value.field == field
    assert words in info.value.reason


# ------------------------------------------------------------------ the device

def test_reduced_precision_needs_the_arithmetic():
    assert dtype_support("cpu", flags={"avx2"}) == {
        "float32": None, "bfloat16": "this CPU has no bfloat16 arithmetic (neither avx512_bf16 nor amx_bf16)",
        "float16": "this CPU has no float16 arithmetic (neither avx512_fp16 nor amx_fp16)"}
    both = dtype_support("cpu", flags={"amx_bf16", "avx512_fp16"})
    assert both["bfloat16"] is None and both["float16"] is None
    assert dtype_support("cuda", capability=(7, 0))["bfloat16"] == "compute capability 7.0 < 8.0"
    assert dtype_support("cuda", capability=(7, 0))["float16"] is None
    assert dtype_support("cuda", capability=None) == {"float32": None, "float16": None, "bfloat16": None}


def test_cold_kernels_flush_one_and_a_half_last_level_caches(tmp_path):
    from dlbench.execution.kernels import flush_bytes
    from dlbench.machine import last_level_cache_bytes

    for index, size in (("index0", "48K"), ("index2", "2048K"), ("index3", "300M")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path) == 300 << 20
    assert last_level_cache_bytes(tmp_path / "none") is None
    cold, warm = KernelPolicy(), KernelPolicy(cache="warm")
    assert flush_bytes(cold, "cpu", llc=100 << 20) == 150 << 20
    assert flush_bytes(cold, "cpu", llc=4 << 30) == 1 << 30  # at most 1 GiB
    assert flush_bytes(warm, "cpu", llc=100 << 20) == 0 and flush_bytes(cold, "cuda", llc=100 << 20) == 0


# ------------------------------------------------------------------ pooling what workers return

SPECS = [KernelSpec.of("matmul", m=4, n=4, k=4), KernelSpec.of("matmul", "bfloat16", m=4, n=4, k=4),
         KernelSpec.of("conv2d_bwd", batch=1, channels=1, height=4, width=4, filters=1, kh=3, kw=3, sh=1, sw=1,
                       ph=1, pw=1, input_grad=1),
         KernelSpec.of("transpose", rows=8, cols=8)]


def fake_worker(responses):
    """A launcher.run_worker stand-in answering from `responses` (one per call)."""
    calls = []

    def run(python, worker, request, timeout_s, env, monitor, container=None):
        calls.append(request)
        status, entries = responses[len(calls) - 1]
        result = {"status": status, "framework": {"name": "fake"}, "kernels": entries} if status == "ok" else None
        return WorkerOutcome(status, None if status == "ok" else "worker died", result, "tail", -9, 1.0)

    return run, calls


def entry(spec, times, **extra):
    return {"spec": spec.to_dict(), "status": "ok", "times_s": times, "median_s": sorted(times)[len(times) // 2],
            "first_s": 1.0, **extra}


ENV = SimpleNamespace(python="python", container=None)
RUNNER = SimpleNamespace(worker="worker.py", name="fake")


def test_repeats_are_pooled_and_a_gpus_unsupported_dtypes_never_sent():
    mm, bf, conv, tr = SPECS
    responses = [("ok", [entry(mm, [1.0, 2.0, 3.0]), entry(conv, [5.0], forward_median_s=1.0, median_s=4.0),
                         entry(tr, [0.5])]),
                 ("ok", [entry(mm, [4.0, 5.0]), entry(conv, [7.0], forward_median_s=1.0, median_s=6.0),
                         entry(tr, [0.25])])]
    run, calls = fake_worker(responses)
    support = {"float32": None, "bfloat16": "no bfloat16 here"}
    out = run_kernels(ENV, RUNNER, SPECS, KernelPolicy(repeats=2), "cuda", 2, 60.0, support, None, run)
    assert len(calls) == 2 and [k["dtype"] for k in calls[0]["kernels"]] == ["float32"] * 3
    timing = dict(calls[0]["kernel_policy"])
    assert timing.pop("flush_bytes") == 0  # never flushed on a GPU
    assert timing == {"warmup_iters": 2, "min_iters": 5, "min_time_s": 0.2, "max_iters": 1000}
    res = out.results
    assert list(res) == [s.key for s in SPECS]  # the suite's order
    assert res[mm.key].median_s == 3.0 and res[mm.key].times_s == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert res[mm.key].achieved == pytest.approx(128 / 3.0) and res[mm.key].fraction is None
    assert res[bf.key].status == "skipped" and res[bf.key].reason == "no bfloat16 here"
    assert res[conv.key].median_s == 5.0  # median over repeats of (forward+backward) - forward
    assert res[tr.key].unit == "B/s"
    assert out.status == "ok" and len(out.repeats) == 2


def test_a_cpus_missing_arithmetic_is_measured_as_emulated_and_said():
    """An amp_bf16 run on a CPU without bfloat16 instructions pays the emulation: the suite times it."""
    mm, bf = SPECS[0], SPECS[1]
    run, calls = fake_worker([("ok", [entry(mm, [1.0]), entry(bf, [9.0])])])
    support = {"float32": None, "bfloat16": "no bfloat16 here"}
    out = run_kernels(ENV, RUNNER, [mm, bf], KernelPolicy(repeats=1), "cpu", 2, 60.0, support, None, run)
    assert [k["dtype"] for k in calls[0]["kernels"]] == ["float32", "bfloat16"]
    assert out.results[bf.key].status == "ok" and out.results[bf.key].median_s == 9.0
    assert out.results[bf.key].settings["arithmetic"] == "emulated: no bfloat16 here"
    assert "arithmetic" not in out.results[mm.key].settings


def test_a_worker_that_dies_fails_its_kernels_and_stops_the_repeats():
    mm = SPECS[0]
    run, calls = fake_worker([("failed", []), ("ok", [entry(mm, [1.0])])])
    out = run_kernels(ENV, RUNNER, [mm], KernelPolicy(repeats=2), "cpu", 2, 60.0, {"float32": None}, None, run)
    assert len(calls) == 1 and out.status == "failed"
    assert out.results[mm.key].status == "failed" and out.results[mm.key].reason == "worker died"


def test_a_kernel_the_framework_refuses_keeps_its_reason():
    mm = SPECS[0]
    refused = {"spec": mm.to_dict(), "status": "skipped", "reason": "not available in float32: nope"}
    run, _ = fake_worker([("ok", [refused])])
    out = run_kernels(ENV, RUNNER, [mm], KernelPolicy(repeats=1), "cpu", 2, 60.0, {"float32": None}, None, run)
    assert out.results[mm.key].status == "skipped" and "nope" in out.results[mm.key].reason


# ------------------------------------------------------------------ kernel records

def kernel_record(run_id, framework="torch", machine_id="m1", device="cpu", threads=2, times=None,
                  policy=None) -> KernelRecord:
    now = datetime(2026, 12, 1, tzinfo=timezone.utc)
    kernels = [KernelResult(key=k, spec=KernelSpec.of("copy", elements=1).to_dict(), status="ok", median_s=t,
                            flops=0, bytes=8, unit="B/s") for k, t in (times or {}).items()]
    return KernelRecord(run_id=run_id, started_at=now, ended_at=now, dlbench={}, suite="kernels", benchmark="b",
                        source="s", profile="smoke", device=device, framework={"name": framework},
                        environment={}, machine={"machine_id": machine_id}, threads_requested=threads,
                        timeout_s=1.0, policy=policy or {}, status="ok", kernels=kernels)


def test_kernel_records_are_checksummed_and_the_latest_time_wins(tmp_path):
    ks = KernelStore(Store(tmp_path))
    ks.write(kernel_record("20261201T000000Z-a", times={"a": 1.0, "b": 2.0}))  # made before cold timing: warm
    ks.write(kernel_record("20261201T000001Z-b", times={"a": 3.0}, policy={"cache": "cold"}))
    ks.write(kernel_record("20261201T000002Z-c", machine_id="other", times={"a": 9.0}))
    ks.write(kernel_record("20261201T000003Z-d", threads=1, times={"b": 9.0}))
    ks.write(kernel_record("20261201T000004Z-e", device="cuda", times={"a": 0.1}, policy={"cache": "cold"}))
    latest = ks.latest_times("m1", "cpu", threads=2)
    assert latest == {"torch": {"a": (3.0, "20261201T000001Z-b", "cold"), "b": (2.0, "20261201T000000Z-a", "warm")}}
    assert ks.latest_times("m1", "cuda") == {"torch": {"a": (0.1, "20261201T000004Z-e", "warm")}}  # never flushed
    path = tmp_path / "kernels" / "20261201T000000Z-a.json"
    data = json.loads(path.read_text())
    data["kernels"][0]["median_s"] = 0.5
    path.write_text(json.dumps(data))
    problems = []
    assert ks.latest_times("m1", "cpu", 2, problems) == {"torch": {"a": (3.0, "20261201T000001Z-b", "cold")}}
    assert len(problems) == 1 and str(path) in problems[0] and "checksum" in problems[0]


# ------------------------------------------------------------------ calibration

def result(spec: KernelSpec, seconds: float) -> KernelResult:
    return KernelResult(key=spec.key, spec=spec.to_dict(), status="ok", median_s=seconds, flops=spec.flops,
                        bytes=spec.bytes, unit=spec.unit)


def test_ceilings_are_the_best_framework_and_bandwidth_excludes_dispatch():
    suite = load_kernel_suite(KERNELS, CATALOG, "smoke", "cpu")
    specs = calibration_specs(suite.ceilings, {"float32": None, "bfloat16": None, "float16": "no"})
    assert {s.dtype for s in specs if s.kind == "matmul"} == {"float32", "bfloat16"}
    assert {s.kind for s in specs} == {"matmul", "copy", "relu"}
    mm = KernelSpec.of("matmul", m=100, n=100, k=100)  # 2e6 FLOPs
    tiny = KernelSpec.of("copy", elements=128)  # the 1024-byte dispatch copy
    big = KernelSpec.of("copy", elements=1000)  # 8000 bytes
    relu = KernelSpec.of("relu", elements=1000)  # 8000 bytes
    peak, bandwidth, dispatch, elementwise = ceilings({
        "a": [result(mm, 1e-3), result(tiny, 1e-6), result(big, 3e-6), result(relu, 5e-6)],
        "b": [result(mm, 5e-4), result(tiny, 4e-6), result(big, 5e-6)]}, dispatch_bytes=1024)
    assert peak["float32"].flops_per_s == pytest.approx(4e9) and peak["float32"].framework == "b"
    assert dispatch == {"a": 1e-6, "b": 4e-6}
    # a: 8000 B / (3 - 1) us = 4 GB/s; b: 8000 / max(5 - 4, 5 / 2) us = 3.2 GB/s (at most half the
    # time is credited to the call)
    assert [(p.bytes, round(p.bytes_per_s), p.framework) for p in bandwidth] == [(8000, 4_000_000_000, "a")]
    # a's relu: 8000 B / (5 - 1) us = 2 GB/s; b measured none
    assert {fw: [(p.bytes, round(p.bytes_per_s)) for p in pts] for fw, pts in elementwise.items()} == {
        "a": [(8000, 2_000_000_000)]}
    # a relu that is mostly its call (7 us of which 4 us the call) gives no point
    _, _, _, elementwise = ceilings({"b": [result(tiny, 4e-6), result(relu, 7e-6)]}, dispatch_bytes=1024)
    assert elementwise == {}


def test_all_reduce_line_recovered_from_its_points():
    points = [(float(b), 5e-5 + 2e-9 * b) for b in (4, 64, 1024, 1 << 16, 1 << 20, 1 << 24)]
    startup, per_byte, r2 = fit_line(points)
    assert startup == pytest.approx(5e-5, rel=1e-6) and per_byte == pytest.approx(2e-9, rel=1e-6)
    assert r2 == pytest.approx(1.0)
    # relative residuals: a 10% slow largest size does not wipe out the start-up the small ones show
    noisy = points[:-1] + [(points[-1][0], points[-1][1] * 1.1)]
    startup, per_byte, _ = fit_line(noisy)
    assert startup == pytest.approx(5e-5, rel=0.05)
    with pytest.raises(CalibrationError, match="two message sizes"):
        fit_line([(4.0, 1e-5)])


def comm_record(framework, workers, line, machine_id="m1", sizes=(4, 4096, 1 << 20), collective="all_reduce",
                wrong_at=None):
    r = make_record(framework=framework, machine_id=machine_id)
    startup, per_byte = line
    r.suite, r.benchmark = "comm", f"{collective}-w{workers}"
    r.comm = CommInfo(collective=collective, dtype="float32", workers=workers, bus_factor=1.0, sizes=[
        CommSize(size_bytes=s, bytes=s, time_s=startup + per_byte * s, iterations=5,
                 correct=s != wrong_at) for s in sizes])
    return r


def test_all_reduce_fits_from_the_comm_suite_records():
    records = [comm_record("torch", 2, (1e-4, 1e-9)), comm_record("torch", 2, (2e-4, 1e-9)),  # the later wins
               comm_record("torch", 4, (3e-4, 1.5e-9)), comm_record("jax", 2, (1e-4, 1e-9), machine_id="other"),
               comm_record("torch", 2, (1e-4, 1e-9), collective="broadcast")]
    fits, notes = comm_fits(records, "m1", "cpu")
    assert [(f.framework, f.workers) for f in fits] == [("torch", 2), ("torch", 4)]
    two = fits[0]
    assert two.startup_s == pytest.approx(2e-4) and two.per_byte_s == pytest.approx(1e-9)
    # ring: startup = 2(n-1) alpha, per_byte = 2(n-1)/n beta
    assert two.alpha_s == pytest.approx(1e-4) and two.beta_s_per_byte == pytest.approx(1e-9)
    assert fits[1].alpha_s == pytest.approx(5e-5) and fits[1].beta_s_per_byte == pytest.approx(1e-9)
    assert two.points == 3 and two.run_ids == [records[1].run_id]
    only, notes = comm_fits(records, "m1", "cpu", workers=8)
    assert only == [] and "run `dlbench run --suite comm --workers 8` first" in notes[0]
    # all-to-all records give their own line, beside the all-reduce's, its alpha and beta by pairwise
    # exchange: startup = (n-1) alpha, per_byte = (n-1)/n beta
    a2a = [comm_record("torch", 4, (3e-4, 3e-9), collective="all_to_all"),
           comm_record("torch", 2, (1e-4, 1e-9), collective="all_to_all", machine_id="other")]
    fits, _ = comm_fits(records + a2a, "m1", "cpu")
    assert [(f.framework, f.workers, f.collective) for f in fits] == [
        ("torch", 2, "all_reduce"), ("torch", 4, "all_reduce"), ("torch", 4, "all_to_all")]
    assert fits[2].startup_s == pytest.approx(3e-4) and fits[2].per_byte_s == pytest.approx(3e-9)
    assert fits[2].alpha_s == pytest.approx(1e-4) and fits[2].beta_s_per_byte == pytest.approx(4e-9)
    assert fits[2].run_ids == [a2a[0].run_id] and fits[2].r2 == pytest.approx(1.0)
    # a size whose result was wrong is not fitted
    wrong = comm_record("torch", 2, (1e-4, 1e-9), sizes=(4, 4096, 1 << 20, 1 << 22), wrong_at=1 << 22)
    assert comm_fits([wrong], "m1", "cpu")[0][0].points == 3
