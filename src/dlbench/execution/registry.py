"""The runner folders under runners/: read from their runner.toml, never imported.

runner.toml is validated once, here, against `RunnerToml` (pydantic): a malformed file is one
DefinitionError naming the file, the field and what is wrong with it. Its [capabilities] say which
values of each axis the runner can run, so that the controller refuses the rest before it starts a
worker (a run it cannot do is recorded as skipped, with the reason).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..axes import Axis, Compile, Mode, Precision, Scenario
from ..axes import CompressionMethod  # not an Axis of [capabilities]: [distributed]'s
from ..definitions.loader import DefinitionError
from ..performance.communication import SCHEDULES
from ..performance.model import EPILOGUES, STEPS, FrameworkFacts

FLAVOURS = ("cpu", "cuda")
LAUNCH_STYLES = ("torchrun", "ranks", "ps-lite")  # launch_styles.STYLES; listed here so the registry imports no launcher


# ------------------------------------------------------------------ runner.toml, as a schema


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RequirementsSection(_Section):
    """Pinned requirements per device flavour, relative to the runner's folder."""

    cpu: str
    cuda: str


def _listed_once(values: tuple) -> tuple:
    twice = sorted({v.value for v in values if values.count(v) > 1})
    if twice:
        raise ValueError(f"lists {', '.join(twice)} twice")
    return values


def _timed_precisions(values: tuple[Precision, ...]) -> tuple[Precision, ...]:
    """Precisions a timed run may ask for: float64 is the equivalence check's, which every runner
    takes for `dlbench check` and none lists."""
    check_only = [p.value for p in values if p.check_only]
    if check_only:
        raise ValueError(f"{', '.join(check_only)} is the equivalence check's precision, not a run's")
    return _listed_once(values)


class DistributedSection(_Section):
    """The runner takes part in the distributed and comm suites: its rank's entry point, how dlbench
    starts a job's ranks, the precisions its data-parallel step trains in, the gradient compression
    methods it exchanges by (a parameter, as powersgd's rank, is the request's: any value runs), and
    for a method it leaves out, why (`compression_refused`: the skipped run's reason says it)."""

    worker: str
    launch: Literal[LAUNCH_STYLES]
    precisions: Annotated[tuple[Precision, ...], Field(min_length=1)] = (Precision.FP32,)
    compressions: Annotated[tuple[CompressionMethod, ...], Field(min_length=1)] = (CompressionMethod.NONE,)
    compression_refused: dict[CompressionMethod, str] = {}

    @field_validator("precisions")
    @classmethod
    def _timed(cls, value: tuple[Precision, ...]) -> tuple[Precision, ...]:
        return _timed_precisions(value)

    @field_validator("compressions")
    @classmethod
    def _once(cls, value: tuple) -> tuple:
        return _listed_once(value)

    @model_validator(mode="after")
    def _refused_not_run(self):
        both = [m.value for m in self.compression_refused if m in self.compressions]
        if both:
            raise ValueError(f"compression_refused gives a reason for {', '.join(both)}, which compressions lists")
        return self


class ModelSection(_Section):
    """What the performance model assumes of the runner (performance/model.py: FrameworkFacts)."""

    step: Literal[STEPS] = FrameworkFacts().step
    schedule: Literal[SCHEDULES] = FrameworkFacts().schedule
    epilogues: Literal[EPILOGUES] = FrameworkFacts().epilogues


class ExecutionSection(_Section):
    """The compile mode a benchmark that does not name one runs in (`--compile default`)."""

    compile: Compile = Compile.EAGER


class CapabilitiesSection(_Section):
    """The values of each axis the runner's single-process worker can run. A value it does not
    list is refused by the controller before a worker starts; one it lists may still be skipped
    by the worker where this machine cannot run it (tf32 off an NVIDIA GPU), saying why."""

    precisions: Annotated[tuple[Precision, ...], Field(min_length=1)]
    compile: Annotated[tuple[Compile, ...], Field(min_length=1)]
    modes: Annotated[tuple[Mode, ...], Field(min_length=1)]
    scenarios: tuple[Scenario, ...] = ()

    @field_validator("precisions")
    @classmethod
    def _timed(cls, value: tuple[Precision, ...]) -> tuple[Precision, ...]:
        return _timed_precisions(value)

    @field_validator("compile", "modes", "scenarios")
    @classmethod
    def _once(cls, value: tuple) -> tuple:
        return _listed_once(value)


class RunnerToml(_Section):
    """A runner folder's runner.toml."""

    name: str
    display_name: str | None = None
    import_name: str  # checked in a child process for the `current` environment backend
    worker: str
    requirements: RequirementsSection
    capabilities: CapabilitiesSection
    distributed: DistributedSection | None = None  # None: not ported to the distributed suites
    model: ModelSection = ModelSection()
    execution: ExecutionSection = ExecutionSection()


# the schema's choices are the tables the code acts on (built from them; a test checks they stay so)
SCHEMA_CHOICES = {"model.step": STEPS, "model.schedule": SCHEDULES, "model.epilogues": EPILOGUES,
                  "distributed.launch": LAUNCH_STYLES}


# ------------------------------------------------------------------ what the controller reads


@dataclass(frozen=True)
class Capabilities:
    """runner.toml's [capabilities], as sets of the axes' values."""

    precisions: frozenset[Precision]
    compiles: frozenset[Compile]
    modes: frozenset[Mode]
    scenarios: frozenset[Scenario]

    def listed(self, axis: type[Axis]) -> frozenset:
        return {Precision: self.precisions, Compile: self.compiles, Mode: self.modes, Scenario: self.scenarios}[axis]

    def supports(self, value: Axis) -> bool:
        """Whether the runner lists this value of its axis."""
        return value in self.listed(type(value))

    def refusal(self, runner: str, value: Axis) -> str | None:
        """None where the runner runs `value`, else the reason it does not, naming what it runs."""
        if self.supports(value):
            return None
        axis = type(value)
        ordered = [v.value for v in axis if v in self.listed(axis)]
        return (f"{runner} runner: {axis.axis_name()} {value.value} is not one it runs "
                f"(runner.toml [capabilities]: {', '.join(ordered) or 'none'})")


@dataclass(frozen=True)
class DistributedLaunch:
    """runner.toml's [distributed]: the runner takes part in the distributed and comm suites."""

    worker: Path  # the rank's entry point (runners/common/distributed_harness.py)
    launch: str  # one of LAUNCH_STYLES
    precisions: frozenset[Precision] = frozenset({Precision.FP32})  # what its data-parallel step trains in
    compressions: frozenset[CompressionMethod] = frozenset({CompressionMethod.NONE})  # how it exchanges gradients
    compression_refused: tuple[tuple[CompressionMethod, str], ...] = ()  # (method left out, why)

    def compression_refusal(self, method: CompressionMethod) -> str | None:
        """runner.toml's reason for leaving out `method`, None where it gives none."""
        return dict(self.compression_refused).get(method)


@dataclass(frozen=True)
class RunnerInfo:
    name: str
    display_name: str
    import_name: str
    folder: Path
    worker: Path
    requirements: dict[str, Path]  # flavour -> pinned requirements file
    capabilities: Capabilities
    distributed: DistributedLaunch | None = None  # None: not ported to the distributed suites yet
    model: FrameworkFacts = FrameworkFacts()  # [model]: what the performance model assumes of it
    default_compile: str = "eager"  # [execution] compile: what runs when a benchmark asks for "default"

    def compile_mode(self, asked: str) -> str:
        """The compile mode a benchmark's `compile` means on this runner ("default": its own)."""
        return self.default_compile if asked == "default" else asked

    def requirements_for(self, flavour: str) -> Path:
        return self.requirements[flavour]


def _message(error: dict[str, Any]) -> str:
    """One pydantic error in the words the other definition files use."""
    kind, ctx = error["type"], error.get("ctx", {})
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "missing"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return "must be a table"
    if kind in ("literal_error", "enum"):
        expected = ctx.get("expected", "").replace("'", "").replace(" or ", ", ")
        return f"{error['input']!r} is not one of {expected}"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return error["msg"]


def _field(loc: tuple) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else (f".{part}" if i else str(part))
                   for i, part in enumerate(loc))


def parse_runner_toml(path: Path) -> RunnerToml:
    """runner.toml validated, or one DefinitionError naming the file and the (first) field."""
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise DefinitionError(path, "", f"invalid TOML: {e}") from None
    try:
        return RunnerToml.model_validate(data)
    except ValidationError as e:
        errors = e.errors()
        first = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise DefinitionError(path, _field(first["loc"]), _message(first) + more) from None


def _existing(path: Path, folder: Path, field: str, rel: str) -> Path:
    if not (folder / rel).is_file():
        raise DefinitionError(path, field, f"file {rel} does not exist")
    return folder / rel


def _load(folder: Path) -> RunnerInfo:
    path = folder / "runner.toml"
    toml = parse_runner_toml(path)
    if toml.name != folder.name:
        raise DefinitionError(path, "name", f"must equal the folder name {folder.name!r}")
    requirements = {flavour: _existing(path, folder, f"requirements.{flavour}", getattr(toml.requirements, flavour))
                    for flavour in FLAVOURS}
    worker = _existing(path, folder, "worker", toml.worker)
    distributed = None
    if toml.distributed is not None:
        distributed = DistributedLaunch(_existing(path, folder, "distributed.worker", toml.distributed.worker),
                                        toml.distributed.launch, frozenset(toml.distributed.precisions),
                                        frozenset(toml.distributed.compressions),
                                        tuple(toml.distributed.compression_refused.items()))
    caps = toml.capabilities
    capabilities = Capabilities(frozenset(caps.precisions), frozenset(caps.compile), frozenset(caps.modes),
                                frozenset(caps.scenarios))
    if toml.execution.compile not in capabilities.compiles:
        raise DefinitionError(path, "execution.compile", f"{toml.execution.compile.value!r} is not in "
                              "[capabilities] compile: the runner's default must be one it runs")
    return RunnerInfo(toml.name, toml.display_name or toml.name, toml.import_name, folder, worker, requirements,
                      capabilities, distributed, FrameworkFacts(**toml.model.model_dump()),
                      toml.execution.compile.value)


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
