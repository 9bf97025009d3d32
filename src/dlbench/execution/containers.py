"""The `docker` environment backend: each runner's worker runs in a container image of its framework.

Images
    One Dockerfile per framework and device flavour, `docker/<framework>/<flavour>.Dockerfile`. The
    build context is a temporary folder holding exactly one file, `requirements.txt`: a copy of the
    runner's pinned requirements file for that flavour (the file `dlbench env create` installs into
    a venv), so the versions have one source. The image's tag is `dlbench/<framework>:<flavour>-<key>`,
    the key a hash of the Dockerfile and that requirements file (and IMAGE_FORMAT): an image is
    built exactly when one of them changed, and an edited file can never be served by an old image.
    Labels (`org.dlbench.*`) mark dlbench's images for `dlbench env list`.

Running a worker
    `docker run --rm` with a name of its own, so that a timeout or Ctrl-C can `docker stop` it (the
    docker client is only a proxy: killing it leaves the container running). The repository is
    mounted read-only and the worker's exchange folder (request, result) read-write, each at the same
    path as on the host, so no path in a request needs translating. The container runs as the
    calling user (files it writes belong to them), without network, with the runner's thread
    variables, and for a CUDA run with the GPUs passed through (`--gpus`). The telemetry sampler
    stays on the host and follows the worker by its host pid (`docker inspect`); the worker's
    measured window is read on CLOCK_MONOTONIC, which containers share with the host (docker gives
    them no time namespace), so the host's samples line up with it.

The engine boundary
    Every call to the engine goes through DockerEngine, which runs the `docker` client
    ($DLBENCH_DOCKER, else `docker` on PATH). Tests replace that executable with a fake.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .environments import (
    BUILDING_IMAGE,
    BUILT,
    CACHED,
    FAILED,
    BuildProgress,
    Environment,
    EnvironmentBuildError,
    ProgressCallback,
)
from .interrupts import temporary_folder
from .registry import RunnerInfo

IMAGE_FORMAT = 1  # bump to rebuild every image (what the backend expects of an image changed)
REPOSITORY = "dlbench"  # images are dlbench/<framework>:<flavour>-<key>
LABEL = "org.dlbench"
ENGINE_CALL_TIMEOUT_S = 120.0
STOP_GRACE_S = 3  # docker stop: SIGTERM, then SIGKILL after this many seconds
PID_WAIT_S = 30.0  # how long to wait for a started container to report its process
# Docker's default /dev/shm is 64 MB; NCCL and frameworks that stage data in shared memory fail in it.
SHM_SIZE = "1g"

# Printed by `python3 -c` inside an image: the interpreter, its version and the lock.
_PROBE = (
    "import importlib.metadata as m, json, platform, sys; "
    "print(json.dumps({'python': sys.executable, 'python_version': platform.python_version(), "
    "'packages': sorted({d.metadata['Name'] + '==' + d.version for d in m.distributions() "
    "if d.metadata['Name']})}))"
)


def dockerfile_path(docker_dir: Path, framework: str, flavour: str) -> Path:
    return docker_dir / framework / f"{flavour}.Dockerfile"


def image_key(dockerfile: Path, requirements: Path, flavour: str) -> str:
    h = hashlib.sha256()
    for part in (str(IMAGE_FORMAT), flavour, dockerfile.read_text(), requirements.read_text()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def image_tag(framework: str, flavour: str, key: str) -> str:
    return f"{REPOSITORY}/{framework}:{flavour}-{key}"


def parse_tag(repository: str, tag: str) -> tuple[str, str, str] | None:
    """(framework, flavour, key) of one of dlbench's image tags, None for any other image."""
    owner, _, framework = repository.partition("/")
    flavour, _, key = tag.partition("-")
    if owner != REPOSITORY or not framework or not key:
        return None
    return framework, flavour, key


def gpu_request(visible_devices: str | None) -> str:
    """The `--gpus` value: the devices $CUDA_VISIBLE_DEVICES names (indices or UUIDs), else all.

    A list goes in double quotes inside the value: docker reads `--gpus` as CSV, so an unquoted
    `device=0,1` would be two fields.
    """
    devices = [d.strip() for d in (visible_devices or "").split(",") if d.strip()]
    if not devices:
        return "all"
    return f"device={devices[0]}" if len(devices) == 1 else f'"device={",".join(devices)}"'


class DockerEngine:
    """The docker client, called as a subprocess: the one place this backend touches the engine."""

    def __init__(self, executable: str | None = None):
        self.executable = executable or os.environ.get("DLBENCH_DOCKER") or "docker"

    def command(self, *args: str) -> list[str]:
        return [self.executable, *args]

    def call(self, *args: str, timeout: float = ENGINE_CALL_TIMEOUT_S) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(self.command(*args), capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise EnvironmentBuildError(
                f"no docker client {self.executable!r} found; install Docker (the engine and its CLI) or "
                "point $DLBENCH_DOCKER at the client") from None
        except subprocess.TimeoutExpired:
            raise EnvironmentBuildError(
                f"`{self.executable} {' '.join(args[:2])}` did not answer within {timeout:g} s; "
                "is the Docker daemon running?") from None

    def stream(self, args: list[str], log, on_line: Callable[[str], None] | None) -> int:
        """Run a long engine command (a build), copying its output to `log` and each line to `on_line`."""
        try:
            proc = subprocess.Popen(self.command(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise EnvironmentBuildError(f"no docker client {self.executable!r} found; install Docker or "
                                        "point $DLBENCH_DOCKER at the client") from None
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                if on_line and line.strip():
                    on_line(line.strip())
            return proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise

    def image_id(self, tag: str) -> str | None:
        """The image's id, None when the engine has no such image (any other failure raises)."""
        done = self.call("image", "inspect", "--format", "{{.Id}}", tag)
        if done.returncode == 0:
            return done.stdout.strip() or None
        if "no such image" in done.stderr.lower():
            return None
        raise EnvironmentBuildError(f"`{self.executable} image inspect {tag}` failed: "
                                    f"{done.stderr.strip() or 'exit status ' + str(done.returncode)}")

    def images(self) -> list[dict]:
        """dlbench's images: the engine's `image ls` rows (Repository, Tag, ID, CreatedAt, Size)."""
        done = self.call("image", "ls", "--filter", f"label={LABEL}.framework", "--format", "{{json .}}")
        if done.returncode != 0:
            raise EnvironmentBuildError(f"`{self.executable} image ls` failed: {done.stderr.strip()}")
        return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]

    def remove_image(self, tag: str) -> None:
        done = self.call("image", "rm", tag)
        if done.returncode != 0:
            raise EnvironmentBuildError(f"`{self.executable} image rm {tag}` failed: {done.stderr.strip()}")

    def container_pid(self, name: str) -> int | None:
        """The host pid of the container's main process (its worker), None while it has none."""
        done = self.call("inspect", "--type", "container", "--format", "{{.State.Pid}}", name, timeout=10)
        text = done.stdout.strip()
        return int(text) if done.returncode == 0 and text.isdigit() and int(text) > 0 else None

    def stop(self, name: str, grace_s: int = STOP_GRACE_S) -> None:
        """SIGTERM the container, SIGKILL after the grace period; `docker kill` if stop itself fails.
        Errors are swallowed: the container may already be gone, and stopping must never raise."""
        with contextlib.suppress(EnvironmentBuildError):
            done = self.call("stop", "--time", str(grace_s), name, timeout=grace_s + 30)
            if done.returncode == 0 or "no such container" in done.stderr.lower():
                return
            self.call("kill", name, timeout=30)


@dataclass(frozen=True)
class ContainerSpec:
    """How to start one worker of an environment in its image; one instance per environment."""

    engine: DockerEngine
    image: str
    image_id: str
    framework: str
    gpus: str | None  # the --gpus value, None for a CPU image
    mounts_ro: tuple[Path, ...]  # the repository (and a runner folder outside it, if any)
    dockerfile: str

    def describe(self) -> dict:
        return {"image": self.image, "image_id": self.image_id, "dockerfile": self.dockerfile,
                "gpus": self.gpus}

    def new_name(self) -> str:
        return f"dlbench-{self.framework}-{os.getpid()}-{secrets.token_hex(4)}"

    def run_command(self, name: str, python: Path, worker: Path, args: list[str], exchange: Path,
                    env: dict[str, str], shared: tuple[Path, ...] = ()) -> list[str]:
        """`docker run` for one worker: `python worker args...` in the image, named `name`.

        exchange: the private folder of the request and result (read-write); shared: other folders
        the worker reads or writes (read-write); both mounted at their host paths.
        """
        uid_gid = f"{os.getuid()}:{os.getgid()}"
        cmd = ["run", "--rm", "--name", name, "--label", f"{LABEL}.framework={self.framework}",
               "--network", "none", "--shm-size", SHM_SIZE, "--user", uid_gid,
               # no passwd entry for an arbitrary uid: give caches (~/.cache, ~/.keras) a writable home
               "--env", "HOME=/tmp", "--env", "PYTHONDONTWRITEBYTECODE=1"]
        for key, value in sorted(env.items()):
            cmd += ["--env", f"{key}={value}"]
        mounts: list[tuple[Path, str]] = [(p, "ro") for p in self.mounts_ro]
        mounts += [(p.resolve(), "rw") for p in (exchange, *shared)]
        for path, mode in mounts:
            cmd += ["--volume", f"{path}:{path}:{mode}"]
        if self.gpus:
            cmd += ["--gpus", self.gpus]
        cmd += ["--workdir", str(worker.parent), "--entrypoint", str(python), self.image, str(worker), *args]
        return self.engine.command(*cmd)

    def worker_pid(self, name: str, client) -> int | None:
        """Wait for the named container's process to exist; None if the client ends first or it never does."""
        deadline = time.monotonic() + PID_WAIT_S
        while time.monotonic() < deadline and client.poll() is None:
            pid = self.engine.container_pid(name)
            if pid is not None:
                return pid
            time.sleep(0.05)
        return None

    def stop(self, name: str) -> None:
        self.engine.stop(name)

    @staticmethod
    def describe_exit(returncode: int) -> tuple[int, str | None]:
        """The `docker run` status as the worker's: (status or -signal, the engine's own failure or None).

        125 is the engine failing to create or start the container (no such image, no GPU runtime),
        126/127 the entrypoint not executable or not found; above 128 the worker died of a signal
        (128 + its number), which the launcher words as it does for a worker on the host.
        """
        if returncode == 125:
            return returncode, "docker could not start the container"
        if returncode in (126, 127):
            return returncode, "the image's interpreter could not be run (exit status %d)" % returncode
        if returncode > 128:
            return -(returncode - 128), None
        return returncode, None


class DockerBackend:
    name = "docker"

    def __init__(self, cache: Path, docker_dir: Path, project_root: Path, engine: DockerEngine | None = None):
        self.root = cache / "docker"  # build logs and the probe of each image (its lock)
        self.docker_dir = docker_dir
        self.project_root = project_root.resolve()
        self.engine = engine or DockerEngine()

    def image_for(self, runner: RunnerInfo, flavour: str) -> tuple[str, Path, Path]:
        """(tag, Dockerfile, requirements) of a runner's image; EnvironmentBuildError without a Dockerfile."""
        dockerfile = dockerfile_path(self.docker_dir, runner.name, flavour)
        if not dockerfile.is_file():
            raise EnvironmentBuildError(f"no Dockerfile for {runner.name} ({flavour}): {dockerfile} does not exist")
        requirements = runner.requirements_for(flavour)
        return image_tag(runner.name, flavour, image_key(dockerfile, requirements, flavour)), dockerfile, requirements

    def existing(self, runner: RunnerInfo, flavour: str) -> Environment | None:
        tag, dockerfile, _ = self.image_for(runner, flavour)
        image_id = self.engine.image_id(tag)
        if image_id is None:
            return None
        return self._environment(runner, flavour, tag, image_id, dockerfile)

    def ensure(self, runner: RunnerInfo, flavour: str, on_progress: ProgressCallback | None = None) -> Environment:
        """The runner's image, built first when the engine does not have it; `on_progress` hears that
        it was there already, or the build's steps and docker's output lines."""
        report = on_progress or (lambda progress: None)
        found = self._cached(runner, flavour, report)
        if found:
            return found
        tag, dockerfile, requirements = self.image_for(runner, flavour)
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f".{tag.replace('/', '_').replace(':', '_')}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another dlbench may be building this image right now
            found = self._cached(runner, flavour, report)
            if found:
                return found
            self._build(runner, flavour, tag, dockerfile, requirements, report)
        found = self.existing(runner, flavour)
        if found is None:
            raise EnvironmentBuildError(f"`docker build` reported success but the engine has no image {tag}")
        return found

    def _cached(self, runner: RunnerInfo, flavour: str, report: ProgressCallback) -> Environment | None:
        found = self.existing(runner, flavour)
        if found:
            report(BuildProgress(runner.name, flavour, CACHED, where=found.key))
        return found

    def _build(self, runner: RunnerInfo, flavour: str, tag: str, dockerfile: Path, requirements: Path,
               report: ProgressCallback) -> None:
        log_path = self.root / f"{tag.replace('/', '_').replace(':', '_')}.build.log"
        key = tag.rsplit("-", 1)[1]
        started = time.monotonic()

        def progress(step: str, note: str | None = None, output: str | None = None) -> None:
            report(BuildProgress(runner.name, flavour, step, round(time.monotonic() - started, 1), tag, note, output))

        with temporary_folder("dlbench-image-") as context, open(log_path, "w") as log:
            # The context is the requirements file alone: nothing else can reach the image.
            shutil.copyfile(requirements, context / "requirements.txt")
            args = ["build", "--progress", "plain", "--file", str(dockerfile), "--tag", tag,
                    "--label", f"{LABEL}.framework={runner.name}", "--label", f"{LABEL}.flavour={flavour}",
                    "--label", f"{LABEL}.key={key}", str(context)]
            log.write(f"$ {' '.join(self.engine.command(*args))}\n")
            log.flush()
            progress(BUILDING_IMAGE, f"from {dockerfile}")
            status = self.engine.stream(args, log, lambda line: progress(BUILDING_IMAGE, output=line))
            log.write(f"# exit status {status} after {time.monotonic() - started:.0f} s\n")
        if status != 0:
            progress(FAILED, f"log: {log_path}")
            tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:])
            raise EnvironmentBuildError(f"building the {runner.name} ({flavour}) image {tag} from {dockerfile} "
                                        f"failed; log: {log_path}\n{tail}")
        progress(BUILT)

    def _probe(self, tag: str, image_id: str) -> dict:
        """Interpreter, version and package list of an image, cached per image id (images are immutable)."""
        cached = self.root / f"{image_id.replace(':', '_')}.json"
        if cached.is_file():
            return json.loads(cached.read_text())
        done = self.engine.call("run", "--rm", "--network", "none", "--entrypoint", "python3", tag, "-c", _PROBE,
                                timeout=300)
        last = next((line for line in reversed(done.stdout.splitlines()) if line.startswith("{")), None)
        if done.returncode != 0 or last is None:
            raise EnvironmentBuildError(f"the image {tag} has no working python3 (exit status {done.returncode}): "
                                        f"{(done.stderr or done.stdout).strip()[-500:]}")
        probe = json.loads(last)
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".partial")
        tmp.write_text(json.dumps(probe))
        os.replace(tmp, cached)
        return probe

    def _environment(self, runner: RunnerInfo, flavour: str, tag: str, image_id: str, dockerfile: Path) -> Environment:
        probe = self._probe(tag, image_id)
        mounts = [self.project_root]
        runners = runner.worker.resolve().parents[1]  # the runner's folder and runners/common beside it
        if not runners.is_relative_to(self.project_root):
            mounts.append(runners)
        gpus = gpu_request(os.environ.get("CUDA_VISIBLE_DEVICES")) if flavour == "cuda" else None
        try:
            shown = str(dockerfile.relative_to(self.project_root))
        except ValueError:
            shown = str(dockerfile)
        spec = ContainerSpec(self.engine, tag, image_id, runner.name, gpus, tuple(mounts), shown)
        return Environment(runner.name, self.name, flavour, Path(probe["python"]), tag, None,
                           probe.get("packages", []), probe.get("python_version"), container=spec)

    def list(self) -> list[dict]:
        """dlbench's images in the engine: framework, flavour, key, tag, id, created, size."""
        rows = []
        for image in self.engine.images():
            parsed = parse_tag(image.get("Repository", ""), image.get("Tag", ""))
            if parsed is None:
                continue
            framework, flavour, key = parsed
            rows.append({"framework": framework, "flavour": flavour, "key": key,
                         "tag": f"{image['Repository']}:{image['Tag']}", "id": image.get("ID", ""),
                         "created": image.get("CreatedAt", ""), "size": image.get("Size", "")})
        return sorted(rows, key=lambda r: (r["framework"], r["flavour"], r["created"]))

    def remove(self, framework: str) -> list[str]:
        removed = []
        for row in self.list():
            if row["framework"] == framework:
                self.engine.remove_image(row["tag"])
                removed.append(row["tag"])
        return removed

