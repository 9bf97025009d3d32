"""The runner folders under runners/: read from their runner.toml, never imported."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tomllib

from ..definitions.loader import DefinitionError
from ..definitions.suite import COMPILE_MODES
from ..performance.communication import SCHEDULES
from ..performance.model import EPILOGUES, STEPS, FrameworkFacts

FLAVOURS = ("cpu", "cuda")


LAUNCH_STYLES = ("torchrun", "ranks", "ps-lite")  # launch_styles.STYLES; listed here so the registry imports no launcher


@dataclass(frozen=True)
class DistributedLaunch:
    """runner.toml's [distributed]: the runner takes part in the distributed and comm suites."""

    worker: Path  # the rank's entry point (runners/common/distributed_harness.py)
    launch: str  # one of LAUNCH_STYLES


@dataclass(frozen=True)
class RunnerInfo:
    name: str
    display_name: str
    import_name: str
    folder: Path
    worker: Path
    requirements: dict[str, Path]  # flavour -> pinned requirements file
    distributed: DistributedLaunch | None = None  # None: not ported to the distributed suites yet
    model: FrameworkFacts = FrameworkFacts()  # [model]: what the performance model assumes of it
    default_compile: str = "eager"  # [execution] compile: what runs when a benchmark asks for "default"

    def compile_mode(self, asked: str) -> str:
        """The compile mode a benchmark's `compile` means on this runner ("default": its own)."""
        return self.default_compile if asked == "default" else asked

    def requirements_for(self, flavour: str) -> Path:
        return self.requirements[flavour]


def _load(folder: Path) -> RunnerInfo:
    path = folder / "runner.toml"
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise DefinitionError(path, "", f"invalid TOML: {e}") from None
    for key in ("name", "import_name", "worker", "requirements"):
        if key not in data:
            raise DefinitionError(path, key, "missing")
    if data["name"] != folder.name:
        raise DefinitionError(path, "name", f"must equal the folder name {folder.name!r}")
    reqs = {}
    for flavour in FLAVOURS:
        rel = data["requirements"].get(flavour)
        if rel is None:
            raise DefinitionError(path, f"requirements.{flavour}", "missing")
        if not (folder / rel).is_file():
            raise DefinitionError(path, f"requirements.{flavour}", f"file {rel} does not exist")
        reqs[flavour] = folder / rel
    worker = folder / data["worker"]
    if not worker.is_file():
        raise DefinitionError(path, "worker", f"file {data['worker']} does not exist")
    return RunnerInfo(data["name"], data.get("display_name", data["name"]), data["import_name"],
                      folder, worker, reqs, _distributed_launch(path, folder, data.get("distributed")),
                      _model(path, data.get("model")), _default_compile(path, data.get("execution")))


def _default_compile(path: Path, section) -> str:
    """[execution] compile: the mode the runner runs when a benchmark does not say (eager | compiled)."""
    if section is None:
        return "eager"
    if not isinstance(section, dict):
        raise DefinitionError(path, "execution", "must be a table")
    unknown = sorted(set(section) - {"compile"})
    if unknown:
        raise DefinitionError(path, f"execution.{unknown[0]}", "unknown field; expected compile")
    value = section.get("compile", "eager")
    if value not in COMPILE_MODES:
        raise DefinitionError(path, "execution.compile", f"{value!r} is not one of {', '.join(COMPILE_MODES)}")
    return value


MODEL_FIELDS = {"step": STEPS, "schedule": SCHEDULES, "epilogues": EPILOGUES}


def _model(path: Path, section) -> FrameworkFacts:
    """[model]: how the runner executes a training step and how its engine sends gradients, as the
    performance model needs them (performance/model.py: FrameworkFacts); a field left out takes
    FrameworkFacts' default."""
    if section is None:
        return FrameworkFacts()
    if not isinstance(section, dict):
        raise DefinitionError(path, "model", "must be a table")
    unknown = sorted(set(section) - set(MODEL_FIELDS))
    if unknown:
        raise DefinitionError(path, f"model.{unknown[0]}", f"unknown field; expected {', '.join(MODEL_FIELDS)}")
    for key, choices in MODEL_FIELDS.items():
        if key in section and section[key] not in choices:
            raise DefinitionError(path, f"model.{key}", f"{section[key]!r} is not one of {', '.join(choices)}")
    return FrameworkFacts(**section)


def _distributed_launch(path: Path, folder: Path, section) -> DistributedLaunch | None:
    if section is None:
        return None
    if not isinstance(section, dict):
        raise DefinitionError(path, "distributed", "must be a table")
    unknown = sorted(set(section) - {"worker", "launch"})
    if unknown:
        raise DefinitionError(path, f"distributed.{unknown[0]}", "unknown field")
    for key in ("worker", "launch"):
        if key not in section:
            raise DefinitionError(path, f"distributed.{key}", "missing")
    if section["launch"] not in LAUNCH_STYLES:
        raise DefinitionError(path, "distributed.launch",
                              f"unknown launch style {section['launch']!r}; expected one of {', '.join(LAUNCH_STYLES)}")
    worker = folder / section["worker"]
    if not worker.is_file():
        raise DefinitionError(path, "distributed.worker", f"file {section['worker']} does not exist")
    return DistributedLaunch(worker, section["launch"])


class RunnerRegistry:
    def __init__(self, root: Path):
        self.root = root

    def names(self) -> list[str]:
        return sorted(p.parent.name for p in self.root.glob("*/runner.toml"))

    def get(self, name: str) -> RunnerInfo:
        return _load(self.root / name)

    def model_facts(self) -> dict[str, FrameworkFacts]:
        """Every runner's [model] facts, by name: what the performance model's callers hand it."""
        return {name: self.get(name).model for name in self.names()}

