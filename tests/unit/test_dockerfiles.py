"""The Dockerfiles of the docker backend: one per runner and flavour, each installing the requirements
file it is given (the runner's) from the wheelhouse beside it and nothing else, the base image a build
argument whose default is pinned and consistent with the pins, all lint clean."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlbench.execution.containers import INSTALL_STAGE_LABEL, default_base_image, dockerfile_path
from dlbench.execution.registry import FLAVOURS, RunnerRegistry

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
RUNNERS = RunnerRegistry(ROOT / "runners")
DOCKERFILES = sorted(DOCKER.glob("*/*.Dockerfile"))


def tool(name: str) -> str:
    """A linter from the test extra (a wheel that puts the binary beside the interpreter); missing
    tools skip the test, except under CI where they must be there."""
    found = shutil.which(name) or next((str(p) for p in [Path(sys.executable).parent / name] if p.is_file()), None)
    if found is None:
        message = f"{name} is not installed (it comes with the test extra: pip install -e '.[test]')"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def base_images(path: Path) -> list[str]:
    """The images the Dockerfile's stages start from, the BASE_IMAGE argument read as its default."""
    return [default_base_image(path) if image == "${BASE_IMAGE}" else image
            for image in re.findall(r"^FROM\s+(\S+)", path.read_text(), re.MULTILINE)]


def pin(requirements: Path, name: str) -> str:
    match = re.search(rf"^{re.escape(name)}(\[[^\]]*\])?==(\S+)", requirements.read_text(), re.MULTILINE)
    assert match, f"{requirements} does not pin {name}"
    return match.group(2)


def test_every_runner_has_an_image_per_flavour_and_nothing_else():
    expected = {dockerfile_path(DOCKER, name, flavour) for name in RUNNERS.names() for flavour in FLAVOURS}
    assert set(DOCKERFILES) == expected


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_image_installs_the_requirements_it_is_given(path):
    # the build context holds requirements.txt alone (containers.DockerBackend._build): a copy of the
    # runner's file, so an image cannot pin versions of its own
    text = path.read_text()
    assert "COPY requirements.txt /opt/dlbench/requirements.txt" in text
    assert "COPY wheelhouse /opt/dlbench/wheelhouse" in text
    install = re.search(r"pip install [^\n]*(\\\n[^\n]*)*-r /opt/dlbench/requirements\.txt", text)
    assert install and "--no-index" in install.group(0) and "--find-links /opt/dlbench/wheelhouse" in install.group(0)
    assert not re.search(r"pip install [^\n]*==", text)  # no version written here
    assert "index-url" not in text.lower()  # no index of its own: the host's pip configuration decides


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_base_is_a_build_argument_and_the_wheels_stay_out_of_the_image(path):
    text = path.read_text()
    stages = re.findall(r"^FROM\s+(.+)$", text, re.MULTILINE)
    assert stages == ["${BASE_IMAGE} AS install", "${BASE_IMAGE}"]  # both stages on the chosen base
    install_stage, final_stage = text.split("\nFROM ${BASE_IMAGE}\n")
    assert f"LABEL {INSTALL_STAGE_LABEL}" in install_stage  # dlbench removes that stage's image after the build
    assert "wheelhouse" not in final_stage  # the final image takes the venv, not the wheels
    assert "COPY --from=install /opt/dlbench/venv /opt/dlbench/venv" in final_stage
    assert "ENV PATH=/opt/dlbench/venv/bin:$PATH" in final_stage


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_base_images_are_pinned(path):
    for image in base_images(path):
        name, _, tag = image.partition(":")
        assert tag and tag != "latest" and re.search(r"\d+\.\d+", tag), f"{path}: {image} is not pinned by a version tag"
    if path.name == "cpu.Dockerfile":  # mxnet's needs the full image's OpenMP runtime (libgomp)
        slim = "" if path.parent.name == "mxnet" else "-slim"
        assert re.fullmatch(rf"python:3\.11\.\d+{slim}-bookworm", base_images(path)[0])


def test_cuda_bases_match_the_pinned_releases():
    # a bumped requirement without a bumped base image would install a second framework build
    torch = pin(RUNNERS.get("torch").requirements_for("cuda"), "torch")
    assert base_images(dockerfile_path(DOCKER, "torch", "cuda"))[0].startswith(f"pytorch/pytorch:{torch}-cuda")
    tensorflow = pin(RUNNERS.get("tensorflow").requirements_for("cuda"), "tensorflow")
    assert set(base_images(dockerfile_path(DOCKER, "tensorflow", "cuda"))) == {f"tensorflow/tensorflow:{tensorflow}-gpu"}
    # mxnet-cuNNN is built for CUDA N.N and does not bundle it: the base image must be that CUDA
    mxnet = re.search(r"^mxnet-cu(\d+)(\d)==", RUNNERS.get("mxnet").requirements_for("cuda").read_text(), re.MULTILINE)
    assert base_images(dockerfile_path(DOCKER, "mxnet", "cuda"))[0].startswith(
        f"nvidia/cuda:{mxnet.group(1)}.{mxnet.group(2)}.")
    assert "jax[cuda12]" in RUNNERS.get("jax").requirements_for("cuda").read_text()
    assert base_images(dockerfile_path(DOCKER, "jax", "cuda"))[0].startswith("nvidia/cuda:12.")


def test_exceptions_to_the_lint_rules_are_few_and_explained():
    for path in DOCKERFILES:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if "hadolint ignore" in line:
                # only the apt version pins (DL3008), on Ubuntu bases, with the reason just above
                assert line.strip() == "# hadolint ignore=DL3008", f"{path}:{i + 1}"
                assert "ubuntu" in base_images(path)[0]
                assert "security update" in " ".join(lines[max(0, i - 5):i]), f"{path}:{i + 1}: say why"


def test_dockerfiles_lint_clean():
    hadolint = tool("hadolint")
    done = subprocess.run([hadolint, "--no-color", *map(str, DOCKERFILES)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "", done.stdout + done.stderr


def test_the_linter_does_find_problems(tmp_path):
    # the check above can fail: the same linter flags an unpinned base and an unpinned pip install
    hadolint = tool("hadolint")
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    done = subprocess.run([hadolint, "--no-color", str(bad)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "DL3007" in done.stdout and "DL3013" in done.stdout
