"""The llm suite's decoders counted by HuggingFace transformers (issue 45): each network's
configuration translated into transformers' own (LlamaConfig for the dense decoders, MixtralConfig
for the Mixture-of-Experts ones), the model built on the meta device (shapes only: no weights
allocated or downloaded) in the torch runner's environment, and its parameter count (the tied
embedding once, as transformers counts it) compared with dlbench's analysis. One child process for
every network."""

from __future__ import annotations

import json
import subprocess

import pytest

from dlbench import paths
from dlbench.definitions.loader import load_network
from dlbench.execution.environments import VenvBackend
from dlbench.execution.registry import RunnerRegistry

pytestmark = pytest.mark.integration

NETWORKS = ("smollm2_135m", "llama32_1b", "mixtral_8x7b", "llama_tiny", "moe_tiny")

COUNT = r"""
import json, sys
import torch
import transformers

counts = {}
for name, (cls, config) in json.load(open(sys.argv[1])).items():
    with torch.device("meta"):
        model = getattr(transformers, cls)(getattr(transformers, cls.replace("ForCausalLM", "Config"))(**config))
    counts[name] = sum(p.numel() for p in model.parameters())
print(json.dumps({"transformers": transformers.__version__, "counts": counts}))
"""


def hf_config(resolved: dict) -> tuple[str, dict]:
    """(transformers' class, its configuration) of a resolved llm network: embedding, llama_block
    stack, rms_norm, lm_head."""
    blocks = [layer for layer in resolved["layers"] if layer["type"] == "llama_block"]
    block, head = blocks[0], resolved["layers"][-1]
    config = {"vocab_size": resolved["input"]["vocabulary"], "hidden_size": block["in_shape"][-1],
              "intermediate_size": block["hidden"], "num_hidden_layers": len(blocks),
              "num_attention_heads": block["heads"], "num_key_value_heads": block["kv_heads"],
              "head_dim": block["head_size"], "rms_norm_eps": block["eps"], "rope_theta": block["rope_theta"],
              "tie_word_embeddings": head["tied"]}
    if block["moe"] is None:
        return "LlamaForCausalLM", config
    routing = block["moe"]
    return "MixtralForCausalLM", {**config, "num_local_experts": routing["experts"],
                                  "num_experts_per_tok": routing["top_k"],
                                  "router_aux_loss_coef": routing["aux_loss_coefficient"]}


def test_transformers_counts_every_llm_network_as_dlbench_does(tmp_path):
    runner = RunnerRegistry(paths.runners_dir()).get("torch")
    python = VenvBackend(paths.cache_dir()).ensure(runner, "cpu").python
    nets = {name: load_network(paths.suites_dir() / "networks" / f"{name}.yaml") for name in NETWORKS}
    (tmp_path / "configs.json").write_text(json.dumps({name: hf_config(n.resolved) for name, n in nets.items()}))
    (tmp_path / "count.py").write_text(COUNT)
    run = subprocess.run([str(python), str(tmp_path / "count.py"), str(tmp_path / "configs.json")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"transformers {found['transformers']}: {found['counts']}")
    assert found["counts"] == {name: n.params for name, n in nets.items()}
    assert found["counts"]["mixtral_8x7b"] == 46_702_792_704  # Mixtral 8x7B's published count
