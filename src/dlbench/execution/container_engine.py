"""The container engine the docker backend drives: which one answers, and its answers parsed.

Three ways to reach an engine are told apart, none configured by hand:
- the docker CLI talking to dockerd (with the buildx plugin, or without it: the classic builder),
- podman's own CLI (daemonless),
- the docker CLI talking to podman's docker-API socket (`podman system service`, DOCKER_HOST).
The client is $DLBENCH_DOCKER, else `docker` on PATH, else `podman`. `<client> version --format
'{{json .}}'` says which client it is (podman's names its fields differently: OsArch, APIVersion)
and, for the docker CLI, which engine serves it (the server's components: "Engine", or "Podman
Engine"); a docker CLI that reaches no server says so with a null Server, and the socket it was
given is then tried here, so the reason is the socket's errno (none there, permission denied,
refused), not the client's English.

Every answer is read from machine-readable output: JSON (`--format '{{json .}}'`, `inspect`),
image ids (`image ls -q --no-trunc`, `--iidfile`) and exit statuses. Where engines differ in
their JSON (podman's image ids lack the `sha256:` prefix, its tags carry the `localhost/`
registry, its `image ls` JSON is one array with other field names), the parsers here make them one.
"""

from __future__ import annotations

import errno
import grp
import json
import os
import shutil
import socket
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from .environments import EnvironmentBuildError

ENGINE_CALL_TIMEOUT_S = 120.0
SOCKET_TIMEOUT_S = 5.0
DEFAULT_DOCKER_SOCKET = "unix:///var/run/docker.sock"
BUILDERS = ("buildx", "classic", "podman")


class EngineError(EnvironmentBuildError):
    """The engine could not be reached or refused a command; str() says which and why."""


@dataclass(frozen=True)
class EngineInfo:
    """Who answers: the client (its kind and version), the engine behind it, how images are built."""

    client: str  # the executable, as called
    client_kind: str  # docker | podman
    client_version: str
    engine: str  # docker | podman
    engine_version: str
    api: str  # podman-cli (no daemon) | docker-api (a daemon's socket: dockerd's or podman's)
    builder: str  # buildx | classic (the docker CLI without buildx) | podman (buildah, inside podman)
    endpoint: str | None  # the socket the docker CLI talks to; None for podman's own CLI

    def describe(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ImageFacts:
    """One image as `image inspect` describes it, the same fields from every engine."""

    id: str  # sha256:<hex> of the image's configuration: the image's content address
    tags: tuple[str, ...]  # without a registry prefix (podman's localhost/)
    repo_digests: tuple[str, ...]  # digests a registry gave it (none for an image only ever built here)
    created: str
    size_bytes: int
    labels: dict[str, str]


@dataclass(frozen=True)
class ContainerState:
    """A finished (or running) container, from `inspect --format '{{json .State}}'`."""

    status: str
    exit_code: int
    oom_killed: bool
    pid: int


def _first_json(text: str) -> Any:
    """The first JSON value in a client's stdout (a warning line may come before it)."""
    decoder = json.JSONDecoder()
    for i, ch in enumerate(text):
        if ch in "[{":
            try:
                return decoder.raw_decode(text[i:])[0]
            except json.JSONDecodeError:
                continue
    return None


def parse_version(stdout: str) -> dict:
    """{client_kind, client_version, engine, engine_version, server} from `version --format '{{json .}}'`.
    `server` is False where a docker CLI reached no engine. ValueError where it is no such output."""
    data = _first_json(stdout)
    if not isinstance(data, dict) or not isinstance(data.get("Client"), dict):
        raise ValueError("no JSON object with a Client in the client's `version` output")
    client = data["Client"]
    if "OsArch" in client and "APIVersion" in client:  # podman's own CLI (docker's says Os/Arch, ApiVersion)
        return {"client_kind": "podman", "client_version": str(client.get("Version", "")), "engine": "podman",
                "engine_version": str((data.get("Server") or client).get("Version", "")), "server": True}
    server = data.get("Server")
    if not isinstance(server, dict):
        return {"client_kind": "docker", "client_version": str(client.get("Version", "")), "engine": None,
                "engine_version": None, "server": False}
    names = {c.get("Name") for c in server.get("Components") or [] if isinstance(c, dict)}
    return {"client_kind": "docker", "client_version": str(client.get("Version", "")),
            "engine": "podman" if "Podman Engine" in names else "docker",
            "engine_version": str(server.get("Version", "")), "server": True}


def normalise_id(image_id: str) -> str:
    image_id = image_id.strip()
    return image_id if ":" in image_id else f"sha256:{image_id}"


def strip_registry(reference: str) -> str:
    """`localhost/dlbench/torch:cpu-k` -> `dlbench/torch:cpu-k`: a first component with a dot, a
    port or named localhost is a registry (the docker reference grammar)."""
    first, sep, rest = reference.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return rest
    return reference


def parse_image_ids(stdout: str) -> list[str]:
    """`image ls -q --no-trunc`: one id a line (an image with several tags comes once per tag)."""
    seen: dict[str, None] = {}
    for line in stdout.splitlines():
        if line.strip():
            seen[normalise_id(line)] = None
    return list(seen)


def parse_images(stdout: str) -> list[ImageFacts]:
    """`image inspect ID...`: a JSON array, one object per image (docker's and podman's fields)."""
    data = _first_json(stdout)
    if not isinstance(data, list):
        raise ValueError("`image inspect` did not print a JSON array")
    images = []
    for item in data:
        labels = item.get("Labels") or (item.get("Config") or {}).get("Labels") or {}
        images.append(ImageFacts(
            id=normalise_id(item["Id"]), tags=tuple(strip_registry(t) for t in item.get("RepoTags") or []),
            repo_digests=tuple(item.get("RepoDigests") or []), created=str(item.get("Created", "")),
            size_bytes=int(item.get("Size") or 0), labels={str(k): str(v) for k, v in labels.items()}))
    return images


def parse_state(stdout: str) -> ContainerState:
    data = _first_json(stdout)
    if not isinstance(data, dict) or "ExitCode" not in data:
        raise ValueError("no container State object in the output")
    return ContainerState(str(data.get("Status", "")), int(data["ExitCode"]), bool(data.get("OOMKilled")),
                          int(data.get("Pid") or 0))


def socket_problem(endpoint: str) -> str | None:
    """Why a unix socket endpoint cannot be used, from connecting to it here; None where it can
    (or where it is no unix socket: tcp:// and ssh:// are the client's business)."""
    if not endpoint.startswith("unix://"):
        return None
    path = endpoint[len("unix://"):]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(SOCKET_TIMEOUT_S)
        try:
            s.connect(path)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return f"there is no socket {path}: no engine is running there (start dockerd, or `podman system service`)"
            if e.errno in (errno.EACCES, errno.EPERM):
                try:
                    group = grp.getgrgid(os.stat(path).st_gid).gr_name
                except (KeyError, OSError):
                    group = "its group"
                return (f"permission denied on {path}: this user may not use the engine (add it to the group "
                        f"{group!r}, or run a rootless engine)")
            if e.errno == errno.ECONNREFUSED:
                return f"nothing answers on {path} (connection refused): the engine has stopped"
            return f"cannot connect to {path}: {errno.errorcode.get(e.errno or 0, e.errno)} ({e.strerror})"
    return None


def default_client() -> str:
    """$DLBENCH_DOCKER, else `docker` on PATH, else `podman` on PATH, else `docker` (to fail by name)."""
    chosen = os.environ.get("DLBENCH_DOCKER")
    if chosen:
        return chosen
    for name in ("docker", "podman"):
        if shutil.which(name):
            return name
    return "docker"


class ContainerEngine:
    """The engine's client, called as a subprocess: the one place the docker backend touches it."""

    def __init__(self, executable: str | None = None):
        self.executable = executable or default_client()
        self._info: EngineInfo | None = None

    def command(self, *args: str) -> list[str]:
        return [self.executable, *args]

    def build_env(self) -> dict[str, str] | None:
        """The client's environment for a build: the docker CLI's classic builder is asked for by
        DOCKER_BUILDKIT=0 (a CLI of 23 or newer without buildx otherwise fails on BuildKit)."""
        if self.info().builder == "classic":
            return {**os.environ, "DOCKER_BUILDKIT": "0"}
        return None

    def call(self, *args: str, timeout: float = ENGINE_CALL_TIMEOUT_S, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(self.command(*args), capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL, env=env)
        except FileNotFoundError:
            raise EngineError(
                f"no container engine client {self.executable!r} found: install Docker or Podman, or point "
                "$DLBENCH_DOCKER at the client") from None
        except PermissionError:
            raise EngineError(f"the container engine client {self.executable!r} is not executable") from None
        except subprocess.TimeoutExpired:
            raise EngineError(f"`{self.executable} {' '.join(args[:2])}` did not answer within {timeout:g} s; "
                              "is the engine running?") from None

    def _failed(self, what: str, done: subprocess.CompletedProcess) -> EngineError:
        said = (done.stderr or done.stdout).strip().splitlines()
        return EngineError(f"`{self.executable} {what}` failed (exit status {done.returncode})"
                           + (f": {said[-1]}" if said else ""))

    def info(self) -> EngineInfo:
        """Which client and engine answer (detected once per engine object)."""
        if self._info is None:
            self._info = self._detect()
        return self._info

    def _endpoint(self) -> str:
        host = os.environ.get("DOCKER_HOST")
        if host:
            return host
        done = self.call("context", "inspect", "--format", "{{json .Endpoints.docker.Host}}", timeout=30)
        value = _first_json(done.stdout) if done.returncode == 0 else None
        if value is None and done.returncode == 0:
            text = done.stdout.strip().strip('"')
            value = text or None
        return value if isinstance(value, str) and value else DEFAULT_DOCKER_SOCKET

    def _detect(self) -> EngineInfo:
        done = self.call("version", "--format", "{{json .}}", timeout=60)
        try:
            found = parse_version(done.stdout)
        except ValueError:
            raise self._failed("version", done) from None
        if found["client_kind"] == "podman":
            if done.returncode != 0:
                raise self._failed("version", done)
            return EngineInfo(self.executable, "podman", found["client_version"], "podman", found["engine_version"],
                              "podman-cli", "podman", None)
        endpoint = self._endpoint()
        if not found["server"]:
            problem = socket_problem(endpoint) or (self._failed("version", done).args[0])
            raise EngineError(f"the docker client {self.executable!r} reaches no engine at {endpoint}: {problem}")
        builder = "classic"
        if found["engine"] == "docker" and self.call("buildx", "version", timeout=30).returncode == 0:
            builder = "buildx"  # podman's docker API has no BuildKit: its builds take the classic endpoint
        return EngineInfo(self.executable, "docker", found["client_version"], found["engine"],
                          found["engine_version"], "docker-api", builder, endpoint)

    def build_command(self, dockerfile: Path, tag: str, context: Path, labels: dict[str, str],
                      build_args: dict[str, str], iidfile: Path, offline: bool) -> list[str]:
        """The build's arguments for this engine's builder; the image id comes back in `iidfile`."""
        builder = self.info().builder
        args = ["buildx", "build", "--load", "--progress", "plain"] if builder == "buildx" else ["build"]
        args += ["--file", str(dockerfile), "--tag", tag, "--iidfile", str(iidfile)]
        for key, value in labels.items():
            args += ["--label", f"{key}={value}"]
        for key, value in build_args.items():
            args += ["--build-arg", f"{key}={value}"]
        if offline:
            args += ["--network", "none"]
        return [*args, str(context)]

    def stream(self, args: list[str], log, on_line: Callable[[str], None] | None,
               env: dict[str, str] | None = None) -> int:
        """Run a long engine command (a build), copying its output to `log` and each line to `on_line`."""
        try:
            proc = subprocess.Popen(self.command(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, stdin=subprocess.DEVNULL, env=env)
        except FileNotFoundError:
            raise EngineError(f"no container engine client {self.executable!r} found: install Docker or Podman, "
                              "or point $DLBENCH_DOCKER at the client") from None
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

    def image_id(self, reference: str) -> str | None:
        """The id of the image `reference` names (a tag, or an id), None when the engine has none."""
        done = self.call("image", "ls", "--quiet", "--no-trunc", "--filter", f"reference={reference}")
        if done.returncode != 0:
            raise self._failed(f"image ls --filter reference={reference}", done)
        ids = parse_image_ids(done.stdout)
        return ids[0] if ids else None

    def has_image_id(self, image_id: str) -> bool:
        done = self.call("image", "ls", "--quiet", "--no-trunc")
        if done.returncode != 0:
            raise self._failed("image ls", done)
        return normalise_id(image_id) in parse_image_ids(done.stdout)

    def inspect_images(self, *references: str) -> list[ImageFacts]:
        if not references:
            return []
        done = self.call("image", "inspect", *references)
        if done.returncode != 0:
            raise self._failed("image inspect", done)
        try:
            return parse_images(done.stdout)
        except (ValueError, KeyError, TypeError) as e:
            raise EngineError(f"`{self.executable} image inspect` answered what dlbench cannot read: {e}") from None

    def labelled_images(self, label: str) -> list[ImageFacts]:
        """Every image carrying `label` (any value)."""
        done = self.call("image", "ls", "--quiet", "--no-trunc", "--filter", f"label={label}")
        if done.returncode != 0:
            raise self._failed("image ls", done)
        return self.inspect_images(*parse_image_ids(done.stdout))

    def remove_image(self, tag: str) -> None:
        done = self.call("image", "rm", tag)
        if done.returncode != 0 and self.image_id(tag) is not None:
            raise self._failed(f"image rm {tag}", done)

    def prune_untagged(self, label: str) -> None:
        """Remove the untagged images carrying `label` (a build's intermediate stages); never raises."""
        try:
            self.call("image", "prune", "--force", "--filter", f"label={label}", timeout=300)
        except EngineError:
            pass

    def data_root(self) -> Path | None:
        """Where the engine keeps its images (None where it does not say, or it is not on this host)."""
        template = "{{json .Store.GraphRoot}}" if self.info().api == "podman-cli" else "{{json .DockerRootDir}}"
        done = self.call("info", "--format", template, timeout=60)
        value = _first_json(done.stdout) if done.returncode == 0 else None
        if value is None and done.returncode == 0:
            value = done.stdout.strip().strip('"') or None
        path = Path(value) if isinstance(value, str) and value else None
        return path if path is not None and path.is_dir() else None

    def cgroups(self) -> tuple[str, str]:
        """(driver, version) of the engine's cgroups: `cgroupfs` or `systemd`, `1` or `2`, from its `info`
        (podman's own CLI names them Host.CgroupManager and Host.CgroupsVersion, `v1`/`v2`)."""
        fields = (("{{json .Host.CgroupManager}}", "{{json .Host.CgroupsVersion}}") if self.info().api == "podman-cli"
                  else ("{{json .CgroupDriver}}", "{{json .CgroupVersion}}"))
        found = []
        for template in fields:
            done = self.call("info", "--format", template, timeout=60)
            value = _first_json(done.stdout) if done.returncode == 0 else None
            if value is None and done.returncode == 0:
                value = done.stdout.strip().strip('"') or None
            if not isinstance(value, str) or not value:
                raise self._failed(f"info --format {template}", done)
            found.append(value)
        return found[0], found[1].removeprefix("v")

    def container_state(self, name: str) -> ContainerState | None:
        """The named container's state, None when the engine has no such container."""
        done = self.call("container", "inspect", "--format", "{{json .State}}", name, timeout=30)
        if done.returncode != 0:
            return None
        try:
            return parse_state(done.stdout)
        except ValueError:
            return None

    def container_pid(self, name: str) -> int | None:
        """The host pid of the container's main process, None while it has none."""
        state = self.container_state(name)
        return state.pid if state is not None and state.pid > 0 else None

    def stop(self, name: str, grace_s: int) -> None:
        """SIGTERM the container, SIGKILL after the grace period; `kill` if stop itself fails.
        Errors are swallowed: the container may already be gone, and stopping must never raise."""
        try:
            done = self.call("stop", "--time", str(grace_s), name, timeout=grace_s + 30)
            if done.returncode != 0 and self.container_state(name) is not None:
                self.call("kill", name, timeout=30)
        except EngineError:
            pass

    def remove_container(self, name: str) -> None:
        """Remove a finished container (its state has been read); never raises."""
        try:
            self.call("container", "rm", "--force", name, timeout=60)
        except EngineError:
            pass
