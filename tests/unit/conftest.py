"""Fixtures shared by the unit tests that run the framework-free fake runner."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlbench.definitions.catalog import SuiteCatalog
from dlbench.execution.registry import RunnerRegistry

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
BOX = re.compile("[\u2500-\u257f]")  # the frame typer draws around a usage error, wrapped at 80 columns


@pytest.fixture(scope="module")
def suite():
    """The fcn suite on the smoke profile with both modes: 2 networks x 2 modes, batch 16, 3 repeats
    (pinned here, so that the tests do not follow edits of the shipped profile)."""
    loaded = SuiteCatalog(ROOT / "suites").load_suite(ROOT / "suites" / "fcn.yaml", "smoke", "cpu", ("train", "infer"))
    policy = loaded.benchmarks[0].policy.model_copy(update={"repeats": 3})
    return dataclasses.replace(loaded, benchmarks=tuple(dataclasses.replace(b, policy=policy)
                                                        for b in loaded.benchmarks))


@pytest.fixture(scope="module")
def fake():
    return RunnerRegistry(ROOT / "tests" / "fixtures" / "runners").get("fake")


@pytest.fixture
def fast_fake_runner(monkeypatch):
    """The fake runner behaves and takes half a millisecond per step."""
    monkeypatch.setenv("DLBENCH_FAKE_STEP_S", "0.0005")
    monkeypatch.delenv("DLBENCH_FAKE_BEHAVIOUR", raising=False)


@pytest.fixture(scope="session")
def nvml_reason():
    """Why real NVML is unavailable on this host ("NVML: ..."), or None where it works."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return f"NVML: {e}"
    pynvml.nvmlShutdown()
    return None


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A dlbench root whose only runner is the fake one (suites, reports and the harness linked)."""
    root = tmp_path / "project"
    (root / "runners").mkdir(parents=True)
    (root / "suites").symlink_to(ROOT / "suites")
    (root / "reports").symlink_to(ROOT / "reports")
    (root / "runners" / "fake").symlink_to(ROOT / "tests" / "fixtures" / "runners" / "fake")
    (root / "runners" / "common").symlink_to(ROOT / "runners" / "common")
    monkeypatch.setenv("DLBENCH_ROOT", str(root))
    return root


@pytest.fixture
def invoke():
    """`dlbench ARGS...` in this process: (exit status, stdout, stderr on one line), colours removed
    (and the frame of a usage error, whose lines then read as one)."""
    from dlbench.cli import app

    def call(*args: str):
        result = CliRunner().invoke(app, list(args), catch_exceptions=False)
        return result.exit_code, ANSI.sub("", result.stdout), " ".join(BOX.sub("", ANSI.sub("", result.stderr)).split())

    return call


@pytest.fixture
def cli_env(monkeypatch, tmp_path, project):
    """The command line on `project` (the fake runner only), in tmp_path, with a cache of its own."""
    monkeypatch.setenv("DLBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return project
