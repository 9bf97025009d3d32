"""The canonical weight format: names, shapes, layouts and the random weight set of `dlbench check`.

Expected names and shapes are written out by hand from the layer lists (and the format described at
the top of definitions/weights.py), not computed by the code under test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from dlbench.definitions.loader import load_network
from dlbench.definitions.weights import is_state, random_weights, trainable_count, weight_shapes

REPO = Path(__file__).resolve().parents[2]
NETWORKS = REPO / "suites" / "networks"
SEED = ["alexnet", "alexnet_r", "fcn5", "fcn8", "lstm32", "lstm64", "resnet50", "resnet56"]  # of the seed suite
SHIPPED = sorted(p.stem for p in NETWORKS.glob("*.yaml"))  # a network added is checked with them


def tiny(tmp_path: Path, input_: dict, layers: list[dict], name: str = "tiny"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "input": input_, "layers": layers}, sort_keys=False))
    return load_network(path)


def bn(prefix: str, c: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.gamma": (c,), f"{prefix}.beta": (c,), f"{prefix}.running_mean": (c,),
            f"{prefix}.running_var": (c,)}


# --------------------------------------------------------------------------- shipped networks


def test_all_eight_networks_are_there():
    assert set(SEED) <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_format_counts_the_described_parameters(name):
    net = load_network(NETWORKS / f"{name}.yaml")
    shapes = weight_shapes(net.resolved)
    assert trainable_count(shapes) == net.params == net.resolved["params"]
    # every tensor has positive dimensions; names are <3-digit resolved layer index>.<part>
    for tensor, shape in shapes.items():
        assert all(isinstance(d, int) and d > 0 for d in shape), tensor
        index = tensor.split(".", 1)[0]
        assert len(index) == 3 and index.isdigit() and int(index) < len(net.resolved["layers"])


def test_trainable_count_leaves_out_running_statistics():
    shapes = {"000.weight": (3, 4), "001.gamma": (3,), "001.beta": (3,), "001.running_mean": (3,),
              "001.running_var": (3,)}
    assert trainable_count(shapes) == 12 + 3 + 3
    assert is_state("001.running_mean") and is_state("005.bn2.running_var")
    assert not is_state("001.gamma") and not is_state("003.l0.bias")


def test_resnet56_has_no_projection_and_resnet50_has_one_per_stage():
    r56 = weight_shapes(load_network(NETWORKS / "resnet56.yaml").resolved)
    assert not any(".proj" in n for n in r56)  # option A shortcuts have no parameters
    r50 = weight_shapes(load_network(NETWORKS / "resnet50.yaml").resolved)
    projections = sorted(n for n in r50 if n.endswith(".proj.weight"))
    # stem conv, bn, relu, max_pool = 000..003; blocks 004..019 ([3, 4, 6, 3]); first of each stage projects
    assert projections == ["004.proj.weight", "007.proj.weight", "011.proj.weight", "017.proj.weight"]
    assert r50["004.proj.weight"] == (256, 64, 1, 1)
    assert r50["017.proj.weight"] == (2048, 1024, 1, 1)
    assert r50["019.conv3.weight"] == (2048, 512, 1, 1)
    assert r50["021.weight"] == (1000, 2048)


# --------------------------------------------------------------------------- hand-written networks


def test_dense_names_shapes_and_missing_bias(tmp_path):
    net = tiny(tmp_path, {"kind": "tensor", "shape": [5], "classes": 2}, [
        {"type": "dense", "units": 3},
        {"type": "relu"},
        {"type": "dense", "units": 2, "bias": False},
    ])
    shapes = weight_shapes(net.resolved)
    assert shapes == {"000.weight": (3, 5), "000.bias": (3,), "002.weight": (2, 3)}
    assert list(shapes) == ["000.weight", "000.bias", "002.weight"]  # layer order
    assert trainable_count(shapes) == 15 + 3 + 6 == net.params


def test_conv_oihw_batch_norm_flatten_dense(tmp_path):
    net = tiny(tmp_path, {"kind": "tensor", "shape": [3, 8, 8], "classes": 2}, [
        {"type": "conv2d", "filters": 4, "kernel": [3, 2]},  # -> (4, 6, 7)
        {"type": "batch_norm"},
        {"type": "relu"},
        {"type": "conv2d", "filters": 5, "kernel": 1, "bias": False},  # -> (5, 6, 7)
        {"type": "flatten"},
        {"type": "dense", "units": 2},
    ])
    shapes = weight_shapes(net.resolved)
    assert shapes == {
        "000.weight": (4, 3, 3, 2), "000.bias": (4,),  # out, in, kh, kw
        **bn("001", 4),
        "003.weight": (5, 4, 1, 1),  # no bias entry
        "005.weight": (2, 5 * 6 * 7), "005.bias": (2,),
    }
    assert trainable_count(shapes) == (72 + 4) + 8 + 20 + (420 + 2) == net.params


def test_batch_norm_on_a_flat_input(tmp_path):
    net = tiny(tmp_path, {"kind": "tensor", "shape": [6], "classes": 2}, [
        {"type": "batch_norm"},
        {"type": "dense", "units": 2, "bias": False},
    ])
    assert weight_shapes(net.resolved) == {**bn("000", 6), "001.weight": (2, 6)}
    assert trainable_count(weight_shapes(net.resolved)) == 12 + 12 == net.params


def test_embedding_and_two_layer_lstm(tmp_path):
    net = tiny(tmp_path, {"kind": "tokens", "vocabulary": 11, "sequence_length": 4}, [
        {"type": "embedding", "vocabulary": 11, "dim": 3},
        {"type": "lstm", "hidden": 5, "layers": 2},
        {"type": "dense", "units": 11},
    ])
    shapes = weight_shapes(net.resolved)
    assert list(shapes.items()) == [
        ("000.weight", (11, 3)),
        ("001.l0.w_ih", (20, 3)), ("001.l0.w_hh", (20, 5)), ("001.l0.bias", (20,)),
        ("001.l1.w_ih", (20, 5)), ("001.l1.w_hh", (20, 5)), ("001.l1.bias", (20,)),
        ("002.weight", (11, 5)), ("002.bias", (11,)),
    ]
    assert trainable_count(shapes) == 33 + (60 + 100 + 20) + (100 + 100 + 20) + (55 + 11) == net.params


def test_residual_basic_projection_only_where_the_shape_changes(tmp_path):
    net = tiny(tmp_path, {"kind": "tensor", "shape": [4, 8, 8], "classes": 3}, [
        {"type": "residual", "block": "basic", "filters": 4, "repeat": 2, "shortcut": "projection"},  # 000, 001
        {"type": "residual", "block": "basic", "filters": 6, "stride": 2, "shortcut": "projection"},  # 002
        {"type": "residual", "block": "basic", "filters": 8, "stride": 2, "shortcut": "option_a"},  # 003
        {"type": "global_avg_pool"},
        {"type": "dense", "units": 3},
    ])
    assert [x["shortcut"] for x in net.resolved["layers"][:4]] == ["identity", "identity", "projection", "option_a"]
    shapes = weight_shapes(net.resolved)

    def basic(p, cin, f):
        return {f"{p}.conv1.weight": (f, cin, 3, 3), **bn(f"{p}.bn1", f),
                f"{p}.conv2.weight": (f, f, 3, 3), **bn(f"{p}.bn2", f)}

    assert shapes == {
        **basic("000", 4, 4), **basic("001", 4, 4),
        **basic("002", 4, 6), "002.proj.weight": (6, 4, 1, 1), **bn("002.proj_bn", 6),
        **basic("003", 6, 8),
        "005.weight": (3, 8), "005.bias": (3,),
    }
    assert not any(n.endswith(("conv1.bias", "conv2.bias", "proj.bias")) for n in shapes)
    expected = 2 * (144 + 8 + 144 + 8) + (216 + 12 + 324 + 12 + 24 + 12) + (432 + 16 + 576 + 16) + 27
    assert trainable_count(shapes) == expected == net.params


def test_residual_bottleneck(tmp_path):
    net = tiny(tmp_path, {"kind": "tensor", "shape": [4, 8, 8], "classes": 2}, [
        {"type": "residual", "block": "bottleneck", "filters": 2, "repeat": 2},  # 4 -> 8 channels, then 8 -> 8
        {"type": "global_avg_pool"},
        {"type": "dense", "units": 2},
    ])
    shapes = weight_shapes(net.resolved)

    def bottleneck(p, cin, f):
        return {f"{p}.conv1.weight": (f, cin, 1, 1), **bn(f"{p}.bn1", f),
                f"{p}.conv2.weight": (f, f, 3, 3), **bn(f"{p}.bn2", f),
                f"{p}.conv3.weight": (4 * f, f, 1, 1), **bn(f"{p}.bn3", 4 * f)}

    assert shapes == {
        **bottleneck("000", 4, 2), "000.proj.weight": (8, 4, 1, 1), **bn("000.proj_bn", 8),
        **bottleneck("001", 8, 2),
        "003.weight": (2, 8), "003.bias": (2,),
    }
    expected = (8 + 4 + 36 + 4 + 16 + 16 + 32 + 16) + (16 + 4 + 36 + 4 + 16 + 16) + 18
    assert trainable_count(shapes) == expected == net.params


def test_layers_without_weights_have_no_entries(tmp_path):
    net = tiny(tmp_path, {"kind": "tensor", "shape": [2, 6, 6], "classes": 2}, [
        {"type": "max_pool", "size": 2},
        {"type": "avg_pool", "size": 3},
        {"type": "tanh"},
        {"type": "dropout", "rate": 0.5},
        {"type": "flatten"},
        {"type": "sigmoid"},
        {"type": "dense", "units": 2},
    ])
    assert weight_shapes(net.resolved) == {"006.weight": (2, 2), "006.bias": (2,)}


# --------------------------------------------------------------------------- random_weights


@pytest.fixture
def bn_net(tmp_path):
    return tiny(tmp_path, {"kind": "tensor", "shape": [3, 8, 8], "classes": 10}, [
        {"type": "conv2d", "filters": 64, "kernel": 3, "padding": 1, "bias": False},
        {"type": "batch_norm"},
        {"type": "relu"},
        {"type": "residual", "block": "basic", "filters": 32, "stride": 2},
        {"type": "flatten"},
        {"type": "dense", "units": 10},
    ])


def test_random_weights_match_the_format(bn_net):
    w = random_weights(bn_net.resolved, seed=0)
    shapes = weight_shapes(bn_net.resolved)
    assert list(w) == list(shapes)
    for name, a in w.items():
        assert a.dtype == np.float32, name
        assert a.shape == shapes[name], name
        assert np.all(np.isfinite(a)), name


def test_random_weights_deterministic_per_seed_and_different_across_seeds(bn_net):
    a, b, c = (random_weights(bn_net.resolved, s) for s in (0, 0, 1))
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
        assert not np.array_equal(a[name], c[name]), name
    # tensors of one set are not copies of each other
    assert not np.array_equal(a["003.bn1.gamma"], a["003.bn2.gamma"])
    assert not np.array_equal(a["003.bn1.running_var"], a["003.bn2.running_var"])


def test_random_weights_scales(bn_net):
    w = random_weights(bn_net.resolved, seed=3)
    gammas = [a for n, a in w.items() if n.endswith(".gamma")]
    assert len(gammas) == 4  # stem bn, bn1, bn2, proj_bn
    for g in gammas:
        assert np.all(np.abs(g - 1) < 0.6) and abs(float(g.mean()) - 1) < 0.1
    for n, a in w.items():
        if n.endswith(".running_var"):
            assert np.all(a > 0), n
        if n.endswith((".beta", ".bias", ".running_mean")):
            assert float(np.abs(a).max()) < 0.6, n
    # N(0, 1/fan_in): std * sqrt(fan_in) near 1 on the larger tensors
    for n, fan_in in (("000.weight", 3 * 9), ("003.conv2.weight", 32 * 9), ("005.weight", 32 * 4 * 4)):
        assert abs(float(w[n].std()) * np.sqrt(fan_in) - 1) < 0.15, n
        assert abs(float(w[n].mean())) < 0.05, n


def test_random_weights_lstm_fan_in_is_the_input_width(tmp_path):
    net = tiny(tmp_path, {"kind": "tokens", "vocabulary": 50, "sequence_length": 4}, [
        {"type": "embedding", "vocabulary": 50, "dim": 400},
        {"type": "lstm", "hidden": 100},
        {"type": "dense", "units": 50},
    ])
    w = random_weights(net.resolved, 0)
    assert abs(float(w["001.l0.w_ih"].std()) * np.sqrt(400) - 1) < 0.1
    assert abs(float(w["001.l0.w_hh"].std()) * np.sqrt(100) - 1) < 0.1


# --------------------------------------------------------------------------- transformers


def attn(p: str, d: int, inner: int, bias: bool = True) -> dict[str, tuple[int, ...]]:
    out = {}
    for part in ("q", "k", "v"):
        out[f"{p}.{part}.weight"] = (inner, d)
        if bias:
            out[f"{p}.{part}.bias"] = (inner,)
    out[f"{p}.out.weight"] = (d, inner)
    if bias:
        out[f"{p}.out.bias"] = (d,)
    return out


@pytest.fixture
def decoder(tmp_path):
    return tiny(tmp_path, {"kind": "tokens", "vocabulary": 11, "sequence_length": 4}, [
        {"type": "embedding", "vocabulary": 11, "dim": 8},                 # 000
        {"type": "position_embedding", "max_length": 6},                   # 001
        {"type": "dropout", "rate": 0.1},                                  # 002
        {"type": "transformer_block", "heads": 2, "mlp_ratio": 3, "norm": "pre", "gelu": "tanh",
         "causal": True, "repeat": 2},                                     # 003, 004
        {"type": "layer_norm"},                                            # 005
        {"type": "lm_head", "tied": True},                                 # 006
    ])


def test_decoder_blocks_and_a_tied_head_without_a_tensor(decoder):
    shapes = weight_shapes(decoder.resolved)

    def block(p):
        return {f"{p}.ln1.gamma": (8,), f"{p}.ln1.beta": (8,), **attn(f"{p}.attn", 8, 8),
                f"{p}.ln2.gamma": (8,), f"{p}.ln2.beta": (8,),
                f"{p}.mlp.fc1.weight": (24, 8), f"{p}.mlp.fc1.bias": (24,),
                f"{p}.mlp.fc2.weight": (8, 24), f"{p}.mlp.fc2.bias": (8,)}

    assert list(shapes.items()) == list({
        "000.weight": (11, 8), "001.weight": (6, 8), **block("003"), **block("004"),
        "005.gamma": (8,), "005.beta": (8,),
    }.items())
    assert not any(n.startswith("006.") for n in shapes)  # the head is 000.weight
    per_block = 32 + 4 * (64 + 8) + (192 + 24) + (192 + 8)
    assert trainable_count(shapes) == 88 + 48 + 2 * per_block + 16 == decoder.params


def test_attention_head_size_and_no_bias_and_untied_head(tmp_path):
    net = tiny(tmp_path, {"kind": "tokens", "vocabulary": 5, "sequence_length": 3}, [
        {"type": "embedding", "vocabulary": 5, "dim": 6},
        {"type": "attention", "heads": 2, "head_size": 5, "bias": False},
        {"type": "lm_head", "tied": False, "bias": True},
    ])
    shapes = weight_shapes(net.resolved)
    assert shapes == {"000.weight": (5, 6), **attn("001", 6, 10, bias=False), "002.weight": (5, 6), "002.bias": (5,)}
    assert trainable_count(shapes) == 30 + 4 * 60 + 35 == net.params


def test_patch_embedding_is_oihw_with_a_class_token(tmp_path):
    net = tiny(tmp_path, {"kind": "tensor", "shape": [3, 8, 8], "classes": 2}, [
        {"type": "patch_embedding", "patch": 4, "dim": 6},      # (1 + 4, 6)
        {"type": "position_embedding", "max_length": 5},
        {"type": "layer_norm", "eps": 1e-6},
        {"type": "token_pool", "mode": "class"},
        {"type": "dense", "units": 2},
    ])
    assert weight_shapes(net.resolved) == {
        "000.weight": (6, 3, 4, 4), "000.bias": (6,), "000.class_token": (6,),
        "001.weight": (5, 6), "002.gamma": (6,), "002.beta": (6,), "004.weight": (2, 6), "004.bias": (2,)}
    assert trainable_count(weight_shapes(net.resolved)) == 288 + 12 + 30 + 12 + 14 == net.params


def test_random_weights_of_a_transformer(tmp_path):
    net = tiny(tmp_path, {"kind": "tensor", "shape": [3, 32, 32], "classes": 2}, [
        {"type": "patch_embedding", "patch": 2, "dim": 256},     # 257 tokens
        {"type": "position_embedding", "max_length": 257},
        {"type": "transformer_block", "heads": 4, "norm": "post", "gelu": "erf"},
        {"type": "token_pool", "mode": "mean"},
        {"type": "dense", "units": 2},
    ])
    w = random_weights(net.resolved, seed=1)
    assert list(w) == list(weight_shapes(net.resolved))
    # class token and position table: N(0, 0.02^2), GPT-2's and ViT's initialisation
    for name in ("000.class_token", "001.weight"):
        assert abs(float(w[name].std()) - 0.02) < 0.004, name
    # layer norm near identity; biases small; matrices N(0, 1/fan_in)
    assert abs(float(w["002.ln1.gamma"].mean()) - 1) < 0.05 and float(np.abs(w["002.ln2.beta"]).max()) < 0.6
    for name, fan_in in (("002.attn.q.weight", 256), ("002.attn.out.weight", 256), ("002.mlp.fc2.weight", 1024),
                         ("000.weight", 3 * 2 * 2)):
        assert abs(float(w[name].std()) * np.sqrt(fan_in) - 1) < 0.15, name
