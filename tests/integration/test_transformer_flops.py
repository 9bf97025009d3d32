"""The analysis' forward FLOPs of the transformer networks against an independent count (issue 17):
torch's `torch.utils.flop_counter.FlopCounterMode` on the torch runner's own model, built in the
torch venv by runners/torch/step.py, one sample, inference, within 1%.

FlopCounterMode counts matrix products and convolutions only (2 FLOPs per multiply-add, the
analysis' convention), so it is compared with the workload's products: the `matmul` and
`conv2d_fwd` kernels and attention's two batched products (the `batched_matmul` parts of its fused
`attention_fwd` kernel), as tests/unit/test_performance_model.py picks them out. Its blind spot: it has formulas for the
CUDA kernels of scaled_dot_product_attention (flash, memory-efficient, cuDNN) but none for the
CPU's flash kernel (`aten._scaled_dot_product_flash_attention_for_cpu`), which torch 2.13 runs in
inference on the CPU, so there it counts attention's products as 0. The model is therefore counted
twice more: with that operator given torch's own SDPA formula (`sdpa_flop_count`, the one its CUDA
kernels use), and with the math backend forced (`sdpa_kernel(SDPBackend.MATH)`), whose two bmm
FlopCounterMode counts as it counts any. Both must agree with the analysis; the unmapped count must
be the analysis less exactly the attention products (or, should torch learn the CPU kernel, all of
it). gpt2_small runs a 128-token sequence (its 1,024-token context does not change the question
and would take a minute of CPU per count).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from dlbench import paths
from dlbench.definitions.loader import load_network
from dlbench.execution.environments import VenvBackend
from dlbench.execution.registry import RunnerRegistry
from dlbench.performance.workload import decompose

pytestmark = pytest.mark.integration

# network -> the sequence length it is counted at (None: as described)
NETWORKS = {"transformer_tiny": None, "gpt2_small": 128, "vit_b16": None,
            "llama_tiny": None, "moe_tiny": None, "smollm2_135m": 128}

COUNT = r"""
import contextlib, json, sys
sys.path[:0] = sys.argv[1:2]  # the folder holding the runners package
import torch
from runners.torch.attention import attention_kernels
from runners.torch.step import build_network
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

torch.set_num_threads(1)
network = json.load(open(sys.argv[2]))
torch.manual_seed(0)
model = build_network(network, deterministic=True).eval()
inp = network["input"]
x = (torch.randint(0, inp["vocabulary"], (1, inp["sequence_length"])) if inp["kind"] == "tokens"
     else torch.randn(1, *inp["shape"]))


def cpu_flash(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def count(backend=None, **kw):
    mode = FlopCounterMode(display=False, **kw)
    with torch.no_grad(), (sdpa_kernel(backend) if backend is not None else contextlib.nullcontext()), mode:
        model(x)
    return mode.get_total_flops()


print(json.dumps({
    "params": sum(p.numel() for p in model.parameters() if p.requires_grad),  # a tied table once
    "default": count(),
    "cpu_flash_mapped": count(custom_mapping={torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_flash}),
    "math": count(SDPBackend.MATH),
    "kernel": attention_kernels(model, network, contextlib.nullcontext, train=False)["kernel"],
}))
"""


@pytest.fixture(scope="module")
def torch_python():
    runner = RunnerRegistry(paths.runners_dir()).get("torch")
    return VenvBackend(paths.cache_dir()).ensure(runner, "cpu").python


PRODUCT_KINDS = ("matmul", "batched_matmul", "conv2d_fwd")


def _network(name: str, steps: int | None, tmp_path: Path):
    data = yaml.safe_load((paths.suites_dir() / "networks" / f"{name}.yaml").read_text())
    if steps is not None:
        data["input"]["sequence_length"] = steps
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_network(path)


def _analysis_products(resolved: dict) -> tuple[int, int]:
    """(every product's FLOPs, attention's batched products') of one sample's forward pass.

    A product is an op whose kernel is a matrix product or convolution, or a product part of a fused
    kernel: attention's two batched products, SwiGLU's three and the MoE router's and experts'
    matrix products (their element-wise parts are what FlopCounterMode does not count)."""
    ops = [op for layer in decompose(resolved, 1, "infer").layers for op in layer.forward]
    whole = [op for op in ops if op.kernel is not None and op.kernel.kind in PRODUCT_KINDS]
    parts = [(op.kernel.kind, part) for op in ops if op.kernel is not None and op.kernel.kind not in PRODUCT_KINDS
             for part in op.parts if part.kernel is not None and part.kernel.kind in PRODUCT_KINDS]
    attention = sum(part.flops for kind, part in parts if kind in ("attention_fwd", "grouped_attention_fwd"))
    return sum(op.flops for op in whole) + sum(part.flops for _, part in parts), attention


@pytest.mark.parametrize("name", sorted(NETWORKS))
def test_flop_counter_mode_counts_the_analysis_products(torch_python, name, tmp_path):
    net = _network(name, NETWORKS[name], tmp_path)
    (tmp_path / "network.json").write_text(json.dumps(net.resolved))
    (tmp_path / "count.py").write_text(COUNT)
    run = subprocess.run([str(torch_python), str(tmp_path / "count.py"), str(paths.runners_dir().parent),
                          str(tmp_path / "network.json")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    counted = json.loads(run.stdout.strip().splitlines()[-1])
    products, attention = _analysis_products(net.resolved)
    assert attention > 0
    print(f"{name}: analysis {products:,} ({attention:,} in attention's products); FlopCounterMode "
          f"{counted['cpu_flash_mapped']:,} (CPU flash kernel mapped), {counted['math']:,} (math backend), "
          f"{counted['default']:,} (as it is); kernel {counted['kernel']}")
    assert counted["params"] == net.params  # gpt2_small's 124,439,808 and vit_b16's 86,567,656, as published
    assert counted["cpu_flash_mapped"] == pytest.approx(products, rel=0.01)
    assert counted["math"] == pytest.approx(products, rel=0.01)
    if counted["kernel"] == "flash (torch's CPU kernel)":
        assert counted["default"] in (products, products - attention)
