"""docs/extending.md, "Add a network": two data files and nothing else. A toy network
(`suites/networks/toy_mlp.yaml`) and a suite that names it (`suites/toy.yaml`), written into a copy
of suites/ under a temporary project root whose only runner is the fake one, are listed by
`dlbench list` and run by `dlbench run` end to end into a record carrying the network's hash,
parameters and FLOPs. The same two files in a folder of one's own work through `--suite PATH`."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlbench.cli import app
from dlbench.definitions.catalog import SuiteCatalog
from dlbench.definitions.loader import load_network
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")

NETWORK = """\
name: toy_mlp
description: a two-layer perceptron small enough for a test
input: {kind: tensor, shape: [16], classes: 4}
layers:
  - {type: dense, units: 32}
  - {type: relu}
  - {type: dense, units: 4}
"""
PARAMS = 16 * 32 + 32 + 32 * 4 + 4  # dense: in * out + out
FLOPS = (2 * 16 * 32 + 32) + 32 + (2 * 32 * 4 + 4)  # dense: 2 * in * out + out; relu: one per element


def suite(network_ref: str) -> str:
    return f"""\
name: toy
description: the toy network, trained
defaults: {{learning_rate: 0.05, momentum: 0.9}}
benchmarks:
  - network: {network_ref}
    modes: [train, infer]
    batch_sizes:
      smoke: [8]
      default: {{cpu: [32], cuda: [256]}}
      paper: [64]
"""


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, ANSI.sub("", result.stdout), " ".join(ANSI.sub("", result.stderr).split())


@pytest.fixture
def own_project(tmp_path, monkeypatch):
    """A dlbench root with a copy of suites/ (to add to) and the fake runner as its only runner."""
    root = tmp_path / "project"
    shutil.copytree(ROOT / "suites", root / "suites")
    (root / "runners").mkdir()
    (root / "reports").symlink_to(ROOT / "reports")
    (root / "runners" / "fake").symlink_to(ROOT / "tests" / "fixtures" / "runners" / "fake")
    (root / "runners" / "common").symlink_to(ROOT / "runners" / "common")
    monkeypatch.setenv("DLBENCH_ROOT", str(root))
    monkeypatch.delenv("DLBENCH_FAKE_BEHAVIOUR", raising=False)
    monkeypatch.setenv("DLBENCH_STORE", str(tmp_path / "default-store"))
    monkeypatch.setenv("DLBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DLBENCH_FAKE_STEP_S", "0.0005")
    monkeypatch.chdir(tmp_path)
    return root


def run_toy(suite_ref: str, store: Path):
    return invoke("run", "--no-check", "--suite", suite_ref, "--framework", "fake", "--env", "current", "--profile", "smoke",
                  "--device", "cpu", "--threads", "1", "--repeats", "1", "--store", str(store))


def assert_one_toy_record(store: Path, network_file: Path):
    (record,) = Store(store).records()  # smoke runs each network's first mode: train
    assert (record.suite, record.benchmark, record.framework["name"], record.status) == ("toy", "toy_mlp-train", "fake", "ok")
    assert record.network.name == "toy_mlp"
    assert Path(record.network.file).resolve() == network_file.resolve()
    assert record.network.hash == load_network(network_file).definition_hash
    assert (record.network.params_described, record.network.flops_per_sample) == (PARAMS, FLOPS)
    assert record.summary is not None and record.summary.samples_per_s > 0


def test_a_network_and_a_suite_in_suites_are_listed_and_run_by_name(own_project, tmp_path):
    suites = own_project / "suites"
    network_file = suites / "networks" / "toy_mlp.yaml"
    network_file.write_text(NETWORK)
    (suites / "toy.yaml").write_text(suite("toy_mlp"))

    catalog = SuiteCatalog(suites)
    assert "toy" in catalog.suite_names() and "toy_mlp" in catalog.network_names()
    assert "toy" not in SuiteCatalog(ROOT / "suites").suite_names()  # the repository's suites are untouched

    code, out, err = invoke("list", "--suite", "toy", "--profile", "smoke", "--device", "cpu")
    assert code == 0, err
    (row,) = [line for line in out.splitlines() if "toy_mlp-train" in line]
    assert f" {PARAMS} " in row  # params, as the catalog counts them
    assert "toy_mlp-infer" not in out  # smoke: the first mode only

    store = tmp_path / "store"
    code, _, err = run_toy("toy", store)
    assert code == 0, err
    assert_one_toy_record(store, network_file)

    # and `--suite all` now includes it
    names = [b.name for s in catalog.suite_names()
             for b in catalog.load_suite(catalog.suite_path(s), "smoke", "cpu").benchmarks]
    assert "toy_mlp-train" in names


def test_the_same_two_files_in_a_folder_of_ones_own_run_by_path(own_project, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    network_file = mine / "toy_mlp.yaml"
    network_file.write_text(NETWORK)
    suite_file = mine / "toy.yaml"
    suite_file.write_text(suite("toy_mlp.yaml"))  # a path relative to the suite file

    code, out, err = invoke("list", "--suite", str(suite_file), "--profile", "smoke", "--device", "cpu")
    assert code == 0, err
    assert "toy_mlp-train" in out
    store = tmp_path / "store"
    code, _, err = run_toy(str(suite_file), store)
    assert code == 0, err
    assert_one_toy_record(store, network_file)


def test_a_mistake_in_the_new_network_names_its_file_and_field(own_project, tmp_path):
    network_file = own_project / "suites" / "networks" / "toy_mlp.yaml"
    network_file.write_text(NETWORK.replace("units: 4", "units: 5"))
    (own_project / "suites" / "toy.yaml").write_text(suite("toy_mlp"))
    code, _, err = invoke("list", "--suite", "toy", "--profile", "smoke", "--device", "cpu")
    assert code == 2
    assert f"{network_file}: layers[2]: the network must end in (4,) logits, got [5]" in err.replace("\n", "")
