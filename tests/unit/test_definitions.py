"""The network description language: loading, validation messages, shapes, counts and the resolved form.

Expected parameter counts and FLOPs are written out as hand arithmetic from the layer list (not by
calling the analysis code a second time), following the FLOP convention at the top of analysis.py.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from dlbench.definitions.loader import DefinitionError, load_network
from dlbench.definitions.network import definition_hash

REPO = Path(__file__).resolve().parents[2]
NETWORKS = REPO / "suites" / "networks"
SEED = ["alexnet", "alexnet_r", "fcn5", "fcn8", "lstm32", "lstm64", "resnet50", "resnet56"]  # of the seed suite
SHIPPED = sorted(p.stem for p in NETWORKS.glob("*.yaml"))  # a network added is checked with them


# --------------------------------------------------------------------------- helpers

def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def network_file(tmp_path: Path, input_: dict, layers: list[dict], name: str = "tiny", **extra) -> Path:
    doc = {"name": name, "input": input_, "layers": layers, **extra}
    return write(tmp_path, f"{name}.yaml", yaml.safe_dump(doc, sort_keys=False))


def load_tiny(tmp_path: Path, input_: dict, layers: list[dict], **extra):
    return load_network(network_file(tmp_path, input_, layers, **extra))


def load_error(path: Path) -> DefinitionError:
    with pytest.raises(DefinitionError) as info:
        load_network(path)
    return info.value


def dense(fin: int, fout: int) -> int:
    return fin * fout + fout


def conv(k: int, cin: int, cout: int, bias: bool = True) -> int:
    return k * k * cin * cout + (cout if bias else 0)


def bn(c: int) -> int:
    return 2 * c


def lstm_layer(fin: int, h: int) -> int:
    return 4 * h * (fin + h) + 4 * h


# --------------------------------------------------------------------------- shipped networks

def test_all_eight_networks_are_shipped():
    assert set(SEED) <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_network_loads_and_is_consistent(name):
    summary = load_network(NETWORKS / f"{name}.yaml")
    assert summary.name == name
    assert summary.params > 0 and summary.flops_per_sample > 0
    resolved = summary.resolved
    # plain JSON: survives a round trip unchanged (tuples would not)
    assert json.loads(json.dumps(resolved)) == resolved
    assert resolved["params"] == summary.params
    assert resolved["flops_per_sample"] == summary.flops_per_sample
    assert resolved["params"] == sum(layer.params for layer in summary.layers)
    entries = resolved["layers"]
    for entry in entries:
        assert {"type", "in_shape", "out_shape"} <= entry.keys()
    # shapes chain from the input to the output
    inp = resolved["input"]
    first_in = [inp["sequence_length"]] if inp["kind"] in ("tokens", "masked_tokens") else inp["shape"]
    assert entries[0]["in_shape"] == first_in
    for before, after in zip(entries, entries[1:]):
        assert before["out_shape"] == after["in_shape"]
    assert entries[-1]["out_shape"] == list(summary.output_shape)


def test_fcn5_params_and_flops():
    s = load_network(NETWORKS / "fcn5.yaml")
    widths = [784, 2048, 4096, 1024, 10]
    pairs = list(zip(widths, widths[1:]))
    expected_params = sum(i * o + o for i, o in pairs)
    assert expected_params == 14_205_962
    assert s.params == expected_params
    # dense: 2*in*out + out; sigmoid: one per element of each hidden layer
    expected_flops = sum(2 * i * o + o for i, o in pairs) + (2048 + 4096 + 1024)
    assert s.flops_per_sample == expected_flops
    assert s.output_shape == (10,)


def test_fcn8_params():
    s = load_network(NETWORKS / "fcn8.yaml")
    widths = [784] + [2048] * 6 + [10]
    expected = sum(i * o + o for i, o in zip(widths, widths[1:]))
    assert expected == 22_609_930
    assert s.params == expected


def test_alexnet_r_params_flops_and_shapes():
    s = load_network(NETWORKS / "alexnet_r.yaml")
    expected = conv(5, 3, 32) + conv(5, 32, 32) + conv(5, 32, 64) + dense(64 * 3 * 3, 10)
    assert expected == 85_098
    assert s.params == expected
    # conv 32x32x32 -> pool3/2 15x15 -> conv 32x15x15 -> pool 7x7 -> conv 64x7x7 -> avg 3x3
    expected_flops = (
        2 * 25 * 3 * 32 * 32 * 32 + 32 * 32 * 32      # conv1
        + 9 * 32 * 15 * 15 + 32 * 15 * 15             # max_pool, relu
        + 2 * 25 * 32 * 32 * 15 * 15 + 32 * 15 * 15   # conv2
        + 32 * 15 * 15 + 9 * 32 * 7 * 7               # relu, max_pool
        + 2 * 25 * 32 * 64 * 7 * 7 + 64 * 7 * 7       # conv3
        + 64 * 7 * 7 + 9 * 64 * 3 * 3                 # relu, avg_pool
        + 2 * 576 * 10 + 10                           # dense
    )
    assert s.flops_per_sample == expected_flops
    types = [layer.type for layer in s.layers]
    assert types[8:10] == ["avg_pool", "flatten"]
    assert s.layers[8].out_shape == (64, 3, 3)
    assert s.layers[9].out_shape == (576,)
    assert s.layers[10].in_shape == (576,)


def test_alexnet_params_and_shapes():
    s = load_network(NETWORKS / "alexnet.yaml")
    expected = (conv(11, 3, 96) + conv(5, 96, 256) + conv(3, 256, 384) + conv(3, 384, 384)
                + conv(3, 384, 256) + dense(256 * 6 * 6, 4096) + dense(4096, 4096) + dense(4096, 1000))
    assert expected == 62_378_344
    assert s.params == expected
    assert s.layers[0].out_shape == (96, 55, 55)  # floor((224 + 4 - 11) / 4) + 1
    assert s.layers[12].type == "max_pool" and s.layers[12].out_shape == (256, 6, 6)
    assert s.layers[13].type == "flatten" and s.layers[13].out_shape == (9216,)
    assert s.output_shape == (1000,)


def test_resnet56_params():
    s = load_network(NETWORKS / "resnet56.yaml")

    def basic(cin, f):  # two 3x3 convs without bias, each followed by batch norm; option A is free
        return conv(3, cin, f, bias=False) + bn(f) + conv(3, f, f, bias=False) + bn(f)

    expected = conv(3, 3, 16, bias=False) + bn(16)
    cin = 16
    for f in (16, 32, 64):
        for _ in range(9):
            expected += basic(cin, f)
            cin = f
    expected += dense(64, 10)
    assert expected == 853_018
    assert s.params == expected
    assert s.output_shape == (10,)


def test_resnet50_params():
    s = load_network(NETWORKS / "resnet50.yaml")

    def bottleneck(cin, f, projection):
        p = (conv(1, cin, f, False) + bn(f) + conv(3, f, f, False) + bn(f)
             + conv(1, f, 4 * f, False) + bn(4 * f))
        return p + (conv(1, cin, 4 * f, False) + bn(4 * f) if projection else 0)

    expected = conv(7, 3, 64, bias=False) + bn(64)
    cin = 64
    for f, repeat in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for r in range(repeat):
            expected += bottleneck(cin, f, projection=(r == 0))
            cin = 4 * f
    expected += dense(2048, 1000)
    assert expected == 25_557_032
    assert s.params == expected
    assert s.output_shape == (1000,)


@pytest.mark.parametrize("name,steps", [("lstm32", 32), ("lstm64", 64)])
def test_lstm_params_and_flops(name, steps):
    s = load_network(NETWORKS / f"{name}.yaml")
    expected = 10000 * 256 + lstm_layer(256, 256) + lstm_layer(256, 256) + dense(256, 10000)
    assert expected == 6_180_624
    assert s.params == expected
    h = 256
    per_step_layer = 2 * 4 * h * (256 + h) + 4 * h + 5 * h + 4 * h
    expected_flops = steps * 2 * per_step_layer + steps * (2 * 256 * 10000 + 10000)
    assert s.flops_per_sample == expected_flops
    assert s.output_shape == (steps, 10000)


# --------------------------------------------------------------------------- FLOPs, small cases

def test_flops_one_conv(tmp_path):
    # [2, 4, 4] -> conv 3 filters, 2x2, stride 2 -> [3, 2, 2] -> flatten -> 12 logits
    s = load_tiny(tmp_path, {"kind": "tensor", "shape": [2, 4, 4], "classes": 12},
                  [{"type": "conv2d", "filters": 3, "kernel": 2, "stride": 2}, {"type": "flatten"}])
    assert s.layers[0].out_shape == (3, 2, 2)
    assert s.params == 2 * 2 * 2 * 3 + 3
    assert s.layers[0].flops == 2 * (2 * 2 * 2 * 3) * (2 * 2) + 3 * 2 * 2  # 192 + 12
    assert s.layers[1].flops == 0
    assert s.flops_per_sample == 204


def test_flops_conv_without_bias_and_rectangular_kernel(tmp_path):
    s = load_tiny(tmp_path, {"kind": "tensor", "shape": [1, 5, 6], "classes": 2 * 3 * 4},
                  [{"type": "conv2d", "filters": 2, "kernel": [3, 3], "stride": [1, 1], "padding": [0, 0],
                    "bias": False},
                   {"type": "flatten"}])
    assert s.layers[0].out_shape == (2, 3, 4)
    assert s.params == 9 * 1 * 2
    assert s.flops_per_sample == 2 * 9 * 1 * 2 * 3 * 4


def test_flops_one_dense(tmp_path):
    s = load_tiny(tmp_path, {"kind": "tensor", "shape": [5], "classes": 3}, [{"type": "dense", "units": 3}])
    assert s.params == 5 * 3 + 3
    assert s.flops_per_sample == 2 * 5 * 3 + 3  # 33


def test_flops_dense_without_bias_then_activations(tmp_path):
    s = load_tiny(tmp_path, {"kind": "tensor", "shape": [5], "classes": 3},
                  [{"type": "dense", "units": 3, "bias": False}, {"type": "tanh"},
                   {"type": "batch_norm"}, {"type": "dropout", "rate": 0.2}])
    assert s.params == 5 * 3 + 2 * 3
    assert [layer.flops for layer in s.layers] == [30, 3, 6, 0]


@pytest.mark.parametrize("lstm_layers", [1, 2])
def test_flops_lstm_language_model(tmp_path, lstm_layers):
    # vocabulary 7, 4 steps, embedding 3, LSTM hidden 2, dense back to the vocabulary at every step
    s = load_tiny(tmp_path, {"kind": "tokens", "vocabulary": 7, "sequence_length": 4},
                  [{"type": "embedding", "vocabulary": 7, "dim": 3},
                   {"type": "lstm", "hidden": 2, "layers": lstm_layers},
                   {"type": "dense", "units": 7}])
    assert s.layers[0].out_shape == (4, 3)
    assert s.layers[1].out_shape == (4, 2)
    assert s.output_shape == (4, 7)
    first = 4 * (2 * 4 * 2 * (3 + 2) + 4 * 2 + 5 * 2 + 4 * 2)   # 4 * (80 + 26) = 424
    second = 4 * (2 * 4 * 2 * (2 + 2) + 4 * 2 + 5 * 2 + 4 * 2)  # 4 * (64 + 26) = 360
    lstm_flops = first + (second if lstm_layers == 2 else 0)
    assert s.layers[0].flops == 0
    assert s.layers[1].flops == lstm_flops
    assert s.layers[2].flops == 4 * (2 * 2 * 7 + 7)  # same weights at every step
    assert s.flops_per_sample == lstm_flops + 140
    lstm_params = (4 * 2 * (3 + 2) + 4 * 2) + ((4 * 2 * (2 + 2) + 4 * 2) if lstm_layers == 2 else 0)
    assert s.params == 7 * 3 + lstm_params + 2 * 7 + 7


def test_flops_max_pool_stride_defaults_to_size(tmp_path):
    s = load_tiny(tmp_path, {"kind": "tensor", "shape": [1, 4, 4], "classes": 4},
                  [{"type": "max_pool", "size": 2}, {"type": "flatten"}])
    assert s.layers[0].out_shape == (1, 2, 2)
    assert s.flops_per_sample == 2 * 2 * 4
    assert s.params == 0
    assert s.resolved["layers"][0]["stride"] == [2, 2]


def test_flops_avg_pool_with_stride_and_max_pool_with_padding(tmp_path):
    s = load_tiny(tmp_path, {"kind": "tensor", "shape": [2, 5, 5], "classes": 2 * 2 * 2},
                  [{"type": "avg_pool", "size": 3, "stride": 1},            # -> [2, 3, 3]
                   {"type": "max_pool", "size": 3, "stride": 2, "padding": 1},  # (3+2-3)//2+1 = 2
                   {"type": "flatten"}])
    assert s.layers[0].out_shape == (2, 3, 3)
    assert s.layers[1].out_shape == (2, 2, 2)
    assert s.layers[0].flops == 9 * 2 * 3 * 3
    assert s.layers[1].flops == 9 * 2 * 2 * 2


def test_flops_global_avg_pool(tmp_path):
    s = load_tiny(tmp_path, {"kind": "tensor", "shape": [3, 2, 2], "classes": 3},
                  [{"type": "global_avg_pool"}])
    assert s.output_shape == (3,)
    assert s.flops_per_sample == 3 * 2 * 2


def test_flops_residual_basic_identity(tmp_path):
    s = load_tiny(tmp_path, {"kind": "tensor", "shape": [2, 4, 4], "classes": 2},
                  [{"type": "residual", "block": "basic", "filters": 2}, {"type": "global_avg_pool"}])
    n = 2 * 4 * 4
    conv_flops = 2 * 9 * 2 * 2 * 4 * 4
    # conv, bn + relu, conv, bn, addition + final relu
    assert s.layers[0].flops == conv_flops + 3 * n + conv_flops + 2 * n + 2 * n
    assert s.layers[0].params == 2 * (9 * 2 * 2) + 2 * (2 * 2)
    assert s.resolved["layers"][0]["shortcut"] == "identity"
    assert s.flops_per_sample == s.layers[0].flops + n


# --------------------------------------------------------------------------- resolved form

def test_resolved_resnet56_expands_repeats_with_stride_on_first_block():
    s = load_network(NETWORKS / "resnet56.yaml")
    entries = s.resolved["layers"]
    assert len(entries) == 3 + 3 * 9 + 2
    blocks = [e for e in entries if e["type"] == "residual"]
    assert len(blocks) == 27
    for e in blocks:
        assert "repeat" not in e
    stages = [blocks[0:9], blocks[9:18], blocks[18:27]]
    assert [b["stride"] for b in stages[0]] == [1] * 9
    assert [b["shortcut"] for b in stages[0]] == ["identity"] * 9
    for stage, filters, size in ((stages[1], 32, 16), (stages[2], 64, 8)):
        assert [b["stride"] for b in stage] == [2] + [1] * 8
        assert [b["shortcut"] for b in stage] == ["option_a"] + ["identity"] * 8
        assert stage[0]["in_shape"] == [filters // 2, size * 2, size * 2]
        assert stage[0]["out_shape"] == [filters, size, size]
        assert all(b["filters"] == filters and b["block"] == "basic" for b in stage)
    assert entries[-2]["type"] == "global_avg_pool" and entries[-2]["in_shape"] == [64, 8, 8]


def test_resolved_resnet50_projection_where_shape_changes():
    s = load_network(NETWORKS / "resnet50.yaml")
    blocks = [e for e in s.resolved["layers"] if e["type"] == "residual"]
    assert len(blocks) == 3 + 4 + 6 + 3
    # the first stage keeps stride 1 but goes 64 -> 256 channels, so it still needs a projection
    assert blocks[0]["in_shape"] == [64, 56, 56]
    assert blocks[0]["out_shape"] == [256, 56, 56]
    assert blocks[0]["stride"] == 1 and blocks[0]["shortcut"] == "projection"
    assert blocks[3]["stride"] == 2 and blocks[3]["shortcut"] == "projection"
    assert blocks[3]["out_shape"] == [512, 28, 28]
    firsts = {0, 3, 7, 13}
    for i, b in enumerate(blocks):
        assert b["shortcut"] == ("projection" if i in firsts else "identity"), i
        assert b["stride"] == (1 if i == 0 or i not in firsts else 2), i
    assert blocks[-1]["out_shape"] == [2048, 7, 7]
    # the stem's max_pool keeps its explicit stride and padding
    pool = s.resolved["layers"][3]
    assert pool["type"] == "max_pool" and pool["stride"] == [2, 2] and pool["padding"] == [1, 1]
    assert pool["out_shape"] == [64, 56, 56]


def test_resolved_option_a_on_channel_increase_without_stride(tmp_path):
    s = load_tiny(tmp_path, {"kind": "tensor", "shape": [2, 4, 4], "classes": 4},
                  [{"type": "residual", "block": "basic", "filters": 4, "repeat": 2, "shortcut": "option_a"},
                   {"type": "global_avg_pool"}])
    blocks = s.resolved["layers"][:2]
    assert [b["shortcut"] for b in blocks] == ["option_a", "identity"]
    # option A adds no parameters: exactly the two convs and two batch norms per block
    assert s.layers[0].params == (9 * 2 * 4 + 9 * 4 * 4 + 4 * 4) + (9 * 4 * 4 + 9 * 4 * 4 + 4 * 4)


def test_resolved_projection_not_used_when_shape_is_kept(tmp_path):
    s = load_tiny(tmp_path, {"kind": "tensor", "shape": [8, 4, 4], "classes": 8},
                  [{"type": "residual", "block": "bottleneck", "filters": 2, "shortcut": "projection"},
                   {"type": "global_avg_pool"}])
    assert s.resolved["layers"][0]["shortcut"] == "identity"
    assert s.layers[0].params == (8 * 2 + 4) + (9 * 2 * 2 + 4) + (2 * 8 + 16)


def test_resolved_fills_defaults(tmp_path):
    s = load_tiny(tmp_path, {"kind": "tensor", "shape": [1, 4, 4], "classes": 4},
                  [{"type": "conv2d", "filters": 1, "kernel": 1}, {"type": "batch_norm"},
                   {"type": "avg_pool", "size": [2, 2]}, {"type": "flatten"}])
    conv_e, bn_e, pool_e, flat_e = s.resolved["layers"]
    assert conv_e == {"type": "conv2d", "filters": 1, "kernel": [1, 1], "stride": [1, 1], "padding": [0, 0],
                      "bias": True, "in_shape": [1, 4, 4], "out_shape": [1, 4, 4]}
    assert bn_e["eps"] == pytest.approx(1e-5) and bn_e["momentum"] == pytest.approx(0.1)
    assert pool_e["stride"] == [2, 2] and pool_e["out_shape"] == [1, 2, 2]
    assert "padding" not in pool_e
    assert flat_e["out_shape"] == [4]
    assert s.resolved["input"] == {"kind": "tensor", "shape": [1, 4, 4], "dtype": "float32", "classes": 4}
    assert s.resolved["loss"] == "softmax_cross_entropy"


# --------------------------------------------------------------------------- definition hash

def test_hash_stable_across_loads_and_locations(tmp_path):
    a = load_network(NETWORKS / "resnet56.yaml")
    b = load_network(NETWORKS / "resnet56.yaml")
    copy = tmp_path / "elsewhere.yaml"
    shutil.copy(NETWORKS / "resnet56.yaml", copy)
    c = load_network(copy)
    assert re.fullmatch(r"[0-9a-f]{64}", a.definition_hash)
    assert a.definition_hash == b.definition_hash == c.definition_hash
    assert a.definition_hash == definition_hash(json.loads(json.dumps(a.resolved)))


def test_hashes_of_shipped_networks_are_distinct():
    hashes = {load_network(NETWORKS / f"{n}.yaml").definition_hash for n in SHIPPED}
    assert len(hashes) == len(SHIPPED)


def test_hash_ignores_yaml_formatting_and_explicit_defaults(tmp_path):
    flow = write(tmp_path, "a.yaml",
                 "name: tiny\ninput: {kind: tensor, shape: [1, 4, 4], classes: 4}\n"
                 "layers:\n  - {type: max_pool, size: 2}\n  - {type: flatten}\n")
    block = write(tmp_path, "b.yaml",
                  "# a comment\nname: tiny\ninput:\n  kind: tensor\n  shape: [1, 4, 4]\n  classes: 4\n"
                  "  dtype: float32\nlayers:\n  - type: max_pool\n    size: [2, 2]\n    stride: 2\n"
                  "    padding: 0\n  - type: flatten\nloss: softmax_cross_entropy\n")
    assert load_network(flow).definition_hash == load_network(block).definition_hash


BASE_INPUT = {"kind": "tensor", "shape": [1, 6, 6], "classes": 4}
BASE_LAYERS = [
    {"type": "conv2d", "filters": 2, "kernel": 3, "stride": 1, "padding": 1, "bias": True},
    {"type": "batch_norm", "eps": 1e-5, "momentum": 0.1},
    {"type": "relu"},
    {"type": "max_pool", "size": 2},
    {"type": "flatten"},
    {"type": "dropout", "rate": 0.5},
    {"type": "dense", "units": 4, "bias": True},
]


@pytest.mark.parametrize("index,key,value", [
    (0, "bias", False),
    (0, "padding", [1, 0]),
    (1, "eps", 1e-3),
    (1, "momentum", 0.2),
    (2, "type", "sigmoid"),
    (5, "rate", 0.25),
    (6, "bias", False),
])
def test_hash_changes_with_any_layer_field(tmp_path, index, key, value):
    base = load_tiny(tmp_path, BASE_INPUT, BASE_LAYERS).definition_hash
    layers = [dict(layer) for layer in BASE_LAYERS]
    layers[index][key] = value
    changed = load_tiny(tmp_path, BASE_INPUT, layers)  # padding [1, 0]: 6x4 after the conv, still valid
    assert changed.definition_hash != base


def test_hash_changes_with_name_and_input(tmp_path):
    base = load_tiny(tmp_path, BASE_INPUT, BASE_LAYERS).definition_hash
    renamed = load_network(network_file(tmp_path, BASE_INPUT, BASE_LAYERS, name="other"))
    assert renamed.definition_hash != base
    bigger = load_tiny(tmp_path, {**BASE_INPUT, "shape": [1, 8, 8]}, BASE_LAYERS)
    assert bigger.definition_hash != base
    two_channels = load_tiny(tmp_path, {**BASE_INPUT, "shape": [2, 6, 6]}, BASE_LAYERS)
    assert two_channels.definition_hash != base


def test_hash_ignores_the_prose_description(tmp_path):
    # the description is documentation, not part of what a runner builds
    a = load_tiny(tmp_path, BASE_INPUT, BASE_LAYERS, description="one")
    b = load_tiny(tmp_path, BASE_INPUT, BASE_LAYERS, description="two")
    assert a.definition_hash == b.definition_hash


# --------------------------------------------------------------------------- validation errors

DENSE_HEAD = "name: bad\ninput: {kind: tensor, shape: [4], classes: 2}\nlayers:\n"
IMAGE_HEAD = "name: bad\ninput: {kind: tensor, shape: [1, 8, 8], classes: 2}\nlayers:\n"


def assert_error(path: Path, field: str, *reason_parts: str) -> DefinitionError:
    err = load_error(path)
    message = str(err)
    assert err.path == str(path)
    assert message.startswith(f"{path}: ")
    assert err.field == field
    if field:
        assert message.startswith(f"{path}: {field}: ")
    for part in reason_parts:
        assert part in err.reason, (part, err.reason)
        assert part in message
    return err


def test_error_unknown_layer_type_lists_expected(tmp_path):
    path = write(tmp_path, "t.yaml", DENSE_HEAD + "  - {type: dense, units: 2}\n  - {type: softmax}\n")
    err = assert_error(path, "layers[1]", "unknown type 'softmax'", "expected one of")
    for expected in ("'dense'", "'conv2d'", "'max_pool'", "'avg_pool'", "'lstm'", "'residual'", "'embedding'"):
        assert expected in err.reason


def test_error_unknown_input_kind_names_the_kind(tmp_path):
    path = write(tmp_path, "t.yaml",
                 "name: bad\ninput: {kind: image, shape: [4], classes: 2}\nlayers:\n  - {type: dense, units: 2}\n")
    assert_error(path, "input", "unknown kind 'image'", "'tensor'", "'tokens'")


def test_error_unknown_field(tmp_path):
    path = write(tmp_path, "t.yaml", DENSE_HEAD + "  - {type: dense, units: 2, activation: relu}\n")
    assert_error(path, "layers[0].activation", "unknown field")


def test_error_unknown_top_level_field(tmp_path):
    path = write(tmp_path, "t.yaml", DENSE_HEAD + "  - {type: dense, units: 2}\noptimizer: sgd\n")
    assert_error(path, "optimizer", "unknown field")


@pytest.mark.parametrize("kernel,reason", [
    ("-3", "kernel must be >= 1"),
    ("0", "kernel must be >= 1"),
    ("[3, 0]", "kernel must be >= 1"),
    ("[3, 3, 3]", "pair"),
    ("[3]", "pair"),
    ("3.5", "pair"),
    ("null", "pair"),
    ("[3, null]", "pair"),
    ("[2.5, 2]", "pair"),
    ("three", "pair"),
])
def test_error_bad_kernel(tmp_path, kernel, reason):
    path = write(tmp_path, "t.yaml", IMAGE_HEAD + "  - {type: flatten}\n"
                 f"  - {{type: conv2d, filters: 2, kernel: {kernel}}}\n")
    assert_error(path, "layers[1].kernel", reason)


def test_error_negative_padding_and_zero_stride(tmp_path):
    path = write(tmp_path, "p.yaml", IMAGE_HEAD + "  - {type: conv2d, filters: 2, kernel: 3, padding: -1}\n")
    assert_error(path, "layers[0].padding", "padding must be >= 0")
    path = write(tmp_path, "s.yaml", IMAGE_HEAD + "  - {type: max_pool, size: 2, stride: [1, 0]}\n")
    assert_error(path, "layers[0].stride", "stride must be >= 1")


def test_error_zero_filters(tmp_path):
    path = write(tmp_path, "t.yaml", IMAGE_HEAD + "  - {type: conv2d, filters: 0, kernel: 3}\n")
    assert_error(path, "layers[0].filters", "greater than 0")


def test_error_invalid_yaml_reports_line(tmp_path):
    path = write(tmp_path, "t.yaml",
                 "name: bad\ninput: {kind: tensor, shape: [4], classes: 2}\n  oops: 1\nlayers: []\n")
    err = assert_error(path, "", "invalid YAML", "line 3")
    assert re.search(r"line 3, column \d+", err.reason)


def test_error_invalid_yaml_unclosed_flow_mapping(tmp_path):
    path = write(tmp_path, "t.yaml", DENSE_HEAD + "  - {type: dense, units: 2\n  - {type: relu}\n")
    err = assert_error(path, "", "invalid YAML")
    assert re.search(r"line [45], column \d+", err.reason), err.reason


@pytest.mark.parametrize("text,got", [("- a\n- b\n", "list"), ("just a string\n", "str"), ("", "NoneType")])
def test_error_top_level_not_a_mapping(tmp_path, text, got):
    path = write(tmp_path, "t.yaml", text)
    assert_error(path, "", "expected a mapping at the top level", got)


def test_error_missing_required_field(tmp_path):
    path = write(tmp_path, "t.yaml", "name: bad\nlayers:\n  - {type: dense, units: 2}\n")
    assert_error(path, "input", "Field required")


def test_error_reports_how_many_more(tmp_path):
    path = write(tmp_path, "t.yaml", DENSE_HEAD + "  - {type: dense, units: 0}\n  - {type: dense, units: -1}\n")
    assert_error(path, "layers[0].units", "(and 1 more)")


def test_error_dense_after_conv_without_flatten(tmp_path):
    path = write(tmp_path, "t.yaml", IMAGE_HEAD + "  - {type: conv2d, filters: 2, kernel: 3}\n"
                 "  - {type: relu}\n  - {type: dense, units: 2}\n")
    assert_error(path, "layers[2]", "dense needs a flat or sequence input", "[2, 6, 6]", "flatten")


def test_error_output_does_not_match_classes(tmp_path):
    path = write(tmp_path, "t.yaml",
                 "name: bad\ninput: {kind: tensor, shape: [4], classes: 3}\nlayers:\n"
                 "  - {type: dense, units: 8}\n  - {type: relu}\n  - {type: dense, units: 2}\n")
    assert_error(path, "layers[2]", "(3,)", "[2]")


def test_error_zero_classes(tmp_path):
    path = write(tmp_path, "t.yaml",
                 "name: bad\ninput: {kind: tensor, shape: [4], classes: 0}\nlayers:\n  - {type: dense, units: 2}\n")
    assert_error(path, "input.classes", "greater than 0")


def test_error_language_model_output(tmp_path):
    path = write(tmp_path, "t.yaml",
                 "name: bad\ninput: {kind: tokens, vocabulary: 5, sequence_length: 3}\nlayers:\n"
                 "  - {type: embedding, vocabulary: 5, dim: 2}\n  - {type: lstm, hidden: 4}\n")
    assert_error(path, "layers[1]", "(steps, vocabulary)", "[3, 5]", "[3, 4]")


def test_error_option_a_cannot_reduce_channels(tmp_path):
    path = write(tmp_path, "t.yaml",
                 "name: bad\ninput: {kind: tensor, shape: [8, 4, 4], classes: 4}\nlayers:\n"
                 "  - {type: relu}\n"
                 "  - {type: residual, block: basic, filters: 4, shortcut: option_a}\n"
                 "  - {type: global_avg_pool}\n")
    assert_error(path, "layers[1]", "option_a", "reduce channels")


def test_error_token_network_must_start_with_embedding(tmp_path):
    path = write(tmp_path, "t.yaml",
                 "name: bad\ninput: {kind: tokens, vocabulary: 5, sequence_length: 3}\nlayers:\n"
                 "  - {type: dense, units: 5}\n  - {type: embedding, vocabulary: 5, dim: 2}\n")
    assert_error(path, "layers[0]", "embedding first")


def test_error_embedding_not_first(tmp_path):
    path = write(tmp_path, "t.yaml",
                 "name: bad\ninput: {kind: tokens, vocabulary: 5, sequence_length: 3}\nlayers:\n"
                 "  - {type: embedding, vocabulary: 5, dim: 2}\n  - {type: embedding, vocabulary: 5, dim: 2}\n")
    assert_error(path, "layers[1]", "embedding must be the first layer of a token-input network")


def test_error_embedding_in_tensor_network(tmp_path):
    path = write(tmp_path, "t.yaml", DENSE_HEAD + "  - {type: embedding, vocabulary: 5, dim: 2}\n")
    assert_error(path, "layers[0]", "token-input network")


def test_error_embedding_vocabulary_mismatch(tmp_path):
    path = write(tmp_path, "t.yaml",
                 "name: bad\ninput: {kind: tokens, vocabulary: 5, sequence_length: 3}\nlayers:\n"
                 "  - {type: embedding, vocabulary: 6, dim: 2}\n  - {type: dense, units: 5}\n")
    assert_error(path, "layers[0]", "vocabulary 6", "vocabulary 5")


def test_error_avg_pool_padding_is_not_a_field(tmp_path):
    path = write(tmp_path, "t.yaml", IMAGE_HEAD + "  - {type: avg_pool, size: 2, padding: 1}\n")
    assert_error(path, "layers[0].padding", "unknown field")


def test_error_max_pool_padding_over_half_window(tmp_path):
    path = write(tmp_path, "t.yaml", IMAGE_HEAD + "  - {type: max_pool, size: 2, padding: 2}\n")
    assert_error(path, "layers[0]", "at most half the window")


def test_error_kernel_larger_than_input(tmp_path):
    path = write(tmp_path, "t.yaml", IMAGE_HEAD + "  - {type: conv2d, filters: 2, kernel: 9}\n")
    assert_error(path, "layers[0]", "does not fit", "[1, 8, 8]")


def test_error_conv_on_flat_input(tmp_path):
    path = write(tmp_path, "t.yaml", DENSE_HEAD + "  - {type: conv2d, filters: 2, kernel: 1}\n")
    assert_error(path, "layers[0]", "(channels, height, width)", "[4]")


def test_error_bad_network_name(tmp_path):
    path = write(tmp_path, "t.yaml", DENSE_HEAD.replace("name: bad", "name: Bad-Net") + "  - {type: dense, units: 2}\n")
    assert_error(path, "name", "pattern")


def test_error_missing_file(tmp_path):
    path = tmp_path / "nowhere" / "missing.yaml"
    assert_error(path, "", "cannot read")


# --------------------------------------------------------------------------- the layer table

def test_the_layer_table_holds_every_layer_model_of_the_schema_in_its_order():
    """Every model of schema.py with a `type` field is one entry of definitions/layers/ (a model left
    out of BUILTIN would be one nobody can use), and an unknown type's message lists them in the
    table's order, which is the schema's."""
    from dlbench.definitions import layers, schema

    models = [m for m in vars(schema).values()
              if isinstance(m, type) and issubclass(m, schema.Strict) and "type" in m.model_fields]
    assert [entry.model for entry in layers.BUILTIN] == models
    assert layers.names() == ("dense", "conv2d", "max_pool", "avg_pool", "global_avg_pool", "batch_norm", "relu",
                              "sigmoid", "tanh", "flatten", "dropout", "embedding", "lstm", "residual",
                              "position_embedding", "patch_embedding", "layer_norm", "gelu", "attention",
                              "transformer_block", "token_pool", "lm_head", "segment_embedding", "pretraining_heads",
                              "rms_norm", "grouped_attention", "swiglu", "moe", "llama_block")
    for name in layers.names():
        assert name in layers.lookup(name).names


def test_the_loader_reads_the_union_tags_from_the_model():
    """The tags pydantic puts into an error's location come from the model validated (no list of
    them by hand): a network's layer types and input kinds."""
    from dlbench.definitions import layers
    from dlbench.definitions.loader import union_tags

    assert union_tags(layers.network_model()) == frozenset(layers.names()) | {"tensor", "tokens", "masked_tokens"}


# --------------------------------------------------------------------------- transformers

TOKENS = {"kind": "tokens", "vocabulary": 7, "sequence_length": 4}


def attention_counts(t: int, d: int, heads: int, size: int, bias: bool = True) -> tuple[int, int]:
    """By hand, network.py's convention: q, k, v, out as dense layers; 2*T*T*S per head for the scores
    and again for the weighted sum; 5 per score element for the softmax."""
    a = heads * size
    params = 3 * (d * a + (a if bias else 0)) + a * d + (d if bias else 0)
    flops = (3 * t * (2 * d * a + (a if bias else 0)) + 2 * 2 * t * t * size * heads + 5 * heads * t * t
             + t * (2 * a * d + (d if bias else 0)))
    return params, flops


def block_counts(t: int, d: int, heads: int, ratio: int = 4) -> tuple[int, int]:
    """One transformer block with biases: two layer norms, attention, fc1, gelu, fc2, two joins."""
    attn_params, attn_flops = attention_counts(t, d, heads, d // heads)
    h = ratio * d
    params = 2 * (2 * d) + attn_params + dense(d, h) + dense(h, d)
    flops = (2 * 5 * t * d + attn_flops + t * (2 * d * h + h) + 8 * t * h + t * (2 * h * d + d) + 2 * t * d)
    return params, flops


def test_gpt2_small_is_the_published_count():
    s = load_network(NETWORKS / "gpt2_small.yaml")
    block_params, block_flops = block_counts(1024, 768, 12)
    expected = 50257 * 768 + 1024 * 768 + 12 * block_params + 2 * 768  # the tied head adds nothing
    assert expected == 124_439_808  # Radford et al. 2019; HuggingFace's GPT2LMHeadModel
    assert s.params == expected
    # position add, 12 blocks, final layer norm, the head's 2*T*D*V (no bias)
    assert s.flops_per_sample == 1024 * 768 + 12 * block_flops + 5 * 1024 * 768 + 1024 * 2 * 768 * 50257
    assert s.output_shape == (1024, 50257)
    entries = s.resolved["layers"]
    assert [e["type"] for e in entries] == (["embedding", "position_embedding", "dropout"] + ["transformer_block"] * 12
                                            + ["layer_norm", "lm_head"])
    for e in entries[3:15]:
        assert "repeat" not in e
        assert e == {"type": "transformer_block", "heads": 12, "head_size": 64, "mlp_ratio": 4, "norm": "pre",
                     "gelu": "tanh", "causal": True, "bias": True, "dropout": 0.1, "eps": 1e-5,
                     "in_shape": [1024, 768], "out_shape": [1024, 768]}
    assert entries[-1] == {"type": "lm_head", "tied": True, "bias": False, "in_shape": [1024, 768],
                           "out_shape": [1024, 50257]}


def test_vit_b16_is_the_published_count():
    s = load_network(NETWORKS / "vit_b16.yaml")
    block_params, block_flops = block_counts(197, 768, 12)
    expected = (conv(16, 3, 768) + 768          # patch projection and the class token
                + 197 * 768 + 12 * block_params + 2 * 768 + dense(768, 1000))
    assert expected == 86_567_656  # Dosovitskiy et al. 2021, ViT-B/16 with a 1000-class head
    assert s.params == expected
    patch_conv = 2 * 16 * 16 * 3 * 768 * 14 * 14 + 768 * 14 * 14
    assert s.flops_per_sample == (patch_conv + 197 * 768 + 12 * block_flops + 5 * 197 * 768 + 0
                                  + 2 * 768 * 1000 + 1000)
    assert s.layers[0].out_shape == (197, 768)  # 14 x 14 patches behind the class token
    assert s.layers[4].type == "token_pool" and s.layers[4].out_shape == (768,)
    assert all(e["eps"] == 1e-6 and e["gelu"] == "erf" and not e["causal"] and e["dropout"] == 0.0
               for e in s.resolved["layers"] if e["type"] == "transformer_block")


def test_bert_base_is_the_published_count():
    s = load_network(NETWORKS / "bert_base.yaml")
    d, v, t = 768, 30522, 512
    block_params, block_flops = block_counts(t, d, 12)
    encoder = v * d + t * d + 2 * d + 2 * d + 12 * block_params + dense(d, d)  # tables, embedding norm, blocks, pooler
    assert encoder == 109_482_240  # Devlin et al. 2019; HuggingFace's BertModel with its pooler
    heads = dense(d, 2) + dense(d, d) + 2 * d + v  # next sentence, the MLM transform and its norm, the decoder bias
    assert s.params == encoder + heads == 110_106_428  # BertForPreTraining's count (the decoder tied)
    assert s.head_params == heads
    inp = s.resolved["input"]
    m = round(0.15 * t)
    assert len(inp["masked_positions"]) == m == 77 and inp["segment_boundary"] == 256
    assert inp["masked_positions"] == sorted(set(inp["masked_positions"])) and 0 not in inp["masked_positions"]
    assert s.output_shape == (m, v)
    # position add, segment add, embedding norm, 12 blocks, then the heads: pooler (+ tanh) and next
    # sentence on one position; transform, gelu, norm and the decoder (with its bias) at the m masked
    heads_flops = (2 * d * d + d + d) + (2 * d * 2 + 2) + m * (2 * d * d + d) + 8 * m * d + 5 * m * d + m * (2 * d * v + v)
    assert s.flops_per_sample == t * d + t * d + 5 * t * d + 12 * block_flops + heads_flops
    assert all(e["norm"] == "post" and e["gelu"] == "erf" and not e["causal"] and e["eps"] == 1e-12
               for e in s.resolved["layers"] if e["type"] == "transformer_block")


def test_masked_positions_are_seeded_and_follow_the_length(tmp_path):
    layers = [{"type": "embedding", "vocabulary": 9, "dim": 4}, {"type": "segment_embedding"},
              {"type": "pretraining_heads", "gelu": "erf"}]

    def positions(**inp):
        doc = {"kind": "masked_tokens", "vocabulary": 9, **inp}
        return load_tiny(tmp_path, doc, layers, loss="masked_lm_and_next_sentence").resolved["input"]["masked_positions"]

    assert positions(sequence_length=40) == positions(sequence_length=40)  # drawn by the analysis, not a framework
    assert positions(sequence_length=40) != positions(sequence_length=40, mask_seed=1)
    assert len(positions(sequence_length=40)) == 6 and len(positions(sequence_length=40, mask_fraction=0.5)) == 20
    assert positions(sequence_length=2) == [1]  # at least one, never the [CLS] position 0


@pytest.mark.parametrize("inp,layers,loss,field,reason", [
    ({"kind": "tokens", "vocabulary": 9, "sequence_length": 6},
     [{"type": "embedding", "vocabulary": 9, "dim": 4}, {"type": "lm_head", "tied": True}],
     "masked_lm_and_next_sentence", "loss", "tokens trains with loss softmax_cross_entropy"),
    ({"kind": "masked_tokens", "vocabulary": 9, "sequence_length": 6},
     [{"type": "embedding", "vocabulary": 9, "dim": 4}, {"type": "pretraining_heads", "gelu": "erf"}],
     None, "loss", "masked_tokens trains with loss masked_lm_and_next_sentence"),
    ({"kind": "tokens", "vocabulary": 9, "sequence_length": 6},
     [{"type": "embedding", "vocabulary": 9, "dim": 4}, {"type": "segment_embedding"}, {"type": "lm_head", "tied": True}],
     None, "layers[1]", "segment_embedding needs a masked_tokens input"),
    ({"kind": "masked_tokens", "vocabulary": 9, "sequence_length": 6},
     [{"type": "embedding", "vocabulary": 9, "dim": 4}, {"type": "lm_head", "tied": True}],
     "masked_lm_and_next_sentence", "layers[1]", "must end in its pretraining_heads' (masked positions, vocabulary) = [1, 9]"),
    ({"kind": "masked_tokens", "vocabulary": 9, "sequence_length": 6},
     [{"type": "embedding", "vocabulary": 9, "dim": 4}, {"type": "dense", "units": 6},
      {"type": "pretraining_heads", "gelu": "erf", "tied": True}],
     "masked_lm_and_next_sentence", "layers[2]", "take the embedding's width 4, got 6"),
    ({"kind": "masked_tokens", "vocabulary": 9, "sequence_length": 1},
     [{"type": "embedding", "vocabulary": 9, "dim": 4}, {"type": "pretraining_heads", "gelu": "erf"}],
     "masked_lm_and_next_sentence", "input.sequence_length", "greater than or equal to 2"),
])
def test_bert_input_and_heads_errors(tmp_path, inp, layers, loss, field, reason):
    extra = {"loss": loss} if loss else {}
    assert_error(network_file(tmp_path, inp, layers, **extra), field, reason)


def test_transformer_tiny_is_small():
    s = load_network(NETWORKS / "transformer_tiny.yaml")
    block_params, _ = block_counts(32, 64, 4)
    assert s.params == 512 * 64 + 32 * 64 + 2 * block_params + 2 * 64 == 134_912
    assert s.flops_per_sample < 1e7 and s.output_shape == (32, 512)


def test_position_embedding_counts_and_resolved_entry(tmp_path):
    s = load_tiny(tmp_path, TOKENS, [{"type": "embedding", "vocabulary": 7, "dim": 3},
                                     {"type": "position_embedding", "max_length": 6},
                                     {"type": "lm_head", "tied": False}])
    assert (s.layers[1].params, s.layers[1].flops) == (6 * 3, 4 * 3)  # the whole table; one add per element
    assert s.resolved["layers"][1] == {"type": "position_embedding", "max_length": 6, "in_shape": [4, 3],
                                       "out_shape": [4, 3]}
    assert (s.layers[2].params, s.layers[2].flops) == (7 * 3, 4 * 2 * 3 * 7)  # untied, no bias by default
    assert s.params == 21 + 18 + 21


@pytest.mark.parametrize("class_token,tokens", [(True, 7), (False, 6)])
def test_patch_embedding_counts_its_convolution(tmp_path, class_token, tokens):
    # [2, 4, 6], patch 2 -> a 2 x 3 grid of 3-wide tokens
    s = load_tiny(tmp_path, {"kind": "tensor", "shape": [2, 4, 6], "classes": 3},
                  [{"type": "patch_embedding", "patch": 2, "dim": 3, "class_token": class_token},
                   {"type": "token_pool", "mode": "mean"}])
    assert s.layers[0].out_shape == (tokens, 3)
    assert s.layers[0].params == 2 * 2 * 2 * 3 + 3 + (3 if class_token else 0)
    assert s.layers[0].flops == 2 * 2 * 2 * 2 * 3 * 6 + 3 * 6  # 288 + the bias, 18
    assert s.layers[1].flops == tokens * 3 and s.output_shape == (3,)


def test_layer_norm_gelu_and_class_pool(tmp_path):
    s = load_tiny(tmp_path, {"kind": "tensor", "shape": [3, 4, 4], "classes": 5},
                  [{"type": "patch_embedding", "patch": 2, "dim": 5},  # (5, 5)
                   {"type": "layer_norm"},
                   {"type": "gelu", "form": "erf"},
                   {"type": "token_pool", "mode": "class"},
                   {"type": "layer_norm", "eps": 1e-6},  # on (D,)
                   {"type": "gelu", "form": "tanh"}])
    assert [(x.params, x.flops) for x in s.layers[1:]] == [(10, 5 * 25), (0, 8 * 25), (0, 0), (10, 5 * 5),
                                                           (0, 8 * 5)]
    entries = s.resolved["layers"]
    assert entries[1]["eps"] == pytest.approx(1e-5) and entries[4]["eps"] == pytest.approx(1e-6)
    assert entries[2]["form"] == "erf" and entries[5]["form"] == "tanh"


@pytest.mark.parametrize("fields,size,params,flops", [
    ({}, 3, 168, 1792),                                      # head size 6 / 2
    ({"head_size": 4}, 4, 222, 2328),                        # 8 inner columns, projected back to 6
    ({"bias": False, "causal": True}, 3, 144, 1792 - 3 * 4 * 6 - 4 * 6),  # a causal product counted in full
])
def test_attention_counts(tmp_path, fields, size, params, flops):
    s = load_tiny(tmp_path, {"kind": "tokens", "vocabulary": 6, "sequence_length": 4},
                  [{"type": "embedding", "vocabulary": 6, "dim": 6},
                   {"type": "attention", "heads": 2, **fields},
                   {"type": "lm_head", "tied": True}])
    assert (s.layers[1].params, s.layers[1].flops) == (params, flops)
    assert (params, flops) == attention_counts(4, 6, 2, size, fields.get("bias", True))
    assert s.resolved["layers"][1] == {"type": "attention", "heads": 2, "head_size": size,
                                       "causal": fields.get("causal", False), "bias": fields.get("bias", True),
                                       "dropout": 0.0, "in_shape": [4, 6], "out_shape": [4, 6]}


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_transformer_block_expands_per_block(tmp_path, norm):
    s = load_tiny(tmp_path, {"kind": "tokens", "vocabulary": 9, "sequence_length": 4},
                  [{"type": "embedding", "vocabulary": 9, "dim": 8},
                   {"type": "transformer_block", "heads": 2, "mlp_ratio": 2, "norm": norm, "gelu": "erf",
                    "repeat": 3},
                   {"type": "lm_head", "tied": True, "bias": True}])
    # one block: ln 32 + attention 288 + fc1 (8 -> 16) 144 + fc2 136; forward 5888 FLOPs by hand
    assert block_counts(4, 8, 2, ratio=2) == (600, 5888)
    assert (s.layers[1].params, s.layers[1].flops) == (3 * 600, 3 * 5888)
    blocks = s.resolved["layers"][1:4]
    assert len(s.resolved["layers"]) == 5
    assert blocks == [{"type": "transformer_block", "heads": 2, "head_size": 4, "mlp_ratio": 2, "norm": norm,
                       "gelu": "erf", "causal": False, "bias": True, "dropout": 0.0, "eps": 1e-5,
                       "in_shape": [4, 8], "out_shape": [4, 8]}] * 3
    # the tied head: its bias only, and a dense layer's FLOPs
    assert (s.layers[2].params, s.layers[2].flops) == (9, 4 * (2 * 8 * 9 + 9))
    assert s.params == 9 * 8 + 1800 + 9


def test_hash_changes_with_transformer_fields(tmp_path):
    def block(**fields):
        layer = {"type": "transformer_block", "heads": 2, "norm": "pre", "gelu": "tanh", **fields}
        return load_tiny(tmp_path, TOKENS, [{"type": "embedding", "vocabulary": 7, "dim": 4}, layer,
                                            {"type": "lm_head", "tied": True}]).definition_hash

    hashes = [block(), block(norm="post"), block(gelu="erf"), block(causal=True), block(dropout=0.1),
              block(eps=1e-6), block(bias=False), block(mlp_ratio=2), block(head_size=3)]
    assert len(set(hashes)) == len(hashes)
    assert block() == block(head_size=2, repeat=1)  # the defaults written out


TOKEN_HEAD = "name: bad\ninput: {kind: tokens, vocabulary: 5, sequence_length: 8}\nlayers:\n"
VIT_HEAD = "name: bad\ninput: {kind: tensor, shape: [3, 12, 12], classes: 4}\nlayers:\n"


def test_error_heads_do_not_divide_the_width(tmp_path):
    path = write(tmp_path, "a.yaml", TOKEN_HEAD + "  - {type: embedding, vocabulary: 5, dim: 6}\n"
                 "  - {type: attention, heads: 4}\n  - {type: lm_head, tied: true}\n")
    assert_error(path, "layers[1]", "4 heads do not divide the width 6", "head_size")
    path = write(tmp_path, "b.yaml", TOKEN_HEAD + "  - {type: embedding, vocabulary: 5, dim: 6}\n"
                 "  - {type: transformer_block, heads: 5, norm: pre, gelu: erf}\n  - {type: lm_head, tied: true}\n")
    assert_error(path, "layers[1]", "5 heads do not divide the width 6")


def test_error_patch_does_not_divide_the_image(tmp_path):
    path = write(tmp_path, "t.yaml", VIT_HEAD + "  - {type: patch_embedding, patch: 5, dim: 4}\n"
                 "  - {type: token_pool, mode: class}\n")
    assert_error(path, "layers[0]", "patch 5 does not divide", "[12, 12]")


def test_error_patch_embedding_on_a_flat_input(tmp_path):
    path = write(tmp_path, "t.yaml", DENSE_HEAD + "  - {type: patch_embedding, patch: 2, dim: 4}\n")
    assert_error(path, "layers[0]", "(channels, height, width)", "[4]")


def test_error_position_table_too_short(tmp_path):
    path = write(tmp_path, "t.yaml", TOKEN_HEAD + "  - {type: embedding, vocabulary: 5, dim: 4}\n"
                 "  - {type: position_embedding, max_length: 6}\n  - {type: lm_head, tied: true}\n")
    assert_error(path, "layers[1]", "8 positions", "max_length 6")


def test_error_tied_head_without_a_token_embedding(tmp_path):
    path = write(tmp_path, "t.yaml", VIT_HEAD + "  - {type: patch_embedding, patch: 4, dim: 4}\n"
                 "  - {type: lm_head, tied: true}\n")
    assert_error(path, "layers[1]", "tied lm_head needs the network's token embedding", "patch_embedding")


def test_error_tied_head_of_another_width(tmp_path):
    path = write(tmp_path, "t.yaml", TOKEN_HEAD + "  - {type: embedding, vocabulary: 5, dim: 4}\n"
                 "  - {type: dense, units: 6}\n  - {type: lm_head, tied: true}\n")
    assert_error(path, "layers[2]", "embedding's width 4", "got 6")


def test_error_untied_head_without_a_vocabulary(tmp_path):
    path = write(tmp_path, "t.yaml", VIT_HEAD + "  - {type: patch_embedding, patch: 4, dim: 4}\n"
                 "  - {type: lm_head, tied: false}\n")
    assert_error(path, "layers[1]", "lm_head needs a token input")


@pytest.mark.parametrize("layer,field,reason", [
    ("{type: gelu, form: exact}", "layers[1].form", "'erf' or 'tanh'"),
    ("{type: gelu}", "layers[1].form", "Field required"),
    ("{type: layer_norm, eps: 0}", "layers[1].eps", "greater than 0"),
    ("{type: attention, heads: 0}", "layers[1].heads", "greater than 0"),
    ("{type: attention, heads: 2, dropout: 1.0}", "layers[1].dropout", "less than 1"),
    ("{type: attention, heads: 2, head_size: 0}", "layers[1].head_size", "greater than 0"),
    ("{type: transformer_block, heads: 2, gelu: erf}", "layers[1].norm", "Field required"),
    # fields named like a layer type are fields, not the union's tag
    ("{type: transformer_block, heads: 2, norm: pre, gelu: relu}", "layers[1].gelu", "'erf' or 'tanh'"),
    ("{type: transformer_block, heads: 2, norm: pre, gelu: erf, dropout: -0.1}", "layers[1].dropout",
     "greater than or equal to 0"),
    ("{type: transformer_block, heads: 2, norm: sandwich, gelu: erf}", "layers[1].norm", "'pre' or 'post'"),
    ("{type: transformer_block, heads: 2, norm: pre, gelu: erf, repeat: 0}", "layers[1].repeat", "greater than 0"),
    ("{type: transformer_block, heads: 2, norm: pre, gelu: erf, mlp_ratio: 1.5}", "layers[1].mlp_ratio", "integer"),
    ("{type: token_pool, mode: max}", "layers[1].mode", "'class' or 'mean'"),
    ("{type: lm_head}", "layers[1].tied", "Field required"),
    ("{type: position_embedding, max_length: 8, dim: 4}", "layers[1].dim", "unknown field"),
])
def test_error_bad_transformer_fields(tmp_path, layer, field, reason):
    path = write(tmp_path, "t.yaml", TOKEN_HEAD + f"  - {{type: embedding, vocabulary: 5, dim: 4}}\n  - {layer}\n"
                 "  - {type: lm_head, tied: true}\n")
    assert_error(path, field, reason)


def test_error_attention_on_an_image(tmp_path):
    path = write(tmp_path, "t.yaml", IMAGE_HEAD + "  - {type: attention, heads: 1}\n")
    assert_error(path, "layers[0]", "attention needs a sequence (T, D) input", "[1, 8, 8]")


# --------------------------------------------------------------------------- an embedding's scale

TOKENS_IN = {"kind": "tokens", "vocabulary": 20, "sequence_length": 4}


def test_embedding_init_std_is_resolved_when_described_and_left_out_when_not(tmp_path):
    described = load_tiny(tmp_path, TOKENS_IN, [{"type": "embedding", "vocabulary": 20, "dim": 8, "init_std": 0.02},
                                                {"type": "dense", "units": 20}])
    default = load_tiny(tmp_path, TOKENS_IN, [{"type": "embedding", "vocabulary": 20, "dim": 8},
                                              {"type": "dense", "units": 20}])
    assert described.resolved["layers"][0]["init_std"] == 0.02
    # absent: the framework's default; not written into the resolved form, so older hashes hold
    assert "init_std" not in default.resolved["layers"][0]
    assert described.definition_hash != default.definition_hash
    assert described.params == default.params


@pytest.mark.parametrize("bad", [0, -0.1, 2, float("inf"), True, "0.02"])
def test_embedding_init_std_must_be_a_finite_scale_in_0_1(tmp_path, bad):
    path = network_file(tmp_path, TOKENS_IN, [{"type": "embedding", "vocabulary": 20, "dim": 8, "init_std": bad},
                                              {"type": "dense", "units": 20}])
    assert "init_std" in str(load_error(path))


# --------------------------------------------------------------------------- a dense layer's initialisation

FLAT_IN = {"kind": "tensor", "shape": [64], "classes": 10}
HE_NORMAL = {"distribution": "normal", "scale": 2.0, "mode": "fan_in"}


def test_dense_init_is_resolved_when_described_and_left_out_when_not(tmp_path):
    described = load_tiny(tmp_path, FLAT_IN, [{"type": "dense", "units": 32, "init": HE_NORMAL}, {"type": "sigmoid"},
                                              {"type": "dense", "units": 10}])
    default = load_tiny(tmp_path, FLAT_IN, [{"type": "dense", "units": 32}, {"type": "sigmoid"},
                                            {"type": "dense", "units": 10}])
    assert described.resolved["layers"][0]["init"] == HE_NORMAL
    # absent: the framework's default; not written into the resolved form, so older hashes hold
    assert "init" not in default.resolved["layers"][0] and "init" not in described.resolved["layers"][2]
    assert described.definition_hash != default.definition_hash
    assert described.params == default.params
    uniform = load_tiny(tmp_path, FLAT_IN, [{"type": "dense", "units": 10,
                                             "init": {"distribution": "uniform", "scale": 1.0}}])
    assert uniform.resolved["layers"][0]["init"] == {"distribution": "uniform", "scale": 1.0, "mode": "fan_in"}


@pytest.mark.parametrize(("init", "field"), [
    ({"distribution": "gaussian", "scale": 2.0}, "distribution"),
    ({"distribution": "normal", "scale": 0}, "scale"),
    ({"distribution": "normal", "scale": float("inf")}, "scale"),
    ({"distribution": "normal", "scale": "2"}, "scale"),
    ({"distribution": "normal", "scale": 2.0, "mode": "fan_sum"}, "mode"),
    ({"distribution": "normal", "scale": 2.0, "seed": 1}, "seed"),
    ({"scale": 2.0}, "distribution"),
])
def test_a_bad_dense_init_is_one_error_naming_its_field(tmp_path, init, field):
    path = network_file(tmp_path, FLAT_IN, [{"type": "dense", "units": 10, "init": init}])
    message = str(load_error(path))
    assert "layers[0]" in message and f"init.{field}" in message, message
