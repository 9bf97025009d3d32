"""docs/extending.md, "Add a layer type": a toy `scale` layer (y = a * x, one learned scalar) added
as one entry of the layer table (src/dlbench/definitions/layers/) and nothing else on the
controller's side. Registered through the table's public API for the length of each test (the
fixture takes it out again), it validates, resolves, counts, has canonical weights and a workload,
and runs end to end through the CLI and the fake runner; unregistered, a network that uses it is one
DefinitionError naming the file and the layer."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from dlbench.cli import app
from dlbench.definitions import layers
from dlbench.definitions.layers import Inferred, LayerType, Site
from dlbench.definitions.layers.base import numel
from dlbench.definitions.loader import DefinitionError, load_network
from dlbench.definitions.schema import Strict
from dlbench.definitions.weights import random_weights, trainable_count, weight_shapes
from dlbench.execution import equivalence
from dlbench.performance.workload import decompose, kernel_specs
from dlbench.store.store import Store

ANSI = re.compile(r"\x1b\[[0-9;]*m")


# ------------------------------------------------------------------ the toy layer type: one entry

class Scale(Strict):
    """scale: y = a * x, one learned scalar a, on a flat or image input."""

    type: Literal["scale"]


def infer(layer: Scale, site: Site) -> Inferred:
    if len(site.shape) not in (1, 3):
        raise site.error(f"scale needs a flat or image input, got {list(site.shape)}")
    return Inferred(site.shape, params=1, flops=numel(site.shape))  # one multiply per element


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.scale": (1,)}


def work(b, layer, entry: dict, input_grad: bool) -> None:
    n = b.batch * numel(entry["in_shape"])
    layer.forward.append(b.passes("scale", n, 2))  # read x, write y
    if b.train:
        layer.backward.append(b.passes("scale gradient", n, 2, 2))  # sum(x * dy): read x and dy
        if input_grad:
            layer.backward.append(b.passes("scale input gradient", n, 2))  # dx = a * dy


# One multiply per element, not a product whose operands are rounded to the compute format in sequence
# with others (y = a * x is exact to one rounding); nothing it decides.
SCALE = LayerType(Scale, infer, work, weights, rounding_depth=0, decisions=0)


@pytest.fixture
def scale_layer():
    before = layers.names()
    with layers.registered(SCALE) as entry:
        assert layers.names() == before + ("scale",)
        yield entry
    assert layers.names() == before  # the extension ends with the test


# ------------------------------------------------------------------ a network that uses it

IMAGE = {"kind": "tensor", "shape": [2, 4, 4], "classes": 3}
LAYERS = [{"type": "conv2d", "filters": 3, "kernel": 3}, {"type": "scale"}, {"type": "relu"},
          {"type": "flatten"}, {"type": "dense", "units": 3}]


def network_file(tmp_path: Path, layer_list=LAYERS, input_=IMAGE, name="scaled") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "input": input_, "layers": layer_list}, sort_keys=False))
    return path


def test_a_registered_type_resolves_and_counts(tmp_path, scale_layer):
    s = load_network(network_file(tmp_path))
    # conv 2 -> 3 channels, 3x3 on 4x4: out 3x2x2; scale keeps the shape; flatten 12; dense 12 -> 3
    assert [layer.type for layer in s.layers] == ["conv2d", "scale", "relu", "flatten", "dense"]
    scale = s.layers[1]
    assert (scale.in_shape, scale.out_shape, scale.params, scale.flops) == ((3, 2, 2), (3, 2, 2), 1, 12)
    assert scale.resolved == [{"type": "scale", "in_shape": [3, 2, 2], "out_shape": [3, 2, 2]}]
    conv_params, dense_params = 9 * 2 * 3 + 3, 12 * 3 + 3
    assert s.params == conv_params + 1 + dense_params == 97
    conv_flops = 2 * 9 * 2 * 3 * 2 * 2 + 3 * 2 * 2
    assert s.flops_per_sample == conv_flops + 12 + 12 + (2 * 12 * 3 + 3)
    assert s.resolved["layers"][1] == scale.resolved[0]
    without = load_network(network_file(tmp_path, [x for x in LAYERS if x["type"] != "scale"], name="plain"))
    assert s.definition_hash != without.definition_hash


def test_its_canonical_weights_and_workload(tmp_path, scale_layer):
    s = load_network(network_file(tmp_path))
    shapes = weight_shapes(s.resolved)
    assert shapes["001.scale"] == (1,)
    assert trainable_count(shapes) == s.params  # the weights are what is trained
    assert random_weights(s.resolved)["001.scale"].dtype.name == "float32"

    train = decompose(s.resolved, 4, "train")
    layer = train.layers[1]
    n = 4 * 12
    assert (layer.label, layer.params) == ("001 scale", 1)
    assert [(op.label, op.flops, op.bytes) for op in layer.forward] == [("scale", n, 2 * 4 * n)]
    # a convolution precedes it, so it also computes its input's gradient
    assert [(op.label, op.flops, op.bytes) for op in layer.backward] == [
        ("scale gradient", 2 * n, 2 * 4 * n), ("scale input gradient", n, 2 * 4 * n)]
    assert [op.kernel.key for op in layer.update] == ["sgd_momentum elements=1 float32"]
    assert "sgd_momentum elements=1 float32" in {k.key for k in kernel_specs(train)}
    infer_only = decompose(s.resolved, 4, "infer").layers[1]
    assert infer_only.backward == [] and infer_only.update == []


def test_its_shape_rule_names_file_and_layer(tmp_path, scale_layer):
    tokens = {"kind": "tokens", "vocabulary": 7, "sequence_length": 5}
    path = network_file(tmp_path, [{"type": "embedding", "vocabulary": 7, "dim": 4}, {"type": "scale"},
                                   {"type": "dense", "units": 7}], tokens)
    with pytest.raises(DefinitionError) as info:
        load_network(path)
    assert str(info.value) == f"{path}: layers[1]: scale needs a flat or image input, got [5, 4]"


def test_an_unknown_type_is_one_definition_error_naming_file_and_field(tmp_path):
    assert "scale" not in layers.names()
    path = network_file(tmp_path)
    with pytest.raises(DefinitionError) as info:
        load_network(path)
    e = info.value
    assert (e.path, e.field) == (str(path), "layers[1]")
    assert e.reason.startswith("unknown type 'scale'; expected one of 'dense', 'conv2d', ")
    assert "(and" not in e.reason  # one problem, one message
    last_builtin = layers.names()[-1]
    with layers.registered(SCALE):  # registered, it is one of the expected ones, after the built-in ones
        wrong = network_file(tmp_path, [LAYERS[0], {"type": "scales"}, *LAYERS[2:]], name="typo")
        with pytest.raises(DefinitionError, match=rf"layers\[1\]: unknown type 'scales'; .*'{last_builtin}', 'scale'$"):
            load_network(wrong)


def test_the_table_refuses_a_taken_name_and_a_model_without_a_type():
    class Dense2(Strict):
        type: Literal["dense"]

    with pytest.raises(ValueError, match="layer type 'dense' is already registered"):
        layers.register(LayerType(Dense2, infer, work, rounding_depth=1, decisions=0))

    class Untyped(Strict):
        kind: Literal["x"]

    with pytest.raises(ValueError, match="needs a field `type: Literal"):
        LayerType(Untyped, infer, work, rounding_depth=0, decisions=0)
    with pytest.raises(ValueError, match="unknown layer type 'scale'"):
        layers.lookup("scale")
    assert layers.network_model() is layers.network_model()  # built once per set of types


# ------------------------------------------------------------------ the mixed-precision tolerance

def test_the_mixed_precision_tolerance_counts_what_the_table_declares(tmp_path, scale_layer):
    """The network's products in sequence and decisions are the sum of its entries' declarations: the
    toy layer declaring 3 products and 2 decisions instead of none moves both, and the tolerances
    follow the docstring's model with those counts (LAYERS: a conv2d, a relu and a dense otherwise)."""
    path = network_file(tmp_path)
    net = load_network(path)
    assert (equivalence.rounding_depth(net), equivalence.decision_depth(net)) == (2, 1)
    layers.unregister(scale_layer)
    deeper = LayerType(Scale, infer, work, weights, rounding_depth=3,
                       decisions=lambda entry: 2 if entry["type"] == "scale" else 99)
    with layers.registered(deeper):
        net = load_network(path)
        assert (equivalence.rounding_depth(net), equivalence.decision_depth(net)) == (5, 3)
        u = equivalence.UNIT_ROUNDOFF["amp_bf16"]
        allowed = equivalence.mixed_tolerances(net, "amp_bf16")
        assert allowed["logits"] == pytest.approx(8 * np.sqrt(5) * u)
        assert allowed["update"] == pytest.approx(8 * np.sqrt(15) * u + np.sqrt(2 * u * 3))
    layers.register(scale_layer)  # the fixture takes it out again


@pytest.mark.parametrize("given,missing", [({}, "rounding_depth and decisions"),
                                           ({"decisions": 0}, "rounding_depth"),
                                           ({"rounding_depth": 1}, "decisions")])
def test_a_layer_type_that_does_not_declare_its_rounding_counts_is_refused(given, missing):
    """No silent 0: a matmul-like type left at depth 0 would be held to a tolerance too tight for it."""
    before = layers.names()
    with pytest.raises(ValueError, match=rf"layer type 'scale': declare {missing} \(keyword arguments"):
        layers.register(LayerType(Scale, infer, work, weights, **given))
    assert layers.names() == before


@pytest.mark.parametrize("value", [-1, 1.5, True, "2"])
def test_a_rounding_count_that_is_not_a_count_is_refused(value):
    with pytest.raises(ValueError, match=r"layer type 'scale': rounding_depth must be a count"):
        LayerType(Scale, infer, work, weights, rounding_depth=value, decisions=0)


def test_a_rounding_count_function_that_gives_no_count_names_the_layer_type(tmp_path):
    broken = LayerType(Scale, infer, work, weights, rounding_depth=lambda entry: -1, decisions=0)
    with layers.registered(broken):
        net = load_network(network_file(tmp_path))
        with pytest.raises(ValueError, match=r"layer type 'scale': its rounding_depth gave -1 for"):
            equivalence.rounding_depth(net)


# ------------------------------------------------------------------ end to end: CLI, fake runner, store

def test_a_network_with_it_runs_through_the_cli_and_the_fake_runner(project, tmp_path, monkeypatch, scale_layer):
    monkeypatch.delenv("DLBENCH_FAKE_BEHAVIOUR", raising=False)
    monkeypatch.setenv("DLBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DLBENCH_FAKE_STEP_S", "0.0005")
    network = network_file(tmp_path)
    suite = tmp_path / "scaled_suite.yaml"
    suite.write_text(yaml.safe_dump({"name": "scaled_suite", "benchmarks": [
        {"network": network.name, "modes": ["train"], "batch_sizes": {"smoke": [2], "default": [4], "paper": [8]}}]}))
    store = tmp_path / "store"
    result = CliRunner().invoke(app, ["run", "--no-check", "--suite", str(suite), "--framework", "fake", "--env", "current",
                                      "--profile", "smoke", "--device", "cpu", "--threads", "1", "--repeats", "1",
                                      "--store", str(store)], catch_exceptions=False)
    assert result.exit_code == 0, ANSI.sub("", result.stderr)
    (record,) = Store(store).records()
    summary = load_network(network)
    assert (record.benchmark, record.status) == ("scaled-train", "ok")
    assert record.network.hash == summary.definition_hash
    assert record.network.definition["layers"][1]["type"] == "scale"
    assert (record.network.params_described, record.network.flops_per_sample) == (97, summary.flops_per_sample)
