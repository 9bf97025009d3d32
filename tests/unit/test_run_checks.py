"""Equivalence by default: `dlbench run` makes the checks its plan lacks before timing (against
torch where a torch runner exists), stores them, says what they cost, and its records carry the
status with the worst error. The fake runner's check (tests/fixtures/runners/fake) on a small
network of this file's suite keeps each check cheap."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlbench.cli import app
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fixtures" / "runners" / "fake"
ANSI = re.compile(r"\x1b\[[0-9;]*m")

NETWORK = """name: tiny
description: a small network for checks that cost little
input: {kind: tensor, shape: [8], classes: 4}
layers:
  - {type: dense, units: 16}
  - {type: relu}
  - {type: dense, units: 4}
loss: softmax_cross_entropy
"""
SUITE = """name: tinysuite
description: one small network
defaults: {learning_rate: 0.05, momentum: 0.9}
benchmarks:
  - network: tiny.yaml
    modes: [train, infer]
    batch_sizes: {smoke: [4], default: [4], paper: [4]}
"""
# the fake runner's code under torch's name and version 9.9: the reference when a run lacks torch
TORCH_RUNNER = f'''import sys
sys.path.insert(0, {str(FAKE)!r})
from fake_runner import FakeRunner


class TorchStandIn(FakeRunner):
    name = "torch"

    def framework_info(self, device):
        return {{**super().framework_info(device), "name": "torch", "version": "9.9"}}
'''
TORCH_WORKER = f'''import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, {str(ROOT)!r})  # the repository: the runners package
from runners.common import harness  # noqa: E402
from torch_runner import TorchStandIn  # noqa: E402

if __name__ == "__main__":
    sys.exit(harness.main(TorchStandIn()))
'''


@pytest.fixture
def suite_file(tmp_path):
    folder = tmp_path / "mysuite"
    folder.mkdir()
    (folder / "tiny.yaml").write_text(NETWORK)
    (folder / "tinysuite.yaml").write_text(SUITE)
    return folder / "tinysuite.yaml"


@pytest.fixture
def with_torch(project):
    """The fake project plus `runners/torch`: the fake's code under torch's name (version 9.9)."""
    torch = project / "runners" / "torch"
    torch.mkdir()
    toml = (FAKE / "runner.toml").read_text().replace('name = "fake"', 'name = "torch"')
    toml = toml.split("[distributed]")[0] + "[model]" + toml.split("[model]")[1]  # single-process only
    (torch / "runner.toml").write_text(toml)
    for name in ("requirements-cpu.txt", "requirements-cuda.txt"):
        shutil.copy(FAKE / name, torch / name)
    (torch / "worker.py").write_text(TORCH_WORKER)
    (torch / "torch_runner.py").write_text(TORCH_RUNNER)
    return project


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, ANSI.sub("", result.stdout), " ".join(ANSI.sub("", result.stderr).split())


def run(suite_file: Path, store: Path, *extra: str):
    return invoke("run", "--suite", str(suite_file), "--profile", "smoke", "--device", "cpu", "--env", "current",
                  "--threads", "1", "--repeats", "1", "--no-telemetry", "--store", str(store), *extra)


def checks(store: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted((store / "checks").glob("*.json"))}


@pytest.fixture(autouse=True)
def fast(fast_fake_runner, monkeypatch, tmp_path):
    monkeypatch.setenv("DLBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("DLBENCH_FAKE_CHECK_MISMATCH", raising=False)


def test_a_run_checks_what_it_lacks_once_and_its_records_say_so(project, suite_file, tmp_path):
    store = tmp_path / "store"
    code, _, err = run(suite_file, store, "--mode", "train", "--mode", "infer")
    assert code == 0, err
    # one check of the network (both modes share it), before timing, with its cost
    assert list(checks(store)) == ["tiny--fake--0.0.json"]
    made = checks(store)["tiny--fake--0.0.json"]
    assert made["status"] == "reference" and made["checked_by"] == "dlbench run" and made["check_s"] > 0
    assert "check tiny float64" in err and "equivalence checks: 1 made before timing" in err
    records = list(Store(store).records())
    assert len(records) == 2
    assert all(r.equivalence["status"] == "reference" and r.equivalence["checked_by"] == "dlbench run"
               and r.equivalence["check_s"] == made["check_s"] for r in records)
    # a second run finds the stored check and makes none
    before = (store / "checks" / "tiny--fake--0.0.json").read_bytes()
    code, _, err = run(suite_file, store)
    assert code == 0, err
    assert "already checked" in err and "check tiny" not in err
    assert (store / "checks" / "tiny--fake--0.0.json").read_bytes() == before


def test_no_check_makes_none_and_records_stay_unchecked(project, suite_file, tmp_path):
    store = tmp_path / "store"
    code, _, err = run(suite_file, store, "--no-check")
    assert code == 0, err
    assert not (store / "checks").exists() and "equivalence checks" not in err
    assert [r.equivalence["status"] for r in Store(store).records()] == ["unchecked"]


def test_a_single_framework_run_is_judged_against_torch(with_torch, suite_file, tmp_path):
    store = tmp_path / "store"
    code, _, err = run(suite_file, store, "--framework", "fake")
    assert code == 0, err
    got = checks(store)
    assert set(got) == {"tiny--fake--0.0.json", "tiny--torch--9.9.json"}  # torch ran as the reference
    assert got["tiny--torch--9.9.json"]["status"] == "reference"
    assert got["tiny--fake--0.0.json"]["status"] == "equivalent"
    [rec] = Store(store).records()
    assert rec.framework["name"] == "fake"  # torch was only checked, not timed
    eq = rec.equivalence
    assert eq["status"] == "equivalent" and eq["reference"] == "torch 9.9"
    assert eq["worst"]["quantity"] in ("logits", "loss", "weights", "update") and eq["worst"]["error"] <= 1e-9


def test_a_mismatch_is_stored_and_recorded_with_its_worst_error(with_torch, suite_file, tmp_path, monkeypatch):
    monkeypatch.setenv("DLBENCH_FAKE_CHECK_MISMATCH", "fake")  # the fake's logits and loss off by 1e-3
    store = tmp_path / "store"
    code, _, err = run(suite_file, store, "--framework", "fake")
    assert code == 0, err  # a mismatch is reported, the timing still runs
    assert "fake mismatch" in err
    [rec] = Store(store).records()
    assert rec.equivalence["status"] == "mismatch" and rec.equivalence["worst"]["error"] > 1e-9
    assert rec.equivalence["worst"]["quantity"] in ("logits", "loss")


def test_mixed_precision_needs_the_float64_check_and_its_own(project, suite_file, tmp_path):
    store = tmp_path / "store"
    code, _, err = run(suite_file, store, "--precision", "amp_bf16")
    assert code == 0, err
    assert set(checks(store)) == {"tiny--fake--0.0.json", "tiny--fake--0.0--amp_bf16.json"}
    [rec] = Store(store).records()
    assert rec.workload.precision == "amp_bf16" and rec.equivalence["precision"] == "amp_bf16"


def test_a_check_the_framework_skips_is_stored_and_not_made_again(project, suite_file, tmp_path, monkeypatch):
    monkeypatch.setenv("DLBENCH_FAKE_BEHAVIOUR", "skip")  # the network cannot be built: check and run skip
    store = tmp_path / "store"
    code, _, err = run(suite_file, store)
    assert code == 0, err
    assert checks(store)["tiny--fake--0.0.json"]["status"] == "skipped"
    [rec] = Store(store).records()
    assert rec.status == "skipped" and rec.equivalence["status"] == "skipped"
    code, _, err = run(suite_file, store)
    assert code == 0 and "already checked" in err
