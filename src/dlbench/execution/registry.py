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
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from ..axes import REQUEST_AXES, Axis, Compile, RequestAxis
from ..axes import CompressionMethod, Parallelism  # [distributed] compression_refused, parallelism_refused
from ..definitions.distributed import Collective
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


class ModelSection(_Section):
    """What the performance model assumes of the runner (performance/model.py: FrameworkFacts)."""

    step: Literal[STEPS] = FrameworkFacts().step
    schedule: Literal[SCHEDULES] = FrameworkFacts().schedule
    epilogues: Literal[EPILOGUES] = FrameworkFacts().epilogues


class ExecutionSection(_Section):
    """The compile mode a benchmark that does not name one runs in (`--compile default`)."""

    compile: Compile = Compile.EAGER


def _capability_field(spec: RequestAxis, unlisted: tuple | None) -> tuple:
    """runner.toml's field listing one axis's values: each listed once, at least one unless the axis
    may be left out of a run (a runner may run no LoadGen scenario), defaulting to `unlisted` where
    the axis has it (what every runner ran before it was listed)."""
    values = tuple[spec.axis, ...]
    if not spec.optional:
        values = Annotated[values, Field(min_length=1)]
    return (values, ... if unlisted is None else tuple(spec.axis(v) for v in unlisted))


def _runs_each_once(value: tuple[Axis, ...]) -> tuple[Axis, ...]:
    """Values a timed run may ask for (Axis.runs), each listed once."""
    if value:
        axis = type(value[0])
        not_run = [v.value for v in value if v not in axis.runs()]
        if not_run:
            raise ValueError(axis.not_a_run(not_run))
    return _listed_once(value)


# The values of each axis the runner's single-process worker can run (REQUEST_AXES' capabilities).
# A value it does not list is refused by the controller before a worker starts; one it lists may
# still be skipped by the worker where this machine cannot run it (tf32 off an NVIDIA GPU), saying why.
CAPABILITY_AXES = {spec.capability: spec for spec in REQUEST_AXES.values() if spec.capability is not None}
CapabilitiesSection = create_model(
    "CapabilitiesSection", __base__=_Section, __doc__="runner.toml's [capabilities]: the values of each axis "
    "the runner's single-process worker can run.",
    __validators__={"_runs_once": field_validator(*CAPABILITY_AXES)(_runs_each_once)},
    **{name: _capability_field(spec, spec.unlisted) for name, spec in CAPABILITY_AXES.items()})


class _DistributedLaunchSection(_Section):
    worker: str
    launch: Literal[LAUNCH_STYLES]
    # collectives the engine does not offer at all, each with why: the comm suite records them as
    # skipped, no rank asked (one the engine offers on some devices only is the rank's
    # `collective_unavailable`)
    collectives_not_offered: dict[Collective, Annotated[str, Field(min_length=1)]] = {}
    # why the data-parallel step leaves out a gradient compression method (the skipped run says it)
    compression_refused: dict[CompressionMethod, Annotated[str, Field(min_length=1)]] = {}
    # why the training step leaves out a parallelism (expert: the skipped run says it)
    parallelism_refused: dict[Parallelism, Annotated[str, Field(min_length=1)]] = {}
    # why its ranks cannot train a convergence task (the convergence suite with --workers): the
    # skipped record says it; absent: they can (the rank's prepare_distributed_convergence)
    convergence_not_offered: Annotated[str, Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _refused_not_run(self):
        for refused, listed in (("compression_refused", "compressions"), ("parallelism_refused", "parallelisms")):
            both = [m.value for m in getattr(self, refused) if m in getattr(self, listed, ())]
            if both:
                raise ValueError(f"{refused} gives a reason for {', '.join(both)}, which {listed} lists")
        return self


# The same for the runner's data-parallel step (REQUEST_AXES' distributed capabilities).
DISTRIBUTED_AXES = {spec.distributed_capability: spec for spec in REQUEST_AXES.values()
                    if spec.distributed_capability is not None}
DistributedSection = create_model(
    "DistributedSection", __base__=_DistributedLaunchSection, __doc__="runner.toml's [distributed]: the runner "
    "takes part in the distributed and comm suites: its rank's entry point, how dlbench starts a job's ranks, and "
    "the values of each axis its data-parallel step trains in.",
    __validators__={"_runs_once": field_validator(*DISTRIBUTED_AXES)(_runs_each_once)},
    **{name: _capability_field(spec, spec.distributed_unlisted) for name, spec in DISTRIBUTED_AXES.items()})


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
    """runner.toml's [capabilities] (or [distributed]'s), as the set of values the runner lists per axis."""

    # (axis, its runner.toml field, the values listed) per axis of the section: a tuple, so that a
    # runner stays hashable
    values: tuple[tuple[type[Axis], str, frozenset[Axis]], ...]
    # why a value is refused, in the words of the section that lists them
    wording: str = "{runner} runner: {axis} {value} is not one it runs (runner.toml [capabilities]: {listed})"

    @classmethod
    def of(cls, listed: dict[type[Axis], frozenset[Axis]]) -> "Capabilities":
        """[capabilities]' of these values per axis."""
        fields = {spec.axis: name for name, spec in CAPABILITY_AXES.items()}
        return cls(tuple((axis, fields[axis], values) for axis, values in listed.items()))

    @classmethod
    def of_section(cls, section) -> "Capabilities":
        return cls(tuple((spec.axis, name, frozenset(getattr(section, name))) for name, spec in CAPABILITY_AXES.items()))

    @classmethod
    def of_distributed(cls, section) -> "Capabilities":
        """[distributed]'s: what the data-parallel step trains in."""
        return cls(tuple((spec.axis, name, frozenset(getattr(section, name))) for name, spec in DISTRIBUTED_AXES.items()),
                   DATA_PARALLEL_WORDING)

    def _entry(self, axis: type[Axis]) -> tuple:
        return next(entry for entry in self.values if entry[0] is axis)

    def listed(self, axis: type[Axis]) -> frozenset:
        return self._entry(axis)[2]

    def supports(self, value: Axis) -> bool:
        """Whether the runner lists this value of its axis."""
        return value in self.listed(type(value))

    def refusal(self, runner: str, value: Axis) -> str | None:
        """None where the runner runs `value`, else the reason it does not, naming what it runs."""
        if self.supports(value):
            return None
        axis = type(value)
        _, field, listed = self._entry(axis)
        ordered = [v.value for v in axis if v in listed]
        return self.wording.format(runner=runner, axis=axis.axis_name(), value=value.value,
                                   listed=", ".join(ordered) or "none", field=field)


DATA_PARALLEL_WORDING = ("{runner} data-parallel runner: {axis} {value} is not one it trains in "
                         "(runner.toml [distributed] {field}: {listed})")


@dataclass(frozen=True)
class DistributedLaunch:
    """runner.toml's [distributed]: the runner takes part in the distributed and comm suites."""

    worker: Path  # the rank's entry point (runners/common/distributed_harness.py)
    launch: str  # one of LAUNCH_STYLES
    capabilities: Capabilities  # what its data-parallel step trains in, per axis ([distributed])
    # collective -> why the engine offers none (runner.toml [distributed.collectives_not_offered])
    collectives_not_offered: tuple[tuple[str, str], ...] = ()
    compression_refused: tuple[tuple[CompressionMethod, str], ...] = ()  # (method left out, why)
    parallelism_refused: tuple[tuple[Parallelism, str], ...] = ()  # (parallelism left out, why)
    convergence_not_offered: str | None = None  # why its ranks train no convergence task; None: they do

    def not_offered(self, collective: str) -> str | None:
        return dict(self.collectives_not_offered).get(collective)

    def refusal_reason(self, value) -> str | None:
        """runner.toml's reason for leaving out a compression method or a parallelism, None where
        it gives none."""
        return dict(self.compression_refused + self.parallelism_refused).get(value)


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
    loc = tuple(part for part in loc if part != "[key]")  # a table's key that is wrong: the key's own name
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
                                        toml.distributed.launch, Capabilities.of_distributed(toml.distributed),
                                        tuple(toml.distributed.collectives_not_offered.items()),
                                        tuple(toml.distributed.compression_refused.items()),
                                        tuple(toml.distributed.parallelism_refused.items()),
                                        toml.distributed.convergence_not_offered)
    capabilities = Capabilities.of_section(toml.capabilities)
    if not capabilities.supports(toml.execution.compile):
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
