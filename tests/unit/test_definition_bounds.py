"""Every number of a definition has a bound storage and the machine can hold (issue 18, class 2),
booleans are not integers, a network's size is checked before it is built or listed, and a file
that is not UTF-8 is one error (class 6). The property tests substitute arbitrary YAML values into
valid definitions: whatever the input, the loaders answer or raise the one DefinitionError."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dlbench.cli import app
from dlbench.definitions import schema
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.definitions.loader import DefinitionError, load_network

REPO = Path(__file__).resolve().parents[2]
SUITES = REPO / "suites"
INT64_MAX = 2**63 - 1

TINY = {"name": "tiny", "input": {"kind": "tensor", "shape": [4], "classes": 2},
        "layers": [{"type": "dense", "units": 2}]}
CNN = {"name": "cnn", "input": {"kind": "tensor", "shape": [3, 8, 8], "classes": 2},
       "layers": [{"type": "conv2d", "filters": 4, "kernel": 3, "padding": 1},
                  {"type": "residual", "block": "basic", "filters": 4, "repeat": 2},
                  {"type": "global_avg_pool"}, {"type": "dense", "units": 2}]}
LSTM = {"name": "lm", "input": {"kind": "tokens", "vocabulary": 16, "sequence_length": 4},
        "layers": [{"type": "embedding", "vocabulary": 16, "dim": 8}, {"type": "lstm", "hidden": 8, "layers": 2},
                   {"type": "dense", "units": 16}]}


def write(path: Path, doc) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def network_error(tmp_path: Path, doc: dict) -> DefinitionError:
    path = write(tmp_path / "net.yaml", doc)
    with pytest.raises(DefinitionError) as info:
        load_network(path)
    assert str(info.value).startswith(f"{path}: ")
    return info.value


def with_change(doc: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


@pytest.mark.parametrize("doc, where, value, field, reason", [
    (CNN, ("layers", 1, "repeat"), 100_000_000, "layers[1].repeat", "less than or equal to 1024"),
    (LSTM, ("layers", 1, "layers"), 100_000_000, "layers[1].layers", "less than or equal to 1024"),
    (LSTM, ("layers", 1, "layers"), "1e8", "layers[1].layers", "valid integer"),
    (TINY, ("layers", 0, "units"), True, "layers[0].units", "valid integer"),
    (TINY, ("layers", 0, "units"), 2.0, "layers[0].units", "valid integer"),
    (TINY, ("layers", 0, "units"), 2**70, "layers[0].units", "less than or equal to"),
    (TINY, ("layers", 0, "bias"), 1, "layers[0].bias", "valid boolean"),
    (TINY, ("input", "classes"), 10**20, "input.classes", "less than or equal to"),
    (TINY, ("input", "shape"), [True], "input.shape[0]", "valid integer"),
    (CNN, ("layers", 0, "kernel"), [3, 10**19], "layers[0].kernel", "kernel must be <= 65536"),
    (CNN, ("input", "shape"), [65536, 65536, 65536], "input.shape", "more than 4294967296 elements"),
    (LSTM, ("input", "sequence_length"), 2**40, "input.sequence_length", "less than or equal to"),
    (TINY, ("layers",), [{"type": "relu"}] * 5000, "layers", "at most 4096"),
])
def test_a_number_out_of_bounds_is_one_error_naming_the_field(tmp_path, doc, where, value, field, reason):
    err = network_error(tmp_path, with_change(doc, where, value))
    assert err.field == field
    assert reason in err.reason


def test_float_fields_must_be_finite(tmp_path):
    doc = with_change(CNN, ("layers", 2), {"type": "dropout", "rate": float("nan")})
    assert "finite" in network_error(tmp_path, doc).reason
    doc = {**TINY, "layers": [{"type": "layer_norm", "eps": float("inf")}, {"type": "dense", "units": 2}]}
    assert network_error(tmp_path, doc).field == "layers[0].eps"


def test_the_resolved_size_is_estimated_before_the_network_is_expanded(tmp_path):
    # five stages of 1000 blocks: each within `repeat`'s bound, together past MAX_LAYERS entries
    stage = {"type": "residual", "block": "basic", "filters": 4, "repeat": 1000}
    doc = {**CNN, "layers": [CNN["layers"][0], *[stage] * 5, *CNN["layers"][2:]]}
    err = network_error(tmp_path, doc)
    assert err.field == "layers[5]" and "more than 4096 layers" in err.reason


def test_parameters_and_activations_are_bounded_layer_by_layer(tmp_path):
    wide = 1 << 24
    doc = {**TINY, "layers": [{"type": "dense", "units": wide}, {"type": "dense", "units": wide},
                              {"type": "dense", "units": 2}]}
    err = network_error(tmp_path, doc)
    assert err.field == "layers[1]" and "parameters up to this layer" in err.reason
    doc = {**CNN, "layers": [{"type": "conv2d", "filters": 1 << 24, "kernel": 1}, *CNN["layers"][2:]],
           "input": {"kind": "tensor", "shape": [3, 1024, 1024], "classes": 2}}
    err = network_error(tmp_path, doc)
    assert err.field == "layers[0]" and "elements in one sample's output" in err.reason


def suites_root(tmp_path: Path) -> Path:
    root = tmp_path / "suites"
    shutil.copytree(SUITES / "networks", root / "networks")
    for name in ("profiles", "fcn", "distributed", "comm"):
        shutil.copy(SUITES / f"{name}.yaml", root / f"{name}.yaml")
    return root


def load_suite_file(root: Path, path: Path, profile: str = "smoke"):
    catalog = SuiteCatalog(root)
    if catalog.suite_kind(path) == "benchmark":
        return catalog.load_suite(path, profile, "cpu")
    return catalog.load_distributed_suite(path, profile, "cpu")


def suite_error(root: Path, name: str, doc: dict) -> DefinitionError:
    path = write(root / f"{name}.yaml", doc)
    with pytest.raises(DefinitionError) as info:
        load_suite_file(root, path)
    assert str(info.value).startswith(f"{path}: ")
    return info.value


@pytest.mark.parametrize("name, where, value, field, reason", [
    ("fcn", ("benchmarks", 0, "batch_sizes", "smoke"), [True], "benchmarks[0].batch_sizes.smoke[0]", "valid integer"),
    ("fcn", ("benchmarks", 0, "batch_sizes", "smoke"), [10**20], "benchmarks[0].batch_sizes.smoke[0]", "less than"),
    ("fcn", ("defaults", "learning_rate"), float("inf"), "defaults.learning_rate", "finite"),
    ("fcn", ("benchmarks", 0, "learning_rate"), float("nan"), "benchmarks[0].learning_rate", "finite"),
    ("fcn", ("benchmarks", 0, "momentum"), True, "benchmarks[0].momentum", "valid number"),
    ("distributed", ("policy", "smoke", "repeats"), 10**20, "policy.smoke.repeats", "less than or equal to 1000"),
    ("distributed", ("policy", "smoke", "measure_iters"), 1e20, "policy.smoke.measure_iters", "valid integer"),
    ("comm", ("sizes", "smoke"), {"start": 4, "stop": 2**70}, "sizes.smoke.stop", "less than or equal to"),
])
def test_suite_numbers_are_bounded(tmp_path, name, where, value, field, reason):
    root = suites_root(tmp_path)
    doc = yaml.safe_load((root / f"{name}.yaml").read_text())
    err = suite_error(root, name, with_change(doc, where, value))
    assert err.field == field
    assert reason in err.reason


def test_profile_numbers_are_bounded(tmp_path):
    root = suites_root(tmp_path)
    profiles = yaml.safe_load((root / "profiles.yaml").read_text())
    write(root / "profiles.yaml", with_change(profiles, ("smoke", "warmup", "max_time_s"), float("inf")))
    with pytest.raises(DefinitionError) as info:
        load_suite_file(root, root / "fcn.yaml")
    assert info.value.field == "smoke.warmup.max_time_s"


def test_a_suite_file_that_is_not_utf8_is_one_error_naming_it(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: caf\xe9\nbenchmarks: []\n")
    result = CliRunner().invoke(app, ["list", "--suite", str(path)])
    assert result.exit_code == 2
    assert f"{path}: not UTF-8 text: byte 0xe9 on line 1" in " ".join(result.output.split())
    assert "Traceback" not in result.output


# ------------------------------------------------------------------ property tests

INTERESTING = [0, -1, 1, 2, 3, 5, 1000, 2**31, 2**63 - 1, 2**63, 2**64, 10**20, -(2**63) - 1, 1e20, 1e308, -0.0,
               0.5, 1.0, float("inf"), float("-inf"), float("nan"), True, False, None, "", "1e8", ".inf", "0x10",
               "dense", "residual", "lstm", "conv2d", "tensor", "tokens", "train", "infer", "fp32", "kind",
               "distributed", "comm", "benchmark", "kernels", [], {}, [1, 2], [[1]], {"type": "dense"}]
scalars = st.one_of(st.sampled_from(INTERESTING), st.integers(), st.floats(), st.text(max_size=12),
                    st.integers(min_value=-(2**80), max_value=2**80))
keys = st.one_of(st.sampled_from(["type", "kind", "units", "repeat", "layers", "name", "shape", "smoke", "default",
                                  "cpu", "batch_sizes", "network", "start", "stop"]), st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(keys, inner, max_size=4)), max_leaves=8)


def paths_of(node, prefix=()) -> list[tuple]:
    """Every place in a document a value can be put: each key and index, and a new key per mapping."""
    out = []
    if isinstance(node, dict):
        out.append(prefix + ("<new>",))
        for k, v in node.items():
            out.append(prefix + (k,))
            out.extend(paths_of(v, prefix + (k,)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append(prefix + (i,))
            out.extend(paths_of(v, prefix + (i,)))
    return out


@st.composite
def mutated(draw, base: dict):
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(paths_of(doc)))
        node = doc
        for key in where[:-1]:
            node = node[key]
        last = where[-1]
        # a copy: a mutable value of INTERESTING must not be changed by a later mutation
        if last == "<new>":
            node[draw(keys)] = copy.deepcopy(draw(values))
        elif isinstance(node, dict) and draw(st.booleans()) and draw(st.booleans()):
            del node[last]  # a field left out
        else:
            node[last] = copy.deepcopy(draw(values))
    return doc


NETWORK_BASES = [TINY, CNN, LSTM, yaml.safe_load((SUITES / "networks" / "transformer_tiny.yaml").read_text())]
PROPERTY = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                             HealthCheck.too_slow])


def assert_storable(summary) -> None:
    assert 0 < summary.params <= schema.MAX_PARAMS and 0 <= summary.flops_per_sample <= schema.MAX_FLOPS
    assert len(summary.resolved["layers"]) <= schema.MAX_LAYERS


@PROPERTY
@given(data=st.data())
def test_property_network_loader_answers_or_raises_one_definition_error(tmp_path, data):
    doc = data.draw(mutated(data.draw(st.sampled_from(NETWORK_BASES))))
    path = tmp_path / "net.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    try:
        summary = load_network(path)
    except DefinitionError as e:
        assert str(e).startswith(f"{path}: ")
        return
    assert_storable(summary)


@PROPERTY
@given(raw=st.binary(max_size=200))
def test_property_any_bytes_as_a_network_file_are_one_definition_error(tmp_path, raw):
    path = tmp_path / "bytes.yaml"
    path.write_bytes(raw)
    with pytest.raises(DefinitionError):
        load_network(path)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return suites_root(tmp_path_factory.mktemp("property"))


@PROPERTY
@given(data=st.data())
def test_property_suite_loaders_answer_or_raise_one_definition_error(root, data):
    name = data.draw(st.sampled_from(["fcn", "distributed", "comm", "profiles"]))
    original = (SUITES / f"{name}.yaml").read_text()
    target = root / f"{name}.yaml"
    target.write_text(yaml.safe_dump(data.draw(mutated(yaml.safe_load(original))), allow_unicode=True))
    suite = root / ("fcn.yaml" if name == "profiles" else f"{name}.yaml")
    try:
        loaded = load_suite_file(root, suite, data.draw(st.sampled_from(["smoke", "default", "paper"])))
    except DefinitionError as e:
        assert str(e).startswith(f"{root}/")
        return
    finally:
        target.write_text(original)
    for b in getattr(loaded, "benchmarks", ()):
        assert all(0 < n <= INT64_MAX for n in b.batch_sizes)
        assert 0 < b.learning_rate < float("inf")


def test_yaml_aliases_are_refused_before_they_can_expand(tmp_path):
    # nine levels of ten aliases each: 10^9 leaves once expanded, a few hundred bytes written
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    path = tmp_path / "laughs.yaml"
    path.write_text("name: laughs\n" + "\n".join(lines) + "\n")
    with pytest.raises(DefinitionError) as info:
        load_network(path)
    assert "expands to more than 100,000 values" in str(info.value) and "laughs.yaml" in str(info.value)
