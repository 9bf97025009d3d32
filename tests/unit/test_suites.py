"""Suites and profiles: catalog, benchmark resolution per profile and device, user suite files, errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from dlbench.definitions.catalog import SuiteCatalog
from dlbench.definitions.loader import DefinitionError
from dlbench.definitions.suite import PROFILES

REPO = Path(__file__).resolve().parents[2]
SUITES = REPO / "suites"

# The shipped suites as the seed suite defines them: network -> batch sizes per profile.
EXPECTED = {
    "fcn": {
        "learning_rate": 0.05,
        "networks": {
            "fcn5": {"smoke": [16], "cpu": [64], "cuda": [1024, 4096], "paper": [342, 512, 1024, 2048, 4096]},
            "fcn8": {"smoke": [16], "cpu": [64], "cuda": [1024, 4096], "paper": [342, 512, 1024, 2048, 4096]},
        },
    },
    "cnn": {
        "learning_rate": 0.01,
        "networks": {
            "alexnet_r": {"smoke": [8], "cpu": [64], "cuda": [1024], "paper": [86, 128, 256, 512, 1024, 2048]},
            "resnet56": {"smoke": [4], "cpu": [32], "cuda": [128], "paper": [16, 32, 64, 128]},
            "alexnet": {"smoke": [2], "cpu": [16], "cuda": [128], "paper": [16, 32, 64, 128]},
            "resnet50": {"smoke": [2], "cpu": [8], "cuda": [64], "paper": [8, 16, 32, 64]},
        },
    },
    "rnn": {
        "learning_rate": 0.1,
        "networks": {
            "lstm32": {"smoke": [4], "cpu": [32], "cuda": [128, 1024], "paper": [128, 256, 512, 1024]},
            "lstm64": {"smoke": [4], "cpu": [32], "cuda": [128, 1024], "paper": [128, 256, 512, 1024]},
        },
    },
}


@pytest.fixture
def catalog() -> SuiteCatalog:
    return SuiteCatalog(SUITES)


TINY_NETWORK = {
    "name": "tiny",
    "input": {"kind": "tensor", "shape": [4], "classes": 2},
    "layers": [{"type": "dense", "units": 2}],
}


def write_yaml(path: Path, doc) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def entry(network: str, **extra) -> dict:
    return {"network": network, "batch_sizes": {"smoke": [2], "default": [4], "paper": [8]}, **extra}


def suite_doc(*entries: dict, **extra) -> dict:
    return {"name": "mine", "benchmarks": list(entries), **extra}


# --------------------------------------------------------------------------- catalog

def test_catalog_lists_suites_and_networks(catalog):
    # the seed suite's, and whatever suites and networks are added beside them (docs/extending.md)
    names = catalog.suite_names()
    assert {"cnn", "fcn", "rnn"} <= set(names) and names == sorted(names)
    assert not {"profiles", "distributed", "comm", "kernels"} & set(names)  # not single-process suites
    assert {"alexnet", "alexnet_r", "fcn5", "fcn8", "lstm32", "lstm64", "resnet50", "resnet56"} <= set(
        catalog.network_names())
    assert catalog.network_names() == sorted(p.stem for p in (SUITES / "networks").glob("*.yaml"))


def test_catalog_from_relative_root(monkeypatch, catalog):
    monkeypatch.chdir(REPO)
    assert SuiteCatalog(Path("suites")).suite_names() == catalog.suite_names()
    assert {"cnn", "fcn", "rnn"} <= set(catalog.suite_names())


def test_suite_path_by_name_or_file(catalog, tmp_path):
    assert catalog.suite_path("fcn") == SUITES / "fcn.yaml"
    assert catalog.suite_path("profiles") is None  # profiles.yaml is not a suite
    assert catalog.suite_path("nonexistent") is None
    user = write_yaml(tmp_path / "mine.yaml", suite_doc(entry("fcn5")))
    assert catalog.suite_path(str(user)) == user
    assert catalog.suite_path(str(tmp_path / "absent.yaml")) is None
    not_yaml = tmp_path / "mine.txt"
    not_yaml.write_text("name: x\n")
    assert catalog.suite_path(str(not_yaml)) is None


# --------------------------------------------------------------------------- shipped suites

@pytest.mark.parametrize("suite_name", ["fcn", "cnn", "rnn"])
@pytest.mark.parametrize("profile", ["smoke", "default", "paper"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_shipped_suite_resolves(catalog, suite_name, profile, device):
    suite = catalog.load_suite(catalog.suite_path(suite_name), profile, device)
    expected = EXPECTED[suite_name]
    assert suite.name == suite_name
    names = [b.name for b in suite.benchmarks]
    modes = ("train",) if profile == "smoke" else ("train", "infer")  # smoke: one run per network
    assert names == [f"{n}-{mode}" for n in expected["networks"] for mode in modes]
    policy = getattr(catalog.profiles(), profile)
    for b in suite.benchmarks:
        network, mode = b.name.rsplit("-", 1)
        assert b.network.name == network and b.mode == mode
        assert Path(b.network_file) == SUITES / "networks" / f"{network}.yaml"
        key = device if profile == "default" else profile
        assert b.batch_sizes == tuple(expected["networks"][network][key])
        assert b.learning_rate == pytest.approx(expected["learning_rate"])
        assert b.momentum == pytest.approx(0.9)
        assert b.precision == "fp32"
        assert b.profile == profile
        assert b.policy == policy
        assert b.suite == suite_name


def test_default_profile_differs_between_devices(catalog):
    cpu = catalog.load_suite(catalog.suite_path("fcn"), "default", "cpu")
    cuda = catalog.load_suite(catalog.suite_path("fcn"), "default", "cuda")
    assert cpu.benchmarks[0].batch_sizes == (64,)
    assert cuda.benchmarks[0].batch_sizes == (1024, 4096)


def test_profiles_validate_and_are_sane(catalog):
    profiles = catalog.profiles()
    assert PROFILES == ("smoke", "default", "paper")
    for name in PROFILES:
        p = getattr(profiles, name)
        assert p.repeats >= 1
        assert p.measure.min_iters >= 5
        assert p.measure.max_iters >= p.measure.min_iters
        assert p.warmup.max_iters >= p.warmup.min_iters
        assert p.warmup.window >= 1
    assert profiles.smoke.repeats >= 1
    assert profiles.paper.measure.min_iters >= profiles.smoke.measure.min_iters


# --------------------------------------------------------------------------- user suites

def test_user_suite_with_relative_network_path(catalog, tmp_path):
    write_yaml(tmp_path / "nets" / "tiny.yaml", TINY_NETWORK)
    path = write_yaml(tmp_path / "mine.yaml", suite_doc(entry("nets/tiny.yaml", modes=["infer"]), entry("fcn5")))
    suite = catalog.load_suite(path, "default", "cpu")
    assert [b.name for b in suite.benchmarks] == ["tiny-infer", "fcn5-train", "fcn5-infer"]
    tiny = suite.benchmarks[0]
    assert Path(tiny.network_file) == tmp_path / "nets" / "tiny.yaml"
    assert tiny.network.params == 4 * 2 + 2
    assert tiny.batch_sizes == (4,)
    assert suite.path == path


def test_user_suite_relative_to_suite_file_not_cwd(catalog, tmp_path, monkeypatch):
    write_yaml(tmp_path / "a" / "tiny.yaml", TINY_NETWORK)
    path = write_yaml(tmp_path / "a" / "mine.yaml", suite_doc(entry("tiny.yaml")))
    monkeypatch.chdir(tmp_path)
    suite = catalog.load_suite(path, "paper", "cuda")
    assert [b.batch_sizes for b in suite.benchmarks] == [(8,), (8,)]


def test_defaults_applied_and_overrides_win(catalog, tmp_path):
    path = write_yaml(tmp_path / "mine.yaml", suite_doc(
        entry("fcn5"),
        entry("fcn8", learning_rate=0.5, momentum=0.0, precision="amp_bf16"),
        defaults={"learning_rate": 0.2, "momentum": 0.8},
    ))
    suite = catalog.load_suite(path, "default", "cpu")
    by_name = {b.name: b for b in suite.benchmarks}
    assert by_name["fcn5-train"].learning_rate == pytest.approx(0.2)
    assert by_name["fcn5-train"].momentum == pytest.approx(0.8)
    assert by_name["fcn8-train"].learning_rate == pytest.approx(0.5)
    assert by_name["fcn8-infer"].momentum == 0.0  # an explicit zero must not fall back to the default
    assert by_name["fcn8-infer"].precision == "amp_bf16"
    assert by_name["fcn5-infer"].precision == "fp32"


def test_suite_without_defaults_uses_builtin_hyperparameters(catalog, tmp_path):
    path = write_yaml(tmp_path / "mine.yaml", suite_doc(entry("fcn5", modes=["train"])))
    (b,) = catalog.load_suite(path, "smoke", "cpu").benchmarks
    assert b.learning_rate == pytest.approx(0.01) and b.momentum == pytest.approx(0.9)


def test_per_device_default_in_user_suite(catalog, tmp_path):
    e = entry("fcn5", modes=["train"])
    e["batch_sizes"]["default"] = {"cpu": [3], "cuda": [30, 300]}
    path = write_yaml(tmp_path / "mine.yaml", suite_doc(e))
    assert catalog.load_suite(path, "default", "cpu").benchmarks[0].batch_sizes == (3,)
    assert catalog.load_suite(path, "default", "cuda").benchmarks[0].batch_sizes == (30, 300)
    assert catalog.load_suite(path, "smoke", "cuda").benchmarks[0].batch_sizes == (2,)


def test_sequence_length_per_profile_and_device_replaces_the_networks_own(catalog, tmp_path):
    e = entry("lstm32", modes=["train"], sequence_length={"smoke": 8, "default": {"cpu": 16, "cuda": 64},
                                                         "paper": 32})
    path = write_yaml(tmp_path / "mine.yaml", suite_doc(e))
    own = catalog.load_suite(SUITES / "rnn.yaml", "smoke", "cpu").benchmarks[0].network
    for profile, device, length in (("smoke", "cpu", 8), ("default", "cpu", 16), ("default", "cuda", 64),
                                    ("paper", "cpu", 32)):
        net = catalog.load_suite(path, profile, device).benchmarks[0].network
        assert net.resolved["input"]["sequence_length"] == length
        assert net.output_shape == (length, 10000)
        assert net.params == own.params  # the tables do not depend on the length
        # every layer of an LSTM language model works per step: FLOPs scale with the length
        assert net.flops_per_sample * 32 == own.flops_per_sample * length
        # another workload, another hash (paper's 32 is the network's own length: the same network)
        assert (net.definition_hash == own.definition_hash) == (length == 32)


def test_transformer_suite_lengths_keep_the_published_tables(catalog):
    cpu = {b.network.name: b.network for b in catalog.load_suite(SUITES / "transformer.yaml", "default", "cpu").benchmarks}
    gpu = {b.network.name: b.network for b in catalog.load_suite(SUITES / "transformer.yaml", "default", "cuda").benchmarks}
    assert cpu["gpt2_small"].resolved["input"]["sequence_length"] == 128
    assert gpu["gpt2_small"].resolved["input"]["sequence_length"] == 1024
    assert cpu["gpt2_small"].params == gpu["gpt2_small"].params == 124_439_808
    assert cpu["vit_b16"].params == 86_567_656


def test_sequence_length_errors_name_the_suite_field(catalog, tmp_path):
    lengths = {"smoke": 8, "default": 8, "paper": 8}
    path = write_yaml(tmp_path / "mine.yaml", suite_doc(entry("fcn5", sequence_length=lengths)))
    err = suite_error(catalog, path)
    assert err.field == "benchmarks[0].sequence_length" and "no sequence length" in err.reason
    too_long = {"smoke": 2048, "default": 8, "paper": 8}  # gpt2_small's position table holds 1,024
    path = write_yaml(tmp_path / "long.yaml", suite_doc(entry("fcn5"), entry("gpt2_small", sequence_length=too_long)))
    err = suite_error(catalog, path)
    assert err.field == "benchmarks[1].sequence_length"
    assert "2048 positions" in err.reason and "gpt2_small.yaml: layers[1]" in err.reason
    assert "max_length 1024" in err.reason
    path = write_yaml(tmp_path / "zero.yaml", suite_doc(entry("lstm32", sequence_length={**lengths, "paper": 0})))
    assert suite_error(catalog, path).field == "benchmarks[0].sequence_length.paper"


# --------------------------------------------------------------------------- errors

def suite_error(catalog, path: Path, profile: str = "smoke", device: str = "cpu") -> DefinitionError:
    with pytest.raises(DefinitionError) as info:
        catalog.load_suite(path, profile, device)
    assert info.value.path == str(path)
    assert str(info.value).startswith(f"{path}: ")
    return info.value


def test_unknown_network_lists_valid_ones(catalog, tmp_path):
    path = write_yaml(tmp_path / "mine.yaml", suite_doc(entry("fcn6")))
    err = suite_error(catalog, path)
    assert err.field == "benchmarks[0].network"
    assert "'fcn6'" in err.reason
    for name in catalog.network_names():
        assert name in err.reason
    assert str(err).startswith(f"{path}: benchmarks[0].network: unknown network")


def test_unknown_network_in_second_entry(catalog, tmp_path):
    path = write_yaml(tmp_path / "mine.yaml", suite_doc(entry("fcn5"), entry("missing.yaml")))
    assert suite_error(catalog, path).field == "benchmarks[1].network"


def test_duplicate_benchmark_rejected(catalog, tmp_path):
    path = write_yaml(tmp_path / "mine.yaml", suite_doc(entry("fcn5"), entry("fcn5", modes=["infer"])))
    err = suite_error(catalog, path)
    assert err.field == "benchmarks[1]"
    assert "fcn5-infer" in err.reason and "twice" in err.reason


def test_duplicate_mode_within_one_entry_rejected(catalog, tmp_path):
    path = write_yaml(tmp_path / "mine.yaml", suite_doc(entry("fcn5", modes=["train", "train"])))
    err = suite_error(catalog, path)
    assert err.field == "benchmarks[0]" and "fcn5-train" in err.reason


def test_broken_network_file_is_reported_with_its_own_path(catalog, tmp_path):
    bad = write_yaml(tmp_path / "bad.yaml", {**TINY_NETWORK, "layers": [{"type": "dense", "units": 3}]})
    path = write_yaml(tmp_path / "mine.yaml", suite_doc(entry("bad.yaml")))
    with pytest.raises(DefinitionError) as info:
        catalog.load_suite(path, "smoke", "cpu")
    assert info.value.path == str(bad)
    assert info.value.field == "layers[0]"


@pytest.mark.parametrize("mutate,field,reason", [
    (lambda d: d["benchmarks"][0].update(batch_size=[1]), "benchmarks[0].batch_size", "unknown field"),
    (lambda d: d["benchmarks"][0].update(modes=["training"]), "benchmarks[0].modes[0]", "'train'"),
    (lambda d: d["benchmarks"][0].update(modes=[]), "benchmarks[0].modes", "at least 1"),
    (lambda d: d["benchmarks"][0]["batch_sizes"].update(smoke=[0]), "benchmarks[0].batch_sizes.smoke[0]",
     "greater than 0"),
    (lambda d: d["benchmarks"][0]["batch_sizes"].pop("paper"), "benchmarks[0].batch_sizes.paper", "required"),
    (lambda d: d["benchmarks"][0].update(learning_rate=0), "benchmarks[0].learning_rate", "greater than 0"),
    (lambda d: d["benchmarks"][0].update(precision="fp8"), "benchmarks[0].precision", "fp32"),
    (lambda d: d.update(benchmarks=[]), "benchmarks", "at least 1"),
    (lambda d: d.update(name="bad name!"), "name", "pattern"),
])
def test_suite_validation_errors(catalog, tmp_path, mutate, field, reason):
    doc = suite_doc(entry("fcn5"))
    mutate(doc)
    path = write_yaml(tmp_path / "mine.yaml", doc)
    err = suite_error(catalog, path)
    assert err.field == field
    assert reason in err.reason


def test_per_device_default_needs_both_devices(catalog, tmp_path):
    e = entry("fcn5")
    e["batch_sizes"]["default"] = {"cpu": [3]}
    path = write_yaml(tmp_path / "mine.yaml", suite_doc(e))
    err = suite_error(catalog, path)
    assert err.field.startswith("benchmarks[0].batch_sizes.default")


def test_missing_suite_file(catalog, tmp_path):
    err = suite_error(catalog, tmp_path / "absent.yaml")
    assert "cannot read" in err.reason


# --------------------------------------------------------------------------- profiles file

def make_root(tmp_path: Path, profiles: dict) -> SuiteCatalog:
    root = tmp_path / "root"
    shutil.copytree(SUITES / "networks", root / "networks")
    shutil.copy(SUITES / "fcn.yaml", root / "fcn.yaml")
    write_yaml(root / "profiles.yaml", profiles)
    return SuiteCatalog(root)


def shipped_profiles() -> dict:
    return yaml.safe_load((SUITES / "profiles.yaml").read_text())


def test_copied_root_works(tmp_path):
    cat = make_root(tmp_path, shipped_profiles())
    assert cat.suite_names() == ["fcn"]
    suite = cat.load_suite(cat.suite_path("fcn"), "default", "cpu")
    assert [b.name for b in suite.benchmarks] == ["fcn5-train", "fcn5-infer", "fcn8-train", "fcn8-infer"]


def test_smoke_runs_each_networks_first_mode_and_modes_override_it(catalog, tmp_path):
    path = write_yaml(tmp_path / "mine.yaml", suite_doc(entry("fcn5"), entry("fcn8", modes=["infer", "train"])))
    assert catalog.profiles().smoke.modes_per_network == 1
    assert [b.name for b in catalog.load_suite(path, "smoke", "cpu").benchmarks] == ["fcn5-train", "fcn8-infer"]
    assert [b.name for b in catalog.load_suite(path, "default", "cpu").benchmarks] == [
        "fcn5-train", "fcn5-infer", "fcn8-infer", "fcn8-train"]
    assert [b.name for b in catalog.load_suite(path, "smoke", "cpu", ("infer",)).benchmarks] == [
        "fcn5-infer", "fcn8-infer"]
    both = catalog.load_suite(path, "smoke", "cpu", ("train", "infer")).benchmarks
    assert len(both) == 4 and all(b.batch_sizes == (2,) for b in both)


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d["smoke"].update(repeats=0), "smoke.repeats"),
    (lambda d: d["default"]["measure"].update(min_iters=4), "default.measure.min_iters"),
    (lambda d: d["paper"]["warmup"].update(tolerance=0), "paper.warmup.tolerance"),
    (lambda d: d["smoke"]["warmup"].update(windw=2), "smoke.warmup.windw"),
    (lambda d: d.pop("paper"), "paper"),
])
def test_bad_profiles_file(tmp_path, mutate, field):
    doc = shipped_profiles()
    mutate(doc)
    cat = make_root(tmp_path, doc)
    with pytest.raises(DefinitionError) as info:
        cat.profiles()
    assert info.value.path == str(cat.root / "profiles.yaml")
    assert info.value.field == field
    # loading a suite validates the profiles too
    with pytest.raises(DefinitionError):
        cat.load_suite(cat.suite_path("fcn"), "smoke", "cpu")
