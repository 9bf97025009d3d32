"""The `docker` environment backend: each runner's worker runs in a container image of its framework.

Engines
    Docker (the docker CLI, with or without buildx) and Podman (its own CLI, or its docker-API socket
    through the docker CLI), told apart by container_engine.py from their machine-readable answers.

Images
    One Dockerfile per framework and device flavour, `docker/<framework>/<flavour>.Dockerfile`, whose
    base image is the build argument BASE_IMAGE: its default is the pinned public image; a host
    without a registry passes its own ($DLBENCH_BASE_IMAGE, e.g. a Debian made by mmdebstrap and
    `docker import`ed), and the record says which. The build context is a folder holding the runner's
    pinned requirements file (the one `dlbench env create` installs into a venv) and a wheelhouse:
    every wheel the image needs, downloaded here by this interpreter's pip, with the pip
    configuration the venv backend installs with, for the base image's Python and platform (asked of
    the base image itself), constrained to the venv's lock where that venv exists. The image installs
    from the wheelhouse alone (`--no-index`), so a CPU image builds without network (`--network
    none`), and the probe of the finished image checks its lock: every pin of the requirements file,
    and the venv's versions where there is one. The image's tag is `dlbench/<framework>:<flavour>-<key>`,
    the key a hash of the Dockerfile, that requirements file, the base image's name (and
    IMAGE_FORMAT): an image is built exactly when one of them changed. Labels (`org.dlbench.*`)
    mark dlbench's images for `dlbench env list`.

Running a worker
    `run` with a name of its own, so that a timeout or Ctrl-C can stop it (the client is only a
    proxy: killing it leaves the container running), with `--init` (tini, or podman's catatonit,
    as PID 1: the worker gets the engine's SIGTERM and stops within the grace, where as PID 1 it
    would ignore it until SIGKILL) and `--pull never` (an image gone from the engine is an error,
    not a download). The repository is mounted read-only and the worker's exchange folder (request,
    result) read-write, each at the same path as on the host, so no path in a request needs
    translating. The container runs as the calling user (files it writes belong to them), without
    network, with the runner's thread variables, for a CUDA run with the GPUs passed through
    (`--gpus`), and with the memory limit $DLBENCH_CONTAINER_MEMORY where one is set. It is not
    `--rm`: when the client has exited, the container's state is read (its exit status, whether it
    was OOM-killed) and then it is removed. The telemetry sampler stays on the host and follows the
    worker by its host pid; the worker's measured window is read on CLOCK_MONOTONIC, which
    containers share with the host (no time namespace), so the host's samples line up with it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .container_engine import ContainerEngine, EngineError, EngineInfo, ImageFacts
from .environments import (
    BUILDING_IMAGE,
    BUILT,
    CACHED,
    CREATING,
    FAILED,
    VERIFYING,
    BuildProgress,
    Environment,
    EnvironmentBuildError,
    ProgressCallback,
    VenvBackend,
)
from .interrupts import shielded
from .registry import RunnerInfo

IMAGE_FORMAT = 2  # bump to rebuild every image (what the backend expects of an image changed)
REPOSITORY = "dlbench"  # images are dlbench/<framework>:<flavour>-<key>
LABEL = "org.dlbench"
INSTALL_STAGE_LABEL = f"{LABEL}.stage=install"  # the Dockerfiles' install stage (its image is left untagged)
STOP_GRACE_S = 3  # stop: SIGTERM, then SIGKILL after this many seconds
PID_WAIT_S = 30.0  # how long to wait for a started container to report its process
# Docker's default /dev/shm is 64 MB; NCCL and frameworks that stage data in shared memory fail in it.
SHM_SIZE = "1g"
BASE_IMAGE_VARIABLE = "DLBENCH_BASE_IMAGE"  # the base image every Dockerfile is built FROM, if set
MEMORY_VARIABLE = "DLBENCH_CONTAINER_MEMORY"  # a memory limit for each worker's container (`--memory`)
# A build needs room for the wheelhouse twice (the context the engine copies, the install stage)
# and the installed packages (two to three times the wheels): refused up front below this factor.
BUILD_SPACE_FACTOR = 4
# Installed by pip into every venv, not pinned by any runner: not part of the lock compared.
_TOOLING = {"pip", "setuptools", "wheel"}

# Printed by `python3 -c` inside an image: the interpreter, its version and the lock.
_PROBE = (
    "import importlib.metadata as m, json, platform, sys; "
    "print(json.dumps({'python': sys.executable, 'python_version': platform.python_version(), "
    "'packages': sorted({d.metadata['Name'] + '==' + d.version for d in m.distributions() "
    "if d.metadata['Name']})}))"
)
# Printed by `python3 -c` inside a base image: what pip needs to download wheels for it.
_PLATFORM_PROBE = (
    "import json, platform, sys; "
    "print(json.dumps({'implementation': sys.implementation.name, 'version': list(sys.version_info[:2]), "
    "'libc': list(platform.libc_ver()), 'machine': platform.machine()}))"
)


def dockerfile_path(docker_dir: Path, framework: str, flavour: str) -> Path:
    return docker_dir / framework / f"{flavour}.Dockerfile"


def default_base_image(dockerfile: Path) -> str:
    """The Dockerfile's own base: the default of its `ARG BASE_IMAGE=`."""
    match = re.search(r"^ARG\s+BASE_IMAGE=(\S+)", dockerfile.read_text(), re.MULTILINE)
    if not match:
        raise EnvironmentBuildError(f"{dockerfile} has no `ARG BASE_IMAGE=<image>` line: its base image cannot be "
                                    "chosen")
    return match.group(1)


def base_image_for(dockerfile: Path) -> str:
    return os.environ.get(BASE_IMAGE_VARIABLE) or default_base_image(dockerfile)


def image_key(dockerfile: Path, requirements: Path, flavour: str, base_image: str) -> str:
    h = hashlib.sha256()
    for part in (str(IMAGE_FORMAT), flavour, base_image, dockerfile.read_text(), requirements.read_text()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def image_tag(framework: str, flavour: str, key: str) -> str:
    return f"{REPOSITORY}/{framework}:{flavour}-{key}"


def parse_tag(reference: str) -> tuple[str, str, str] | None:
    """(framework, flavour, key) of one of dlbench's image tags (`dlbench/<fw>:<flavour>-<key>`, with
    or without a registry such as podman's `localhost/`), None for any other image."""
    from .container_engine import strip_registry

    repository, _, tag = strip_registry(reference).rpartition(":")
    owner, _, framework = repository.partition("/")
    flavour, _, key = tag.partition("-")
    if owner != REPOSITORY or not framework or "/" in framework or not flavour or not key:
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


def pip_target(platform_probe: dict) -> list[str]:
    """pip download's options for a base image's interpreter: its Python, ABI and platform tags."""
    implementation = {"cpython": "cp"}.get(platform_probe["implementation"])
    if implementation is None:
        raise EnvironmentBuildError(f"the base image's Python is {platform_probe['implementation']}, not CPython")
    major, minor = platform_probe["version"]
    machine = platform_probe["machine"]
    libc, libc_version = platform_probe["libc"]
    args = ["--only-binary=:all:", "--implementation", implementation, "--python-version", f"{major}{minor}",
            "--abi", f"cp{major}{minor}", "--abi", "abi3", "--abi", "none"]
    platforms = []
    if libc == "glibc" and re.fullmatch(r"2\.\d+", libc_version or ""):
        glibc = int(libc_version.split(".")[1])
        platforms += [f"manylinux_2_{m}_{machine}" for m in range(glibc, 4, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        platforms += [f"{name}_{machine}" for m, name in legacy.items() if glibc >= m]
    platforms.append(f"linux_{machine}")
    for tag in platforms:
        args += ["--platform", tag]
    return args


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock(packages: list[str]) -> dict[str, str]:
    out = {}
    for entry in packages:
        name, _, version = entry.partition("==")
        if _normalise(name) not in _TOOLING:
            out[_normalise(name)] = version
    return out


def lock_differences(image: list[str], requirements: str, venv: list[str] | None) -> list[str]:
    """What keeps the image's packages from being the venv's: a pin of the requirements file it
    does not meet (a local version label such as +cpu meets it), a version other than the venv's."""
    have = _lock(image)
    problems = []
    for line in requirements.splitlines():
        match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;#]+)", line)
        if not match:
            continue
        name, version = _normalise(match.group(1)), match.group(3)
        got = have.get(name)
        if got is None or (got != version and not got.startswith(version + "+")):
            problems.append(f"{name}: requirements pin {version}, the image has {got or 'none'}")
    if venv is not None:
        want = _lock(venv)
        for name in sorted(set(want) | set(have)):
            if want.get(name) != have.get(name):
                problems.append(f"{name}: the venv has {want.get(name) or 'none'}, the image {have.get(name) or 'none'}")
    return problems


# The kernel's CFS weight of a task at each niceness, -20 to 19 (sched_prio_to_weight in
# kernel/sched/core.c): a cgroup of cpu.shares W competes with its sibling tasks as one task of weight W.
NICE_WEIGHTS = (88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916,
                9548, 7620, 6100, 4904, 3906, 3121, 2501, 1991, 1586, 1277,
                1024, 820, 655, 526, 423, 335, 272, 215, 172, 137,
                110, 87, 70, 56, 45, 36, 29, 23, 18, 15)
CPU_SHARES_RANGE = (2, 262144)  # what cgroup v1 accepts for cpu.shares


def caller_cpu_cgroup(proc_self_cgroup: str) -> str | None:
    """The cgroup v1 path of this process under the `cpu` controller, from /proc/self/cgroup."""
    for line in proc_self_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return None


def thread_weight(nice: int) -> int:
    return NICE_WEIGHTS[max(-20, min(19, nice)) + 20]


def autogroup_nice(autogroup_text: str | None) -> int | None:
    """The niceness of this process's autogroup from /proc/self/autogroup (`/autogroup-N nice K`),
    None where the kernel groups no tasks by session."""
    match = re.search(r"\bnice\s+(-?\d+)", autogroup_text or "")
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class CpuPlacement:
    """Where a worker's container sits among the host's runnable tasks, so that it gets the CPU the
    same worker would get on the host.

    On the host a worker competes from its caller's cgroup: where that is the root and the kernel
    groups tasks by session (autogroup, /proc/sys/kernel/sched_autogroup_enabled), as part of the
    caller's session, one entity of the weight of the autogroup's niceness (1024 at nice 0, whatever
    the threads and whatever the tasks' own niceness); elsewhere as its T threads, tasks of the
    weight of their niceness. An engine puts a container in a cgroup of its own under its parent
    (`/docker`, `libpod_parent`), and on cgroup v1 that whole parent, every container of the engine
    together, competes with the host as one entity of weight 1024. Where the engine makes cgroups
    itself (`cgroupfs`, cgroup v1) and runs on this host, the container goes into the caller's cgroup
    (`--cgroup-parent`) with `--cpu-shares` of what the worker would weigh there. Elsewhere (systemd's
    driver puts containers in a scope of the engine's slice; cgroup v2 allows no cgroup under one
    that holds processes; a remote engine's cgroups are not this host's) the engine's placement
    stands, and `reason` says why.
    """

    cgroup_parent: str | None  # None: the engine's own placement
    reason: str | None = None  # why the engine's placement stands
    session_nice: int | None = None  # the caller's autogroup niceness, where its session is one entity

    def options(self, threads: int, nice: int) -> list[str]:
        if self.cgroup_parent is None:
            return []
        low, high = CPU_SHARES_RANGE
        weight = (thread_weight(self.session_nice) if self.session_nice is not None
                  else threads * thread_weight(nice))
        return ["--cgroup-parent", self.cgroup_parent, "--cpu-shares", str(max(low, min(high, weight)))]

    def describe(self) -> dict:
        if self.cgroup_parent is None:
            return {"placement": "engine", "reason": self.reason}
        if self.session_nice is not None:
            rule = f"the weight of the caller's session (autogroup, nice {self.session_nice})"
        else:
            rule = "the worker's threads x the kernel's weight of the caller's niceness (1024 at nice 0)"
        return {"placement": "caller", "cgroup_parent": self.cgroup_parent, "cpu_shares": rule}


def cpu_placement(engine: ContainerEngine, proc_self: Path = Path("/proc/self"),
                  autogroup_switch: Path = Path("/proc/sys/kernel/sched_autogroup_enabled")) -> CpuPlacement:
    """How this engine's containers are placed for the CPU (CpuPlacement)."""
    info = engine.info()
    if info.api != "podman-cli" and not (info.endpoint or "").startswith("unix://"):
        return CpuPlacement(None, f"the engine at {info.endpoint} is not on this host: its cgroups are not the caller's")
    if info.api == "podman-cli" and os.geteuid() != 0:
        return CpuPlacement(None, "rootless podman: the container's cgroup is podman's to choose")
    driver, version = engine.cgroups()
    if driver != "cgroupfs":
        return CpuPlacement(None, f"the engine's cgroup driver is {driver}: the container's cgroup is a scope in the "
                            "engine's slice, weighed as one entity against the caller's")
    if version != "1":
        return CpuPlacement(None, f"cgroup v{version}: no cgroup can be made under the caller's, which holds "
                            "processes; the container is weighed as one entity against them")
    parent = caller_cpu_cgroup((proc_self / "cgroup").read_text())
    if parent is None:
        return CpuPlacement(None, "this process is in no cgroup of the cpu controller")
    session = None
    if parent == "/" and autogroup_switch.is_file() and autogroup_switch.read_text().strip() == "1":
        autogroup = proc_self / "autogroup"
        session = autogroup_nice(autogroup.read_text() if autogroup.is_file() else None)
    return CpuPlacement(parent, session_nice=session)


def worker_threads(env: dict[str, str]) -> int:
    """The threads a worker runs with: the runner's thread variable, else every CPU this process may
    use (what a framework takes by default, inside a container as on the host: no cpuset is set)."""
    value = env.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else len(os.sched_getaffinity(0))


@dataclass(frozen=True)
class ExitReading:
    """What a finished container says of itself: the worker's status and, where the engine (not the
    worker) ended it, why."""

    returncode: int  # the worker's status, or -signal
    engine_failure: str | None


@dataclass(frozen=True)
class ContainerSpec:
    """How to start one worker of an environment in its image; one instance per environment."""

    engine: ContainerEngine
    image: str
    image_id: str
    framework: str
    gpus: str | None  # the --gpus value, None for a CPU image
    mounts_ro: tuple[Path, ...]  # the repository (and a runner folder outside it, if any)
    dockerfile: str
    facts: dict = field(default_factory=dict)  # engine, digest, base image, lock check: for the record
    memory: str | None = None  # --memory (and --memory-swap: no swap beyond it), None for no limit
    cpu: CpuPlacement = field(default_factory=lambda: CpuPlacement(None, "not asked"))

    def run_options(self) -> list[str]:
        """The options every worker's container is run with (those that do not name the worker)."""
        uid_gid = f"{os.getuid()}:{os.getgid()}"
        options = ["--init", "--pull", "never", "--network", "none", "--shm-size", SHM_SIZE, "--user", uid_gid]
        if self.memory:
            options += ["--memory", self.memory, "--memory-swap", self.memory]
        if self.gpus:
            options += ["--gpus", self.gpus]
        return options

    def describe(self) -> dict:
        return {"image": self.image, "image_id": self.image_id, "dockerfile": self.dockerfile, "gpus": self.gpus,
                "container": {**self.facts, "run_options": self.run_options(), "cpu": self.cpu.describe(),
                              "stop": f"SIGTERM to the worker (--init), SIGKILL after {STOP_GRACE_S} s"}}

    def new_name(self) -> str:
        return f"dlbench-{self.framework}-{os.getpid()}-{secrets.token_hex(4)}"

    def run_command(self, name: str, python: Path, worker: Path, args: list[str], exchange: Path,
                    env: dict[str, str], shared: tuple[Path, ...] = ()) -> list[str]:
        """`run` for one worker: `python worker args...` in the image, named `name`.

        exchange: the private folder of the request and result (read-write); shared: other folders
        the worker reads or writes (read-write); both mounted at their host paths.
        """
        cmd = ["run", "--name", name, "--label", f"{LABEL}.framework={self.framework}", *self.run_options(),
               *self.cpu.options(worker_threads(env), os.nice(0)),
               # no passwd entry for an arbitrary uid: give caches (~/.cache, ~/.keras) a writable home
               "--env", "HOME=/tmp", "--env", "PYTHONDONTWRITEBYTECODE=1"]
        for key, value in sorted(env.items()):
            cmd += ["--env", f"{key}={value}"]
        mounts: list[tuple[Path, str]] = [(p, "ro") for p in self.mounts_ro]
        mounts += [(p.resolve(), "rw") for p in (exchange, *shared)]
        for path, mode in mounts:
            cmd += ["--volume", f"{path}:{path}:{mode}"]
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
        """Stop the container (SIGTERM, SIGKILL after the grace) and remove it; never raises."""
        with shielded():
            self.engine.stop(name, STOP_GRACE_S)
            self.engine.remove_container(name)

    def finish(self, name: str, returncode: int) -> ExitReading:
        """Read a container whose client has exited, then remove it: the worker's status (or -signal),
        and the engine's failure where the engine ended it or never started it.

        125 is the engine failing to create or start the container (the image gone: `--pull never`;
        no GPU runtime), 126/127 the entrypoint not executable or not found; above 128 the worker
        died of a signal (128 + its number), which the launcher words as it does for a worker on the
        host, unless the engine says it killed the container for memory (its State.OOMKilled).
        """
        state = self.engine.container_state(name)
        self.engine.remove_container(name)
        if returncode == 125:
            if not self._image_present():
                return ExitReading(returncode, f"the image {self.image} ({self.image_id}) is no longer in the engine: "
                                   f"it was removed while dlbench ran; `dlbench env create {self.framework} --env "
                                   "docker` builds it again")
            return ExitReading(returncode, f"the container engine ({self.facts.get('engine', {}).get('engine', 'docker')}) "
                               "could not start the container")
        if returncode in (126, 127):
            return ExitReading(returncode, f"the image's interpreter could not be run (exit status {returncode})")
        if state is not None and state.oom_killed:
            limit = f"its memory limit of {self.memory}" if self.memory else "the memory available to it"
            return ExitReading(-9, f"the engine killed the container for exceeding {limit} (OOMKilled)")
        if returncode > 128:
            return ExitReading(-(returncode - 128), None)
        return ExitReading(returncode, None)

    def _image_present(self) -> bool:
        try:
            return self.engine.has_image_id(self.image_id)
        except EngineError:
            return True  # the engine cannot say: do not claim the image is gone


class DockerBackend:
    name = "docker"

    def __init__(self, cache: Path, docker_dir: Path, project_root: Path, engine: ContainerEngine | None = None):
        self.cache = cache
        self.root = cache / "docker"  # build logs, build contexts (wheelhouses), the probe of each image
        self.docker_dir = docker_dir
        self.project_root = project_root.resolve()
        self.engine = engine or ContainerEngine()

    def image_for(self, runner: RunnerInfo, flavour: str) -> tuple[str, Path, Path]:
        """(tag, Dockerfile, requirements) of a runner's image; EnvironmentBuildError without a Dockerfile."""
        dockerfile = dockerfile_path(self.docker_dir, runner.name, flavour)
        if not dockerfile.is_file():
            raise EnvironmentBuildError(f"no Dockerfile for {runner.name} ({flavour}): {dockerfile} does not exist")
        requirements = runner.requirements_for(flavour)
        key = image_key(dockerfile, requirements, flavour, base_image_for(dockerfile))
        return image_tag(runner.name, flavour, key), dockerfile, requirements

    def existing(self, runner: RunnerInfo, flavour: str) -> Environment | None:
        tag, dockerfile, _ = self.image_for(runner, flavour)
        self.engine.info()  # which engine answers, if any: an unreachable one is named here, with the reason
        image_id = self.engine.image_id(tag)
        if image_id is None:
            return None
        return self._environment(runner, flavour, tag, image_id, dockerfile)

    def ensure(self, runner: RunnerInfo, flavour: str, on_progress: ProgressCallback | None = None) -> Environment:
        """The runner's image, built first when the engine does not have it; `on_progress` hears that
        it was there already, or the build's steps and the engine's output lines."""
        report = on_progress or (lambda progress: None)
        found = self._cached(runner, flavour, report)
        if found:
            return found
        tag, dockerfile, requirements = self.image_for(runner, flavour)
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f".{_file_name(tag)}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another dlbench may be building this image right now
            found = self._cached(runner, flavour, report)
            if found:
                return found
            self._build(runner, flavour, tag, dockerfile, requirements, report)
        found = self.existing(runner, flavour)
        if found is None:
            raise EnvironmentBuildError(f"the engine reported a successful build but has no image {tag}")
        return found

    def _cached(self, runner: RunnerInfo, flavour: str, report: ProgressCallback) -> Environment | None:
        found = self.existing(runner, flavour)
        if found:
            report(BuildProgress(runner.name, flavour, CACHED, where=found.key))
        return found

    def _venv_lock(self, runner: RunnerInfo, flavour: str) -> list[str] | None:
        """The packages of the venv built from the same requirements, None where there is none."""
        found = VenvBackend(self.cache).existing(runner, flavour)
        return found.packages if found and found.packages else None

    def _wheelhouse(self, runner: RunnerInfo, flavour: str, tag: str, requirements: Path, base_image: str,
                    log, progress) -> Path:
        """The build context: requirements.txt and wheelhouse/, every wheel the image installs, for the
        base image's Python (asked of the base image). Kept under the cache: a rebuild reuses it."""
        done = self.engine.call("run", "--rm", "--network", "none", "--entrypoint", "python3", base_image, "-c",
                                _PLATFORM_PROBE, timeout=300)
        line = next((x for x in reversed(done.stdout.splitlines()) if x.startswith("{")), None)
        if done.returncode != 0 or line is None:
            raise EnvironmentBuildError(
                f"the base image {base_image} did not run python3 (exit status {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-500:]}; a host without a registry sets ${BASE_IMAGE_VARIABLE} "
                "to a local image with Python 3 (README: Containers)")
        target = pip_target(json.loads(line))
        context = self.root / "contexts" / _file_name(tag)
        marker = context / ".complete.json"
        if marker.is_file() and json.loads(marker.read_text()).get("target") == target:
            return context
        shutil.rmtree(context, ignore_errors=True)
        (context / "wheelhouse").mkdir(parents=True)
        shutil.copyfile(requirements, context / "requirements.txt")
        if not any(line.split("#")[0].strip() for line in requirements.read_text().splitlines()):
            # nothing to install (pip download refuses an empty requirements file): an empty wheelhouse
            marker.write_text(json.dumps({"target": target, "base_image": base_image, "venv_lock": False}))
            return context
        cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--dest",
               str(context / "wheelhouse"), *target, "-r", str(context / "requirements.txt")]
        lock = self._venv_lock(runner, flavour)
        if lock:
            pins = [p for p in lock if _normalise(p.partition("==")[0]) not in _TOOLING]
            (context / "venv-lock.txt").write_text("\n".join(pins) + "\n")
            cmd += ["--constraint", str(context / "venv-lock.txt")]
        progress(CREATING, f"wheelhouse for {base_image}: pip download"
                 + (" (constrained to the venv's lock)" if lock else " (no venv of these requirements: resolved anew)"))
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              stdin=subprocess.DEVNULL)
        log.write(proc.stdout)
        if proc.returncode != 0:
            shutil.rmtree(context, ignore_errors=True)
            tail = "".join(proc.stdout.splitlines(keepends=True)[-15:])
            raise EnvironmentBuildError(f"downloading the wheels of the {runner.name} ({flavour}) image failed "
                                        f"(pip exit status {proc.returncode})\n{tail}")
        marker.write_text(json.dumps({"target": target, "base_image": base_image, "venv_lock": bool(lock)}))
        return context

    def _check_space(self, context: Path) -> str | None:
        """Where the engine's data root is on this host: refuse a build it has no room for; a note of
        its free space for a failed build's message."""
        root = self.engine.data_root()
        if root is None:
            return None
        wheels = sum(p.stat().st_size for p in (context / "wheelhouse").iterdir())
        free = shutil.disk_usage(root).free
        note = f"the engine's data root {root} has {free / 2**20:,.0f} MiB free"
        if free < BUILD_SPACE_FACTOR * wheels:
            raise EnvironmentBuildError(
                f"not enough disk for the image: {note}, and a build of {wheels / 2**20:,.0f} MiB of wheels needs about "
                f"{BUILD_SPACE_FACTOR * wheels / 2**20:,.0f} MiB (free space there, or `dlbench env remove FW --env "
                "docker` stale images)")
        return note

    def _build(self, runner: RunnerInfo, flavour: str, tag: str, dockerfile: Path, requirements: Path,
               report: ProgressCallback) -> None:
        log_path = self.root / f"{_file_name(tag)}.build.log"
        key = tag.rsplit("-", 1)[1]
        base_image = base_image_for(dockerfile)
        started = time.monotonic()

        def progress(step: str, note: str | None = None, output: str | None = None) -> None:
            report(BuildProgress(runner.name, flavour, step, round(time.monotonic() - started, 1), tag, note, output))

        with open(log_path, "w") as log:
            context = self._wheelhouse(runner, flavour, tag, requirements, base_image, log, progress)
            space = self._check_space(context)
            iidfile = context / ".iid"
            iidfile.unlink(missing_ok=True)
            # the base ran for the wheelhouse (pulled then, where it had to be): its id is known now,
            # and the image carries it (a base re-made under the same name is told apart)
            base_id = self.engine.image_id(base_image) or ""
            labels = {f"{LABEL}.framework": runner.name, f"{LABEL}.flavour": flavour, f"{LABEL}.key": key,
                      f"{LABEL}.base": base_image, f"{LABEL}.base-id": base_id}
            # CPU images install from the wheelhouse alone and build without network; a CUDA
            # Dockerfile installs its system packages (Python, cuDNN) from its distribution's archive
            args = self.engine.build_command(dockerfile, tag, context, labels, {"BASE_IMAGE": base_image}, iidfile,
                                             offline=flavour == "cpu")
            log.write(f"$ {' '.join(self.engine.command(*args))}\n")
            log.flush()
            progress(BUILDING_IMAGE, f"from {dockerfile} on {base_image} ({self.engine.info().engine}, "
                     f"{self.engine.info().builder} builder)")
            status = self.engine.stream(args, log, lambda line: progress(BUILDING_IMAGE, output=line),
                                        self.engine.build_env())
            log.write(f"# exit status {status} after {time.monotonic() - started:.0f} s\n")
            self.engine.prune_untagged(INSTALL_STAGE_LABEL)  # the install stage's image, whatever the outcome
        if status != 0 or not iidfile.is_file():
            progress(FAILED, f"log: {log_path}")
            tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:])
            after = self._check_space_after()
            raise EnvironmentBuildError(f"building the {runner.name} ({flavour}) image {tag} from {dockerfile} "
                                        f"failed (exit status {status})" + (f"; {after}" if after else "")
                                        + f"; log: {log_path}\n{tail}")
        image_id = iidfile.read_text().strip()
        progress(VERIFYING, "the image lists its packages; they must be the requirements' pins and the venv's lock")
        probe = self._probe(tag, image_id)
        problems = lock_differences(probe.get("packages", []), requirements.read_text(),
                                    self._venv_lock(runner, flavour))
        if problems:
            self.engine.remove_image(tag)
            raise EnvironmentBuildError(f"the {runner.name} ({flavour}) image {tag} does not hold the venv's lock "
                                        f"(removed again): " + "; ".join(problems[:10]))
        (self.root / f"{_file_name(image_id)}.build.json").write_text(json.dumps(
            {"tag": tag, "base_image": base_image, "build_s": round(time.monotonic() - started, 1),
             "venv_lock_checked": self._venv_lock(runner, flavour) is not None, "space": space}))
        progress(BUILT)

    def _check_space_after(self) -> str | None:
        try:
            root = self.engine.data_root()
        except EngineError:
            return None
        if root is None:
            return None
        free = shutil.disk_usage(root).free
        return f"the engine's data root {root} has {free / 2**20:,.0f} MiB free"

    def _probe(self, tag: str, image_id: str) -> dict:
        """Interpreter, version and package list of an image, cached per image id (images are immutable)."""
        cached = self.root / f"{_file_name(image_id)}.json"
        if cached.is_file():
            return json.loads(cached.read_text())
        done = self.engine.call("run", "--rm", "--pull", "never", "--network", "none", "--entrypoint", "python3", tag,
                                "-c", _PROBE, timeout=300)
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

    def _facts(self, image_id: str, info: EngineInfo) -> dict:
        """The record's container facts: the engine, the image's digest and size, its base image."""
        image: ImageFacts | None = next(iter(self.engine.inspect_images(image_id)), None)
        labels = image.labels if image else {}
        base = labels.get(f"{LABEL}.base")
        base_id = labels.get(f"{LABEL}.base-id") or None
        built = self.root / f"{_file_name(image_id)}.build.json"
        build = json.loads(built.read_text()) if built.is_file() else {}
        return {"engine": info.describe(), "image_digest": image.repo_digests[0] if image and image.repo_digests
                else None, "image_created": image.created if image else None,
                "image_size_bytes": image.size_bytes if image else None, "base_image": base, "base_image_id": base_id,
                "venv_lock_checked": build.get("venv_lock_checked")}

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
        spec = ContainerSpec(self.engine, tag, image_id, runner.name, gpus, tuple(mounts), shown,
                             self._facts(image_id, self.engine.info()), os.environ.get(MEMORY_VARIABLE) or None,
                             cpu_placement(self.engine))
        return Environment(runner.name, self.name, flavour, Path(probe["python"]), tag, None,
                           probe.get("packages", []), probe.get("python_version"), container=spec)

    def list(self) -> list[dict]:
        """dlbench's images in the engine: framework, flavour, key, tag, id, created, size."""
        rows = []
        for image in self.engine.labelled_images(f"{LABEL}.framework"):
            for tag in image.tags:
                parsed = parse_tag(tag)
                if parsed is None:
                    continue
                framework, flavour, key = parsed
                rows.append({"framework": framework, "flavour": flavour, "key": key, "tag": tag,
                             "id": image.id.split(":")[-1][:12], "created": image.created[:19],
                             "size": f"{image.size_bytes / 1e9:.2f} GB"})
        return sorted(rows, key=lambda r: (r["framework"], r["flavour"], r["created"]))

    def remove(self, framework: str) -> list[str]:
        removed = []
        for row in self.list():
            if row["framework"] == framework:
                self.engine.remove_image(row["tag"])
                shutil.rmtree(self.root / "contexts" / _file_name(row["tag"]), ignore_errors=True)
                removed.append(row["tag"])
        return removed


def _file_name(reference: str) -> str:
    return reference.replace("/", "_").replace(":", "_")
