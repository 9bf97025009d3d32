"""Mode generate in every runner's real environment: transformer_tiny on the smoke profile (a prompt
of 8 tokens, 8 new tokens, batch 2), and `dlbench check --mode generate` across the runners."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dlbench import paths
from dlbench.execution.registry import RunnerRegistry
from dlbench.store.store import Store

pytestmark = pytest.mark.integration

DLBENCH = [sys.executable, "-m", "dlbench.cli"]
FRAMEWORKS = RunnerRegistry(paths.runners_dir()).names()


def generate(store, framework: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(DLBENCH + ["run", "--suite", "transformer", "--benchmark", "transformer_tiny-generate",
                                     "--mode", "generate", "--framework", framework, "--profile", "smoke",
                                     "--device", "cpu", "--repeats", "1", "--no-check", "--store", str(store), *extra],
                          capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_transformer_tiny_generates_with_a_cache(tmp_path, framework):
    run = generate(tmp_path, framework)
    assert run.returncode == 0, run.stdout + run.stderr
    (record,) = list(Store(tmp_path).records())
    assert record.status == "ok" and record.workload.mode == "generate", record.reason
    g = record.generation
    assert (g.prompt_length, g.new_tokens, g.batch_size) == (8, 8, 2)
    assert g.ttft.requests == len(record.repeats[0].iter_s) >= 5
    assert g.ttft.median > 0 and g.tpot.median > 0 and g.tokens_per_s.median > 0
    assert record.params == record.network.params_described  # the network's own weights, built once
    runner = record.settings.runner
    assert runner["generation"]["new_tokens"] == 8 and runner["generation"]["decoding"] == "greedy (argmax)"
    assert "TTFT ms" in run.stdout


def test_torch_compiles_its_decode_step(tmp_path):
    run = generate(tmp_path, "torch", "--compile", "compiled")
    assert run.returncode == 0, run.stdout + run.stderr
    (record,) = list(Store(tmp_path).records())
    assert record.status == "ok", record.reason
    assert record.workload.compile == "compiled"
    assert "torch.compile'd decode step" in record.settings.runner["generation"]["decode"]
    compile_stats = record.repeats[0].compile
    assert compile_stats["recompiles"] == 0 and compile_stats["compilations"]["forward"] >= 1


def test_every_framework_generates_the_same_ids(tmp_path):
    check = subprocess.run(DLBENCH + ["check", "--mode", "generate", "--framework", "all", "--device", "cpu",
                                      "--network", "transformer_tiny", "--store", str(tmp_path)],
                           capture_output=True, text=True, timeout=1800)
    assert check.returncode == 0, check.stdout + check.stderr
    results = {r["framework"]: r for r in (json.loads(p.read_text()) for p in (tmp_path / "checks").glob("*.json"))}
    assert set(results) == set(FRAMEWORKS)
    for framework, r in results.items():
        assert r["precision"] == "generate-fp32" and r["params"] == r["params_described"]
        if framework == "torch":
            assert r["status"] == "reference"
            continue
        assert r["status"] == "equivalent", (framework, r["reason"])
        assert r["errors"]["token_mismatches"] == 0 and r["errors"]["first_logits"] <= 1e-4


def test_llama_decoders_generate_the_same_ids_with_grouped_caches(tmp_path):
    """llama_tiny and moe_tiny (rotary positions, key/value-head caches, the MoE's routing per new
    token): jax, tensorflow and mxnet generate the same ids as torch."""
    check = subprocess.run(DLBENCH + ["check", "--mode", "generate", "--framework", "all", "--device", "cpu",
                                      "--network", "llama_tiny", "--network", "moe_tiny", "--store", str(tmp_path)],
                           capture_output=True, text=True, timeout=1800)
    results = [json.loads(p.read_text()) for p in (tmp_path / "checks").glob("*.json")]
    assert {(r["network"], r["framework"]) for r in results} == {(n, f) for n in ("llama_tiny", "moe_tiny")
                                                                 for f in FRAMEWORKS}, check.stdout + check.stderr
    for r in results:
        if r["framework"] == "torch":
            assert r["status"] == "reference"
        else:
            assert r["status"] == "equivalent", (r["network"], r["framework"], r["reason"])
            assert r["errors"]["token_mismatches"] == 0 and r["errors"]["first_logits"] <= 1e-4
