"""The layer types of issue 45 (rms_norm, grouped_attention with rotary, swiglu, moe, llama_block) and
the llm suite's networks, framework-free: shapes, counts by hand, resolved entries, canonical
weights, errors naming the file and the field, the published parameter counts, a suite entry's
devices, and the routing rule's numpy reference (runners/common/routing.py) with its tie-break."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from dlbench import paths
from dlbench.definitions import layers
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.definitions.loader import DefinitionError, load_network
from dlbench.definitions.weights import weight_shapes as canonical_shapes
from runners.common import rotary, routing

NETWORKS = paths.suites_dir() / "networks"
TOKENS = {"kind": "tokens", "vocabulary": 11, "sequence_length": 5}


def load(tmp_path: Path, net_layers: list[dict], inp: dict = TOKENS):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({"name": "tiny", "input": inp, "layers": net_layers}, sort_keys=False))
    return load_network(path)


def error(tmp_path: Path, net_layers: list[dict]) -> DefinitionError:
    with pytest.raises(DefinitionError) as info:
        load(tmp_path, net_layers)
    return info.value


EMBED = {"type": "embedding", "vocabulary": 11, "dim": 8}
HEAD = {"type": "lm_head", "tied": True}


@pytest.mark.parametrize("name,params", [("smollm2_135m", 134_515_008), ("llama32_1b", 1_235_814_400),
                                         ("mixtral_8x7b", 46_702_792_704)])
def test_published_counts(name, params):
    assert load_network(NETWORKS / f"{name}.yaml").params == params


def test_rms_norm_swiglu_and_grouped_attention_counts(tmp_path):
    s = load(tmp_path, [EMBED, {"type": "rms_norm"},
                        {"type": "grouped_attention", "heads": 4, "kv_heads": 2},
                        {"type": "swiglu", "hidden": 6}, HEAD])
    t, d, h, kv, size, hidden = 5, 8, 4, 2, 2, 6
    assert (s.layers[1].params, s.layers[1].flops) == (d, 4 * t * d)
    attn_params = d * h * size + 2 * d * kv * size + h * size * d
    attn_flops = (2 * t * d * h * size + 2 * 2 * t * d * kv * size + 3 * t * (h + kv) * size
                  + 2 * 2 * t * t * size * h + 5 * h * t * t + 2 * t * h * size * d)
    assert (s.layers[2].params, s.layers[2].flops) == (attn_params, attn_flops)
    assert (s.layers[3].params, s.layers[3].flops) == (3 * d * hidden, t * (6 * d * hidden + 5 * hidden))
    assert s.resolved["layers"][2] == {"type": "grouped_attention", "heads": 4, "kv_heads": 2, "head_size": 2,
                                       "causal": True, "rope_theta": 10000.0, "rope_scaling": None,
                                       "in_shape": [5, 8], "out_shape": [5, 8]}


def test_moe_counts_the_active_work_and_every_expert(tmp_path):
    s = load(tmp_path, [EMBED, {"type": "moe", "experts": 4, "top_k": 2, "hidden": 6, "capacity_factor": 1.25},
                        HEAD])
    t, d, e, k, hidden = 5, 8, 4, 2, 6
    expert_flops = t * (6 * d * hidden + 5 * hidden)
    assert s.layers[1].params == e * 3 * d * hidden + e * d
    assert s.layers[1].flops == 2 * t * d * e + 5 * t * e + k * expert_flops + 2 * t * k * d
    entry = s.resolved["layers"][1]
    assert entry["aux_loss_weight"] == entry["aux_loss_coefficient"] == 0.01 and entry["capacity_factor"] == 1.25
    names = canonical_shapes(s.resolved)
    assert names["001.router.weight"] == (4, 8) and names["001.experts.gate"] == (4, 6, 8)
    assert names["001.experts.down"] == (4, 8, 6)


def test_llama_block_expands_per_block_and_averages_the_auxiliary_loss(tmp_path):
    block = {"type": "llama_block", "heads": 4, "kv_heads": 1, "hidden": 6,
             "moe": {"experts": 3, "top_k": 1, "aux_loss_coefficient": 0.03}, "repeat": 3}
    s = load(tmp_path, [EMBED, block, {"type": "rms_norm"}, HEAD])
    blocks = [e for e in s.resolved["layers"] if e["type"] == "llama_block"]
    assert len(blocks) == 3 and all(b["moe"]["aux_loss_weight"] == pytest.approx(0.01) for b in blocks)
    assert blocks[0]["head_size"] == 2 and blocks[0]["eps"] == 1e-5
    per_block = (2 * 8 + 8 * 8 + 2 * 8 * 2 + 8 * 8) + 3 * 3 * 8 * 6 + 3 * 8
    assert s.params == 11 * 8 + 3 * per_block + 8
    names = canonical_shapes(s.resolved)
    assert {"001.norm1.gamma", "001.attn.k.weight", "001.moe.experts.up", "003.norm2.gamma"} <= set(names)
    assert names["001.attn.k.weight"] == (2, 8)
    assert layers.lookup("llama_block").decisions_of(blocks[0]) == 1
    dense = load(tmp_path, [EMBED, {**block, "moe": None}, HEAD]).resolved["layers"][1]
    assert layers.lookup("llama_block").decisions_of(dense) == 0
    assert "001.mlp.gate.weight" in canonical_shapes(load(tmp_path, [EMBED, {**block, "moe": None}, HEAD]).resolved)


@pytest.mark.parametrize("layer,field,reason", [
    ({"type": "grouped_attention", "heads": 4, "kv_heads": 3}, "layers[1]", "3 key/value heads do not divide"),
    ({"type": "grouped_attention", "heads": 8, "kv_heads": 2}, "layers[1]", "an even head size, got 1"),
    ({"type": "moe", "experts": 2, "top_k": 3, "hidden": 4}, "layers[1].top_k", "top_k 3 is more than the 2"),
    ({"type": "llama_block", "heads": 2, "kv_heads": 2, "hidden": 4,
      "rope_scaling": {"factor": 8, "low_freq_factor": 4, "high_freq_factor": 1, "original_context": 16}},
     "layers[1].rope_scaling.high_freq_factor", "above low_freq_factor"),
    ({"type": "swiglu", "hidden": 0}, "layers[1].hidden", "greater than 0"),
])
def test_errors_name_the_file_and_the_field(tmp_path, layer, field, reason):
    err = error(tmp_path, [EMBED, layer, HEAD])
    assert err.field == field and reason in str(err) and str(err).startswith(str(tmp_path / "tiny.yaml"))


def test_a_cuda_only_entry_is_left_out_on_a_cpu():
    catalog = SuiteCatalog(paths.suites_dir())
    on_cpu = {b.network.name for b in catalog.load_suite(paths.suites_dir() / "llm.yaml", "smoke", "cpu").benchmarks}
    on_gpu = {b.network.name for b in catalog.load_suite(paths.suites_dir() / "llm.yaml", "smoke", "cuda").benchmarks}
    assert on_cpu == {"llama_tiny", "moe_tiny", "smollm2_135m"}
    assert on_gpu == on_cpu | {"llama32_1b", "mixtral_8x7b"}


def test_rotary_tables_rotate_halves_and_rescale_as_llama3():
    cos, sin = rotary.tables(3, 4, 100.0)
    assert cos.shape == (3, 4) and np.allclose(cos[0], 1) and np.allclose(sin[0], 0)
    assert np.allclose(cos[:, :2], cos[:, 2:]) and sin[2, 1] == pytest.approx(math.sin(2 / 10))
    scaling = {"factor": 32, "low_freq_factor": 1, "high_freq_factor": 4, "original_context": 8192}
    plain, scaled = rotary.frequencies(64, 500000.0), rotary.frequencies(64, 500000.0, scaling)
    assert scaled[0] == plain[0]  # the shortest wavelength is kept
    assert scaled[-1] == pytest.approx(plain[-1] / 32)  # the longest divided by the factor


def test_routing_breaks_ties_towards_the_lower_expert_and_drops_past_capacity():
    tied = np.full((3, 4), 0.25)
    chosen, weights = routing.route(tied, 2)
    assert chosen.tolist() == [[0, 1]] * 3 and np.allclose(weights, 0.5)
    p = np.array([[0.1, 0.4, 0.4, 0.1], [0.7, 0.1, 0.1, 0.1], [0.6, 0.3, 0.05, 0.05]])
    chosen, weights = routing.route(p, 2, slots=routing.capacity(0.5, 3, 2, 4))  # ceil(0.75) = 1 slot
    assert chosen.tolist() == [[1, 2], [0, 1], [0, 1]]
    # first choices in token order (1, 0, 0), then second choices (2, 1, 1): expert 0's second
    # first choice and expert 1's second use are past their one slot
    assert np.allclose(weights, [[0.5, 0.5], [0.875, 0.0], [0.0, 0.0]])
    assert routing.capacity(None, 3, 2, 4) is None
    assert routing.load_balancing_loss(tied, routing.route(tied, 2)[0]) == pytest.approx(4 * (1.0 * 0.25 + 1.0 * 0.25))  # f = (1, 1, 0, 0), P = 1/4 each


def test_a_llama_decoder_generates_and_a_broken_one_is_refused():
    from dlbench.definitions.generation import context_problem, decoder_problem
    from runners.common.contract import DecoderLayout
    from runners.common.protocol import Skip

    resolved = load_network(NETWORKS / "moe_tiny.yaml").resolved
    assert decoder_problem(resolved) is None
    assert context_problem(resolved, 60, 40) is None  # rotary: no position table to overrun
    assert "at least 2" in context_problem(resolved, 8, 1)
    layout = DecoderLayout(resolved)
    assert (layout.llama, layout.position, layout.blocks, layout.norm, layout.head) == (True, None, [1, 2], 3, 4)
    assert layout.request_lengths({"generation": {"prompt_length": 60, "new_tokens": 40}}) == (60, 40)
    broken = {**resolved, "layers": [resolved["layers"][0], resolved["layers"][1], resolved["layers"][-1]]}
    assert "is not a decoder" in decoder_problem(broken)
    with pytest.raises(Skip, match="needs a decoder network"):  # the runners refuse it too (no final rms_norm)
        DecoderLayout(broken)
