"""`dlbench check` without a framework: error measure, tolerances, inputs, the comparison logic of
check_network (with the worker probe replaced by synthetic outputs) and the check store."""

from __future__ import annotations

import inspect
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from dlbench.definitions.loader import load_network
from dlbench.definitions.network import NetworkSummary
from dlbench.definitions.weights import random_weights
from dlbench.execution import equivalence
from dlbench.execution.environments import Environment, EnvironmentBuildError
from dlbench.execution.equivalence import check_batch_size, check_network, make_inputs, relative_error, tolerance_for
from dlbench.execution.registry import RunnerRegistry
from dlbench.store.checks import CheckStore, FrameworkCheck

ROOT = Path(__file__).resolve().parents[2]
NETWORKS = ROOT / "suites" / "networks"


# --------------------------------------------------------------------------- relative_error


def test_relative_error_exact_values():
    assert relative_error(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 4.0])) == 0.25
    # max |a - b| / max |b|: the largest difference over the largest reference magnitude
    assert relative_error(np.array([0.0, -2.0]), np.array([1.0, -4.0])) == 0.5
    assert relative_error(np.array([[1.0, 5.0], [3.0, 0.0]]), np.array([[1.5, 5.0], [3.0, -8.0]])) == 1.0
    assert relative_error(np.array([1.0, 2.0]), np.array([1.0, 2.0])) == 0.0
    assert relative_error(np.float32(2.2), np.float32(2.0)) == pytest.approx(0.1, rel=1e-6)  # scalars (a loss)
    # not symmetric: b is the reference
    assert relative_error(np.array([2.0]), np.array([1.0])) == 1.0
    assert relative_error(np.array([1.0]), np.array([2.0])) == 0.5


def test_relative_error_computes_in_float64():
    a = np.array([1.0 + 1e-7], dtype=np.float32)
    b = np.array([1.0], dtype=np.float32)
    assert relative_error(a, b) == pytest.approx(float(np.float32(1.0 + 1e-7)) - 1.0, rel=1e-9)


@pytest.mark.parametrize("a_shape,b_shape", [((3,), (1, 3)), ((2, 3), (3, 2)), ((0,), (4,)), ((4,), ())])
def test_relative_error_shape_mismatch_is_infinite(a_shape, b_shape):
    assert relative_error(np.zeros(a_shape), np.zeros(b_shape)) == float("inf")


def test_relative_error_zero_reference_is_floored():
    with np.errstate(all="raise"):  # no division by zero, no invalid value
        assert relative_error(np.zeros(3), np.zeros(3)) == 0.0
        assert relative_error(np.array([1e-3, 0.0]), np.zeros(2)) == pytest.approx(1e-3 / equivalence._FLOOR)
        assert relative_error(np.empty((0, 4)), np.empty((0, 4))) == 0.0


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_relative_error_non_finite_values_are_never_within_tolerance(bad):
    good = np.array([1.0, 2.0])
    broken = np.array([1.0, bad])
    assert relative_error(broken, good) > 1.0
    assert relative_error(good, broken) > 1.0
    assert not relative_error(broken, good) <= equivalence.TOLERANCE_BATCH_NORM


# --------------------------------------------------------------------------- tolerances, batch, inputs


@pytest.mark.parametrize("name,tol", [("fcn5", 1e-4), ("fcn8", 1e-4), ("lstm32", 1e-4), ("lstm64", 1e-4),
                                      ("alexnet_r", 1e-4), ("alexnet", 1e-4),
                                      ("resnet56", 1e-3), ("resnet50", 1e-3)])
def test_tolerance_for_shipped_networks(name, tol):
    assert tolerance_for(load_network(NETWORKS / f"{name}.yaml")) == tol


def tiny(tmp_path: Path, input_: dict, layers: list[dict], name: str = "tiny") -> NetworkSummary:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "input": input_, "layers": layers}, sort_keys=False))
    return load_network(path)


def test_tolerance_for_batch_norm_alone_and_residual_alone(tmp_path):
    plain = tiny(tmp_path, {"kind": "tensor", "shape": [6], "classes": 2}, [{"type": "dense", "units": 2}], "p")
    with_bn = tiny(tmp_path, {"kind": "tensor", "shape": [6], "classes": 2},
                   [{"type": "batch_norm"}, {"type": "dense", "units": 2}], "b")
    with_res = tiny(tmp_path, {"kind": "tensor", "shape": [2, 4, 4], "classes": 2},
                    [{"type": "residual", "block": "basic", "filters": 2}, {"type": "global_avg_pool"}], "r")
    assert (tolerance_for(plain), tolerance_for(with_bn), tolerance_for(with_res)) == (1e-4, 1e-3, 1e-3)


@pytest.mark.parametrize("name,batch", [("fcn5", 4), ("fcn8", 4), ("lstm32", 4), ("lstm64", 4), ("alexnet_r", 4),
                                        ("resnet56", 4), ("alexnet", 2), ("resnet50", 2)])
def test_check_batch_size_shipped(name, batch):
    assert check_batch_size(load_network(NETWORKS / f"{name}.yaml")) == batch


def test_check_batch_size_threshold_is_one_gflop():
    def net(flops):
        return NetworkSummary("x", 1, flops, (1,), [], {})

    assert check_batch_size(net(10**9)) == 4
    assert check_batch_size(net(10**9 + 1)) == 2


def test_make_inputs_tensor_network():
    net = load_network(NETWORKS / "alexnet_r.yaml")
    inp = make_inputs(net, 3)
    assert set(inp) == {"x", "y"}
    assert inp["x"].shape == (3, 3, 32, 32) and inp["x"].dtype == np.float32
    assert inp["y"].shape == (3,) and inp["y"].dtype == np.int64
    assert inp["y"].min() >= 0 and inp["y"].max() < 10
    flat = make_inputs(load_network(NETWORKS / "fcn5.yaml"), 4)
    assert flat["x"].shape == (4, 784) and flat["x"].dtype == np.float32 and flat["y"].shape == (4,)


def test_make_inputs_token_network():
    net = load_network(NETWORKS / "lstm32.yaml")
    inp = make_inputs(net, 4)
    for key in ("x", "y"):
        assert inp[key].shape == (4, 32) and inp[key].dtype == np.int64
        assert inp[key].min() >= 0 and inp[key].max() < 10000
    assert len(np.unique(inp["x"])) > 100  # spread over the vocabulary, not a constant


def test_make_inputs_deterministic_per_seed():
    net = load_network(NETWORKS / "fcn5.yaml")
    a, b, c = make_inputs(net, 4, 0), make_inputs(net, 4, 0), make_inputs(net, 4, 1)
    np.testing.assert_array_equal(a["x"], b["x"])
    np.testing.assert_array_equal(a["y"], b["y"])
    assert not np.array_equal(a["x"], c["x"])


# --------------------------------------------------------------------------- check_network


@pytest.fixture(scope="module")
def fake():
    return RunnerRegistry(ROOT / "tests" / "fixtures" / "runners").get("fake")


@pytest.fixture
def bn_net(tmp_path):
    """Conv without bias, batch norm, flatten, dense: tolerance 1e-3, running statistics in the format."""
    return tiny(tmp_path, {"kind": "tensor", "shape": [2, 4, 4], "classes": 5}, [
        {"type": "conv2d", "filters": 3, "kernel": 3, "padding": 1, "bias": False},
        {"type": "batch_norm"},
        {"type": "relu"},
        {"type": "flatten"},
        {"type": "dense", "units": 5},
    ], "bnnet")


@pytest.fixture
def plain_net(tmp_path):
    return tiny(tmp_path, {"kind": "tensor", "shape": [6], "classes": 4}, [
        {"type": "dense", "units": 8}, {"type": "tanh"}, {"type": "dense", "units": 4}], "plainnet")


def outputs(net: NetworkSummary, seed: int = 0, version: str = "1.0", lr: float = 0.1) -> dict:
    """What a correct framework reports: the canonical weights exported as loaded, one SGD step of
    a fixed fake gradient, and fixed logits and loss. The same for every call."""
    w = random_weights(net.resolved, seed)
    rng = np.random.default_rng(1234)
    out = {}
    for name, a in w.items():
        grad = rng.standard_normal(a.shape).astype(np.float32)
        out[f"init/{name}"] = a.copy()
        out[f"loaded/{name}"] = a.copy()
        out[f"after/{name}"] = (a - np.float32(lr) * grad).astype(np.float32)
    out["logits"] = rng.standard_normal((check_batch_size(net), net.output_shape[-1])).astype(np.float32)
    out["loss"] = np.array(2.3, dtype=np.float32)
    out["__params__"] = net.params
    out["__version__"] = version
    return out


class FakeProbe:
    """Stands in for equivalence._probe: answers per framework name from `answers`."""

    def __init__(self, answers: dict):
        self.answers = answers
        self.calls = []

    def __call__(self, runner, env, network, workdir, device, timeout_s, weights_path, inputs_path, batch,
                 threads=None, learning_rate=0.1, momentum=0.9, precision="float64"):
        with np.load(weights_path) as wf, np.load(inputs_path) as xf:
            self.calls.append({"runner": runner.name, "env": env, "device": device, "timeout_s": timeout_s,
                               "batch": batch, "precision": precision, "threads": threads,
                               "weights": {k: wf[k] for k in wf.files},
                               "inputs": {k: xf[k] for k in xf.files}})
        answer = self.answers[runner.name]
        if isinstance(answer, tuple):
            return answer
        return dict(answer), None, "ok"


def env_for(name: str) -> Environment:
    return Environment(name, "current", "cpu", Path(sys.executable), "test-key")


def run_check(monkeypatch, fake, net, answers: dict, envs: dict | None = None, **kwargs):
    """check_network through FakeProbe; in fp32 unless `precision` says otherwise (most tests
    here are about float32's tolerances and its spread; the float64 ones say so)."""
    kwargs.setdefault("precision", "fp32")
    probe = FakeProbe(answers)
    monkeypatch.setattr(equivalence, "_probe", probe)
    envs = envs or {}
    runners = [(replace(fake, name=n), envs.get(n, env_for(n))) for n in answers]
    results = check_network(net, runners, **kwargs)
    assert [r.framework for r in results] == list(answers)  # one result per framework, in order
    return results, probe


def by_name(results):
    return {r.framework: r for r in results}


def test_identical_frameworks_are_reference_and_equivalent(monkeypatch, fake, bn_net):
    results, probe = run_check(monkeypatch, fake, bn_net, {"a": outputs(bn_net, version="2.1"), "b": outputs(bn_net)},
                               device="cpu", timeout_s=33)
    a, b = results
    assert (a.status, b.status) == ("reference", "equivalent")
    assert a.ok and b.ok and a.reason is None and b.reason is None
    assert b.errors == {"roundtrip": 0.0, "logits": 0.0, "loss": 0.0, "weights": 0.0, "update": 0.0,
                        "worst_tensor_update": 0.0, "allowed_weights": 1e-3}
    assert a.errors == {"roundtrip": 0.0, "self_spread_weights": 0.0}
    assert (a.framework_version, b.framework_version) == ("2.1", "1.0")
    for r in results:
        assert r.network == "bnnet" and r.params == r.params_described == bn_net.params
        assert r.tolerance == 1e-3 and r.network_hash == bn_net.definition_hash and r.checked_at
    # every framework got the same canonical weights and inputs, at the check batch size
    assert [c["runner"] for c in probe.calls] == ["a", "a", "b"]  # the reference again on one thread
    expected_w = random_weights(bn_net.resolved, 0)
    expected_x = make_inputs(bn_net, check_batch_size(bn_net), 0)
    for call in probe.calls:
        assert call["batch"] == 4 and call["device"] == "cpu" and call["timeout_s"] == 33
        assert call["weights"].keys() == expected_w.keys()
        for k, v in expected_w.items():
            np.testing.assert_array_equal(call["weights"][k], v)
        for k, v in expected_x.items():
            np.testing.assert_array_equal(call["inputs"][k], v)


def test_seed_changes_the_weights_given_to_frameworks(monkeypatch, fake, bn_net):
    _, probe = run_check(monkeypatch, fake, bn_net, {"a": outputs(bn_net, seed=5)}, seed=5)
    np.testing.assert_array_equal(probe.calls[0]["weights"]["000.weight"], random_weights(bn_net.resolved, 5)["000.weight"])
    assert not np.array_equal(probe.calls[0]["weights"]["000.weight"], random_weights(bn_net.resolved, 0)["000.weight"])


@pytest.mark.parametrize("which", ["bn_net", "plain_net"])
@pytest.mark.parametrize("factor,status", [(10.0, "mismatch"), (0.1, "equivalent")])
def test_logits_perturbation_against_tolerance(monkeypatch, fake, request, which, factor, status):
    net = request.getfixturevalue(which)
    tol = tolerance_for(net)
    ref = outputs(net)
    other = outputs(net)
    other["logits"] = other["logits"].copy()
    other["logits"][1, 2] += np.float32(factor * tol * float(np.abs(ref["logits"]).max()))
    _, b = run_check(monkeypatch, fake, net, {"ref": ref, "other": other})[0]
    assert b.status == status
    assert b.errors["logits"] == pytest.approx(factor * tol, rel=1e-3)
    assert b.errors["loss"] == 0.0 and b.errors["update"] == 0.0
    if status == "mismatch":
        assert not b.ok
        assert "logits" in b.reason and "ref" in b.reason and "loss" not in b.reason and "update" not in b.reason
    else:
        assert b.reason is None


def test_loss_perturbation_is_a_mismatch(monkeypatch, fake, plain_net):
    other = outputs(plain_net)
    other["loss"] = np.array(2.3 * (1 + 10 * 1e-4), dtype=np.float32)
    _, b = run_check(monkeypatch, fake, plain_net, {"ref": outputs(plain_net), "other": other})[0]
    assert b.status == "mismatch" and "loss" in b.reason and "logits" not in b.reason
    assert b.errors["loss"] == pytest.approx(1e-3, rel=1e-3)


def test_nan_logits_are_a_mismatch(monkeypatch, fake, plain_net):
    other = outputs(plain_net)
    other["logits"] = other["logits"].copy()
    other["logits"][0, 0] = np.nan
    _, b = run_check(monkeypatch, fake, plain_net, {"ref": outputs(plain_net), "other": other})[0]
    assert b.status == "mismatch" and "logits" in b.reason


def _bump(out: dict, tensor: str, fraction_of_update: float, index: int = 0) -> dict:
    update = out[f"after/{tensor}"].astype(np.float64) - out[f"loaded/{tensor}"]
    bumped = out[f"after/{tensor}"].copy()
    bumped.flat[index] += np.float32(fraction_of_update * np.abs(update).max())
    out[f"after/{tensor}"] = bumped
    return out


@pytest.mark.parametrize("tensor", ["000.weight", "001.gamma", "001.beta", "004.bias"])
def test_one_tensor_update_perturbed_is_named_as_worst(monkeypatch, fake, bn_net, tensor):
    # every element of one tensor's update 1% off: normwise well beyond 1e-3
    other = outputs(bn_net, lr=1e-3)
    loaded, after = other[f"loaded/{tensor}"], other[f"after/{tensor}"]
    other[f"after/{tensor}"] = (loaded + (after.astype(np.float64) - loaded) * 1.05).astype(np.float32)
    _, b = run_check(monkeypatch, fake, bn_net, {"ref": outputs(bn_net, lr=1e-3), "other": other})[0]
    # on a batch-norm network the update is reported, not gated; the weights decide
    assert b.status == "equivalent"
    assert b.worst_tensor == tensor
    assert b.errors["worst_tensor_update"] == pytest.approx(5e-2, rel=5e-2)
    assert b.errors["update"] > 1e-3 and b.errors["weights"] < 1e-3
    assert b.errors["logits"] == 0.0 and b.errors["loss"] == 0.0


@pytest.mark.parametrize("tensor", ["000.weight", "000.bias", "002.weight", "002.bias"])
def test_update_difference_shows_even_when_the_weights_hide_it(monkeypatch, fake, plain_net, tensor):
    # the update of one tensor 10% off, with a step small enough that the weights barely move
    other = outputs(plain_net, lr=1e-5)
    loaded, after = other[f"loaded/{tensor}"], other[f"after/{tensor}"]
    other[f"after/{tensor}"] = (loaded + (after.astype(np.float64) - loaded) * 1.1).astype(np.float32)
    _, b = run_check(monkeypatch, fake, plain_net, {"ref": outputs(plain_net, lr=1e-5), "other": other})[0]
    assert b.errors["weights"] < 1e-4 < b.errors["update"]
    assert b.status == "mismatch" and b.worst_tensor == tensor and "update" in b.reason


def test_one_flipped_element_counts_by_its_share_of_the_whole_update(monkeypatch, fake, tmp_path):
    # one element 50% off (a ReLU flipped by rounding): large element-wise, its share normwise
    net = tiny(tmp_path, {"kind": "tensor", "shape": [256], "classes": 5},
               [{"type": "dense", "units": 256}, {"type": "relu"}, {"type": "dense", "units": 5}], "wide")
    ref, other = outputs(net, lr=1e-3), outputs(net, lr=1e-3)
    after = other["after/000.weight"].copy()
    update = after.astype(np.float64) - other["loaded/000.weight"]
    after.flat[7] = np.float32(other["loaded/000.weight"].flat[7] + 1.5 * update.flat[7])
    other["after/000.weight"] = after
    _, b = run_check(monkeypatch, fake, net, {"ref": ref, "other": other})[0]
    all_updates = np.concatenate([(ref[f"after/{n}"].astype(np.float64) - ref[f"loaded/{n}"]).ravel()
                                  for n in ("000.weight", "000.bias", "002.weight", "002.bias")])
    expected = 0.5 * abs(update.flat[7]) / np.linalg.norm(all_updates)
    assert b.errors["update"] == pytest.approx(expected, rel=1e-3)
    assert b.errors["worst_tensor_update"] > 50 * b.errors["update"]
    assert b.worst_tensor == "000.weight"


def test_one_ulp_of_the_updated_weight_is_not_a_difference(monkeypatch, fake, plain_net):
    other = outputs(plain_net)
    after = other["after/002.weight"].copy()
    after.flat[:] = np.nextafter(after.ravel(), np.float32(np.inf))  # every element one ulp up
    other["after/002.weight"] = after
    _, b = run_check(monkeypatch, fake, plain_net, {"ref": outputs(plain_net), "other": other})[0]
    assert b.status == "equivalent" and b.errors["update"] == 0.0


def test_small_update_difference_is_equivalent_and_still_reports_the_worst(monkeypatch, fake, bn_net):
    ref = outputs(bn_net)
    other = outputs(bn_net)
    update = ref["after/004.weight"].astype(np.float64) - ref["loaded/004.weight"]
    bumped = other["after/004.weight"].copy()
    bumped.flat[3] += np.float32(0.1 * 1e-3 * np.abs(update).max())
    other["after/004.weight"] = bumped
    _, b = run_check(monkeypatch, fake, bn_net, {"ref": ref, "other": other})[0]
    assert b.status == "equivalent" and b.worst_tensor == "004.weight"
    assert 0 < b.errors["update"] < 1e-3


def test_running_statistics_differences_are_ignored(monkeypatch, fake, bn_net):
    other = outputs(bn_net)
    other["after/001.running_mean"] = other["after/001.running_mean"] + np.float32(5.0)
    other["after/001.running_var"] = other["after/001.running_var"] * np.float32(3.0)
    _, b = run_check(monkeypatch, fake, bn_net, {"ref": outputs(bn_net), "other": other})[0]
    assert b.status == "equivalent"
    assert b.errors["update"] == 0.0 and b.worst_tensor is None


def test_missing_update_of_a_trained_tensor_is_a_mismatch(monkeypatch, fake, bn_net):
    other = outputs(bn_net)
    del other["after/001.gamma"]
    _, b = run_check(monkeypatch, fake, bn_net, {"ref": outputs(bn_net), "other": other})[0]
    assert b.status == "mismatch" and b.worst_tensor == "001.gamma" and b.errors["update"] == float("inf")


def test_wrong_parameter_count_is_a_mismatch(monkeypatch, fake, bn_net):
    other = outputs(bn_net)
    other["__params__"] = bn_net.params + 3
    _, b = run_check(monkeypatch, fake, bn_net, {"ref": outputs(bn_net), "other": other})[0]
    assert b.status == "mismatch" and b.params == bn_net.params + 3
    assert f"built {bn_net.params + 3} parameters" in b.reason and str(bn_net.params) in b.reason


def test_roundtrip_error_is_a_mismatch(monkeypatch, fake, bn_net):
    other = outputs(bn_net)
    # the framework loads the weights slightly wrong; its update is still right (after moves with loaded)
    delta = np.float32(1e-3) * other["loaded/004.weight"]
    other["loaded/004.weight"] = other["loaded/004.weight"] + delta
    other["after/004.weight"] = other["after/004.weight"] + delta
    _, b = run_check(monkeypatch, fake, bn_net, {"ref": outputs(bn_net), "other": other})[0]
    assert b.status == "mismatch"
    assert "load then export changes the weights" in b.reason
    assert b.errors["roundtrip"] == pytest.approx(1e-3, rel=1e-2)
    assert b.errors["update"] < 1e-3  # the roundtrip alone is the problem


def test_roundtrip_missing_tensor_is_a_mismatch(monkeypatch, fake, bn_net):
    other = outputs(bn_net)
    del other["loaded/001.beta"]
    _, b = run_check(monkeypatch, fake, bn_net, {"ref": outputs(bn_net), "other": other})[0]
    assert b.status == "mismatch" and b.errors["roundtrip"] == float("inf")


def test_tiny_roundtrip_difference_is_allowed(monkeypatch, fake, bn_net):
    other = outputs(bn_net)
    other["loaded/004.weight"] = other["loaded/004.weight"] * np.float32(1 + 1e-7)
    _, b = run_check(monkeypatch, fake, bn_net, {"ref": outputs(bn_net), "other": other})[0]
    assert 0 < b.errors["roundtrip"] <= 1e-6
    assert "load then export" not in (b.reason or "")


def test_wrong_export_shape_is_a_mismatch(monkeypatch, fake, bn_net):
    other = outputs(bn_net)
    other["init/000.weight"] = other["init/000.weight"].transpose(2, 3, 1, 0)  # HWIO instead of OIHW
    _, b = run_check(monkeypatch, fake, bn_net, {"ref": outputs(bn_net), "other": other})[0]
    assert b.status == "mismatch"
    assert "canonical format" in b.reason and "000.weight" in b.reason


@pytest.mark.parametrize("change", ["missing", "extra"])
def test_missing_or_extra_exported_tensor_is_a_mismatch(monkeypatch, fake, bn_net, change):
    other = outputs(bn_net)
    if change == "missing":
        del other["init/001.running_var"]
        name = "001.running_var"
    else:
        other["init/001.bias"] = np.zeros(3, np.float32)
        name = "001.bias"
    _, b = run_check(monkeypatch, fake, bn_net, {"ref": outputs(bn_net), "other": other})[0]
    assert b.status == "mismatch" and "canonical format" in b.reason and name in b.reason


def test_probe_failure_and_skip(monkeypatch, fake, bn_net):
    results, _ = run_check(monkeypatch, fake, bn_net, {
        "ref": outputs(bn_net),
        "crash": (None, "the worker exited with status 3", "failed"),
        "hang": (None, "killed after the timeout of 9 s", "timeout"),
        "nogpu": (None, "no GPU here", "skipped"),
    })
    r = by_name(results)
    assert r["ref"].status == "reference"
    assert (r["crash"].status, r["crash"].reason) == ("failed", "the worker exited with status 3")
    assert (r["hang"].status, r["hang"].reason) == ("failed", "killed after the timeout of 9 s")
    assert (r["nogpu"].status, r["nogpu"].reason) == ("skipped", "no GPU here")
    assert r["nogpu"].ok and not r["crash"].ok and not r["hang"].ok
    assert r["crash"].framework_version is None and r["crash"].params is None and r["crash"].errors == {}


def test_environment_build_error_is_failed_without_probing(monkeypatch, fake, bn_net):
    error = EnvironmentBuildError("pip install failed: no matching distribution")
    results, probe = run_check(monkeypatch, fake, bn_net, {"ref": outputs(bn_net), "broken": outputs(bn_net)},
                               envs={"broken": error})
    r = by_name(results)
    assert r["ref"].status == "reference"
    assert r["broken"].status == "failed" and r["broken"].reason == str(error) and not r["broken"].ok
    assert [c["runner"] for c in probe.calls] == ["ref", "ref"]  # the reference twice: its own spread


def test_broken_reference_hands_over_to_the_next_framework(monkeypatch, fake, bn_net):
    first = outputs(bn_net)
    first["__params__"] = bn_net.params - 1
    first["logits"] = first["logits"] * np.float32(7.0)  # would make everyone else a mismatch if it judged
    third = outputs(bn_net)
    fourth = outputs(bn_net)
    fourth["logits"] = fourth["logits"] + np.float32(1.0)
    results, _ = run_check(monkeypatch, fake, bn_net,
                           {"first": first, "second": outputs(bn_net), "third": third, "fourth": fourth})
    r = by_name(results)
    assert r["first"].status == "failed" and "parameters" in r["first"].reason
    assert r["second"].status == "reference"
    assert r["third"].status == "equivalent"
    assert r["fourth"].status == "mismatch" and "second" in r["fourth"].reason and "first" not in r["fourth"].reason


@pytest.mark.parametrize("where", ["logits", "loss", "update"])
def test_non_finite_reference_is_not_trusted(monkeypatch, fake, plain_net, where):
    first = outputs(plain_net)
    if where == "logits":
        first["logits"] = first["logits"].copy()
        first["logits"][0, 0] = np.nan
    elif where == "loss":
        first["loss"] = np.asarray(np.inf)
    else:
        name = next(k for k in first if k.startswith("after/"))
        first[name] = first[name].copy()
        first[name].flat[0] = np.nan
    results, _ = run_check(monkeypatch, fake, plain_net, {"first": first, "second": outputs(plain_net)})
    r = by_name(results)
    assert r["first"].status == "failed" and "non-finite" in r["first"].reason
    assert r["second"].status == "reference"


@pytest.mark.parametrize("first", ["build_error", "probe_failure", "skipped"])
def test_reference_is_the_first_framework_that_works(monkeypatch, fake, bn_net, first):
    envs = {}
    answers = {"first": outputs(bn_net), "second": outputs(bn_net), "third": outputs(bn_net)}
    if first == "build_error":
        envs["first"] = EnvironmentBuildError("no wheel")
    elif first == "probe_failure":
        answers["first"] = (None, "segfault", "failed")
    else:
        answers["first"] = (None, "no GPU", "skipped")
    results, _ = run_check(monkeypatch, fake, bn_net, answers, envs=envs)
    assert [r.status for r in results][1:] == ["reference", "equivalent"]
    assert results[0].status in ("failed", "skipped")


def test_description_and_format_must_agree(monkeypatch, fake, bn_net):
    wrong = replace(bn_net, params=bn_net.params + 1)
    with pytest.raises(AssertionError, match="canonical format counts"):
        run_check(monkeypatch, fake, wrong, {"a": outputs(bn_net)})


def test_framework_check_ok():
    def fc(status):
        return FrameworkCheck("n", "f", "1", status)

    assert [fc(s).ok for s in ("reference", "equivalent", "skipped", "mismatch", "failed")] == \
        [True, True, True, False, False]


# --------------------------------------------------------------------------- CheckStore


def saved(status="equivalent", **kw) -> FrameworkCheck:
    base = dict(network="fcn5", framework="torch", framework_version="2.1.0+cpu", status=status,
                reason=None if status == "equivalent" else "logits differ", params=10, params_described=10,
                tolerance=1e-4, errors={"logits": 2e-6, "loss": 1e-7, "update": 3e-5, "roundtrip": 0.0},
                worst_tensor="000.weight", network_hash="h1", checked_at="2026-11-29T10:00:00+00:00")
    base.update(kw)
    return FrameworkCheck(**base)


@pytest.mark.parametrize("status", ["equivalent", "mismatch", "reference", "failed"])
def test_check_store_save_then_status(tmp_path, status):
    store = CheckStore(tmp_path)
    check = saved(status)
    store.save(check)
    got = store.status("fcn5", "h1", "torch", "2.1.0+cpu")
    assert got == {"status": status, "checked_at": "2026-11-29T10:00:00+00:00", "reason": check.reason,
                   "errors": {"logits": 2e-6, "loss": 1e-7, "update": 3e-5, "roundtrip": 0.0},
                   "precision": "float64", "reference": None, "worst": {"quantity": "update", "error": 3e-5},
                   "check_s": None, "checked_by": "dlbench check"}
    assert [p.name for p in (tmp_path / "checks").iterdir()] == ["fcn5--torch--2.1.0+cpu.json"]


def test_check_store_keeps_the_latest(tmp_path):
    store = CheckStore(tmp_path)
    store.save(saved("mismatch"))
    store.save(saved("equivalent", checked_at="2026-11-30T00:00:00+00:00"))
    got = store.status("fcn5", "h1", "torch", "2.1.0+cpu")
    assert got["status"] == "equivalent" and got["checked_at"] == "2026-11-30T00:00:00+00:00"
    assert not [p for p in (tmp_path / "checks").iterdir() if p.suffix != ".json"]  # no temporary left


def test_check_store_distinguishes_network_framework_and_version(tmp_path):
    store = CheckStore(tmp_path)
    store.save(saved())
    store.save(saved("mismatch", framework="jax", framework_version=None))
    assert store.status("fcn5", "h1", "torch", "2.1.0+cpu")["status"] == "equivalent"
    assert store.status("fcn5", "h1", "torch", "2.2.0+cpu") == {"status": "unchecked"}
    assert store.status("fcn8", "h1", "torch", "2.1.0+cpu") == {"status": "unchecked"}
    assert store.status("fcn5", "h1", "tensorflow", "2.1.0+cpu") == {"status": "unchecked"}
    assert store.status("fcn5", "h1", "jax", None)["status"] == "mismatch"


def test_check_store_missing_file_is_unchecked(tmp_path):
    assert CheckStore(tmp_path).status("fcn5", "h1", "torch", "2.1.0+cpu") == {"status": "unchecked"}
    assert not (tmp_path / "checks").exists()  # asking creates nothing


def test_check_store_other_network_hash_is_unchecked(tmp_path):
    store = CheckStore(tmp_path)
    store.save(saved(network_hash="old"))
    got = store.status("fcn5", "new", "torch", "2.1.0+cpu")
    assert got["status"] == "unchecked" and "another version of the network" in got["reason"]


@pytest.mark.parametrize("content", [b"{not json", b"", b"\xff\xfe\x00\x81 binary", b"[1, 2]", b'"equivalent"',
                                     b'{"network_hash": "h1"}'])
def test_check_store_unreadable_file_is_unchecked(tmp_path, content):
    store = CheckStore(tmp_path)
    store.save(saved())
    path = tmp_path / "checks" / "fcn5--torch--2.1.0+cpu.json"
    assert path.is_file()
    path.write_bytes(content)
    got = store.status("fcn5", "h1", "torch", "2.1.0+cpu")
    assert got["status"] == "unchecked" and path.name in got["reason"]


def test_check_store_file_is_plain_json(tmp_path):
    CheckStore(tmp_path).save(saved())
    data = json.loads((tmp_path / "checks" / "fcn5--torch--2.1.0+cpu.json").read_text())
    assert data["status"] == "equivalent" and data["network_hash"] == "h1" and data["worst_tensor"] == "000.weight"


# --- float64, the check's default precision ---------------------------------------------------

def outputs64(net: NetworkSummary, lr: float = 0.1) -> dict:
    """What a correct framework reports in float64: the float32 canonical weights as loaded (exact
    in float64), one SGD step of a fixed fake gradient computed in float64."""
    out = outputs(net, lr=lr)
    w = random_weights(net.resolved, 0)
    rng = np.random.default_rng(99)
    for name, a in w.items():
        loaded = a.astype(np.float64)
        out[f"init/{name}"] = out[f"loaded/{name}"] = loaded
        out[f"after/{name}"] = loaded - lr * rng.standard_normal(a.shape)
    out["logits"] = out["logits"].astype(np.float64)
    return out


def test_float64_is_the_default_and_every_probe_asks_for_it(monkeypatch, fake, bn_net):
    results, probe = run_check(monkeypatch, fake, bn_net, {"a": outputs64(bn_net), "b": outputs64(bn_net)},
                               precision="float64")
    a, b = results
    assert (a.status, b.status) == ("reference", "equivalent")
    assert [c["precision"] for c in probe.calls] == ["float64", "float64"]  # no second reference run
    assert a.precision == b.precision == "float64" and a.tolerance == b.tolerance == 1e-9
    assert "self_spread_weights" not in a.errors
    assert inspect.signature(check_network).parameters["precision"].default == "float64"


def test_float64_gates_the_update_on_batch_norm_networks(monkeypatch, fake, bn_net):
    # a 1e-6 error in one tensor's update: rounding in float32 (reported, not gated, with batch
    # norm), a difference of definition in float64
    def bumped(o):
        loaded = o["loaded/000.weight"]
        o["after/000.weight"] = loaded + (o["after/000.weight"] - loaded) * (1 + 1e-6)
        return o

    _, b32 = run_check(monkeypatch, fake, bn_net, {"ref": outputs(bn_net), "other": bumped(outputs(bn_net))})[0]
    assert b32.status == "equivalent" and b32.precision == "fp32"
    _, b64 = run_check(monkeypatch, fake, bn_net, {"ref": outputs64(bn_net), "other": bumped(outputs64(bn_net))},
                       precision="float64")[0]
    assert b64.status == "mismatch" and "update" in b64.reason and b64.worst_tensor == "000.weight"
    assert 1e-9 < b64.errors["update"] < 1e-6


def test_float64_one_ulp_is_allowed_and_float32_rounding_is_not(monkeypatch, fake, plain_net):
    ulp, rounded = outputs64(plain_net), outputs64(plain_net)
    ulp["after/002.weight"] = np.nextafter(ulp["after/002.weight"], np.inf)
    _, b = run_check(monkeypatch, fake, plain_net, {"ref": outputs64(plain_net), "other": ulp}, precision="float64")[0]
    assert b.status == "equivalent" and b.errors["update"] == 0.0
    # a framework that computed in float32 and reported float64 arrays: caught
    rounded.update({k: v.astype(np.float32).astype(np.float64) for k, v in rounded.items() if k.startswith("after/")})
    _, b = run_check(monkeypatch, fake, plain_net, {"ref": outputs64(plain_net), "other": rounded},
                     precision="float64")[0]
    assert b.status == "mismatch" and b.errors["weights"] > 1e-9


def test_unknown_check_precision_is_refused(monkeypatch, fake, plain_net):
    with pytest.raises(ValueError, match="bfloat16"):
        run_check(monkeypatch, fake, plain_net, {"a": outputs(plain_net)}, precision="bfloat16")


def test_check_store_reports_the_precision_and_old_files_are_fp32(tmp_path):
    store = CheckStore(tmp_path)
    store.save(replace(saved(), precision="float64"))
    assert store.status("fcn5", "h1", "torch", "2.1.0+cpu")["precision"] == "float64"
    path = tmp_path / "checks" / "fcn5--torch--2.1.0+cpu.json"
    data = json.loads(path.read_text())
    del data["precision"]
    path.write_text(json.dumps(data))
    assert store.status("fcn5", "h1", "torch", "2.1.0+cpu")["precision"] == "fp32"


# --- mixed precision against the float64 step ------------------------------------------------

def test_mixed_precision_is_judged_against_the_first_frameworks_float64_step(monkeypatch, fake, plain_net):
    truth = outputs64(plain_net, lr=1e-2)
    u = 2.0 ** -8

    def amp(scale):  # a framework's bfloat16 step: every output off by `scale` units of bfloat16 roundoff
        out = dict(truth)
        rng = np.random.default_rng(7)
        out["logits"] = truth["logits"] * (1 + scale * u)
        out["loss"] = truth["loss"] * (1 + scale * u)
        for k in truth:
            if k.startswith("after/"):
                name = k[len("after/"):]
                loaded = truth[f"loaded/{name}"]
                noise = rng.choice([-1.0, 1.0], size=loaded.shape)
                out[k] = loaded + (truth[k] - loaded) * (1 + scale * u * noise)
        return out

    class ByPrecision(FakeProbe):
        def __call__(self, runner, env, *a, precision="float64", **kw):
            self.answers = {"a": truth if precision == "float64" else amp(2), "b": amp(30)}
            return super().__call__(runner, env, *a, precision=precision, **kw)

    probe = ByPrecision({})
    monkeypatch.setattr(equivalence, "_probe", probe)
    runners = [(replace(fake, name=n), env_for(n)) for n in ("a", "b")]
    a, b = check_network(plain_net, runners, precision="amp_bf16")
    assert [(c["runner"], c["precision"]) for c in probe.calls] == [("a", "float64"), ("a", "amp_bf16"),
                                                                   ("b", "amp_bf16")]
    assert (a.framework, a.status, a.precision) == ("a", "equivalent", "amp_bf16")
    # two products in sequence, no ReLU: logits to 8 sqrt(2) u = 11.3u, the update to 8 sqrt(6) u = 19.6u
    assert a.tolerance == pytest.approx(8 * np.sqrt(2) * u) and a.errors["logits"] == pytest.approx(2 * u, rel=1e-6)
    assert 1.5 * u < a.errors["update"] < 2.5 * u
    assert a.errors["allowed_update"] == pytest.approx(8 * np.sqrt(6) * u)
    assert b.status == "mismatch" and "a float64" in b.reason and "logits" in b.reason and "update" in b.reason


@pytest.mark.parametrize("name,products,decisions", [
    ("fcn5", 4, 0), ("fcn8", 7, 0), ("alexnet_r", 4, 5), ("alexnet", 8, 10),
    ("resnet56", 56, 55), ("resnet50", 50, 50), ("lstm32", 34, 0), ("lstm64", 66, 0),
    ("gpt2_small", 12 * 6 + 1, 0), ("vit_b16", 1 + 12 * 6 + 1, 0), ("transformer_tiny", 2 * 6 + 1, 0)])
def test_rounding_and_decision_depth_of_shipped_networks(name, products, decisions):
    """ResNet-56 is its name: 1 + 27 blocks x 2 + 1; an LSTM of T steps over 2 layers is T + 1, plus its dense.
    A transformer block is 6 products in sequence (q, the scores, the weighted sum, out, fc1, fc2), the
    head (or patch embedding) one more; GELU, softmax and layer norm decide nothing."""
    net = load_network(NETWORKS / f"{name}.yaml")
    assert (equivalence.rounding_depth(net), equivalence.decision_depth(net)) == (products, decisions)


def test_rounding_depth_of_a_bare_attention_layer(tmp_path):
    """q (or k, v), the scores, the weighted sum and out: 4 products; the head one more."""
    path = tmp_path / "attn.yaml"
    path.write_text(yaml.safe_dump({"name": "attn", "input": {"kind": "tokens", "vocabulary": 5, "sequence_length": 3},
                                    "layers": [{"type": "embedding", "vocabulary": 5, "dim": 4},
                                               {"type": "attention", "heads": 2},
                                               {"type": "layer_norm"}, {"type": "gelu", "form": "erf"},
                                               {"type": "lm_head", "tied": True}]}))
    net = load_network(path)
    assert (equivalence.rounding_depth(net), equivalence.decision_depth(net)) == (5, 0)


def test_mixed_tolerances_grow_with_depth_and_the_update_with_the_square_root_of_u():
    alexnet = load_network(NETWORKS / "alexnet.yaml")
    bf16, fp16 = (equivalence.mixed_tolerances(alexnet, p) for p in ("amp_bf16", "amp_fp16"))
    assert bf16["logits"] == pytest.approx(8 * np.sqrt(8) * 2.0 ** -8) and bf16["loss"] == bf16["weights"] == bf16["logits"]
    assert bf16["logits"] / fp16["logits"] == pytest.approx(8)  # linear in u
    # the ReLU and max-pool decisions: sqrt(2 u R), so the update does not shrink 8-fold from bf16 to fp16
    assert bf16["update"] == pytest.approx(8 * np.sqrt(24) * 2.0 ** -8 + np.sqrt(2 * 2.0 ** -8 * 10))
    assert 2 < bf16["update"] / fp16["update"] < 4
    deeper = load_network(NETWORKS / "resnet50.yaml")
    assert equivalence.mixed_tolerances(deeper, "amp_bf16")["logits"] > bf16["logits"]


def test_mixed_precision_update_is_reported_not_gated_with_batch_norm(monkeypatch, fake, bn_net):
    truth = outputs64(bn_net, lr=1e-4)  # a small step: the weights barely move, the update says it all
    off = dict(truth)
    for k in truth:
        if k.startswith("after/"):
            loaded = truth["loaded/" + k[len("after/"):]]
            off[k] = loaded + (truth[k] - loaded) * 1.3  # 30% off: batch norm in bfloat16 does this
    calls = []

    def probe(runner, env, *args, precision="float64", **kw):
        calls.append(precision)
        return (dict(truth) if precision == "float64" else dict(off)), None, "ok"

    monkeypatch.setattr(equivalence, "_probe", probe)
    (a,) = check_network(bn_net, [(replace(fake, name="a"), env_for("a"))], precision="amp_fp16")
    assert calls == ["float64", "amp_fp16"] and a.tolerance == pytest.approx(8 * np.sqrt(2) * 2.0 ** -11)
    assert "allowed_update" not in a.errors
    assert a.errors["update"] > 0.2 and a.errors["weights"] < a.tolerance
    assert a.status == "equivalent" and a.reason is None


def test_mixed_precision_without_a_float64_reference_fails_every_framework_saying_why(monkeypatch, fake, plain_net):
    def probe(runner, env, *args, precision="float64", **kw):
        if precision == "float64":
            return None, "RuntimeError: no float64 here", "failed"
        return outputs64(plain_net), None, "ok"

    monkeypatch.setattr(equivalence, "_probe", probe)
    results = check_network(plain_net, [(replace(fake, name=n), env_for(n)) for n in ("a", "b")], precision="amp_bf16")
    assert [r.status for r in results] == ["failed", "failed"]
    assert all("no float64 reference step from a" in r.reason and "no float64 here" in r.reason for r in results)


def test_check_files_of_other_precisions_sit_beside_the_float64_one(tmp_path):
    store = CheckStore(tmp_path)
    store.save(saved())
    store.save(replace(saved("mismatch"), precision="amp_bf16"))
    assert sorted(p.name for p in (tmp_path / "checks").iterdir()) == [
        "fcn5--torch--2.1.0+cpu--amp_bf16.json", "fcn5--torch--2.1.0+cpu.json"]
    assert store.status("fcn5", "h1", "torch", "2.1.0+cpu")["status"] == "equivalent"  # what records carry
    assert store.status("fcn5", "h1", "torch", "2.1.0+cpu", "amp_bf16")["status"] == "mismatch"
