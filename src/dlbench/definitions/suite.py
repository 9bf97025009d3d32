"""Suites, profiles and the benchmarks they resolve to.

A suite file lists networks with the workloads to run them under; a profile chooses batch sizes and
the measurement policy. `resolve_benchmarks` turns (suite, profile, device) into concrete,
framework-neutral Benchmark objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import Field, model_validator

from .. import axes
from .network import NetworkSummary
from .schema import MAX_SEQUENCE, Int, Real, _Strict

# The axes' values as a suite file's fields accept them: Literal types built from dlbench.axes (what
# each value means: runners/common/contract.py), so that the values a suite holds stay plain strings,
# as the records store them, and pydantic's messages list them. A suite may also say compile
# `default`: whichever the runner runs when not asked (its runner.toml's [execution] compile).
Mode = Literal[axes.Mode.names()]
Precision = Literal[axes.PRECISIONS]  # the run precisions (float64 is the equivalence check's alone)
COMPILE_MODES = axes.COMPILE_MODES  # read here by execution/registry.py
Compile = Literal[("default", *axes.COMPILE_MODES)]
Device = Literal["cpu", "cuda"]
PROFILES = ("smoke", "default", "paper")


# The bounds of a profile's and a suite's numbers (schema.py says why every number has one).
MAX_ITERS = 10_000_000
MAX_SECONDS = 7 * 86400.0  # a week: longer than any timeout a benchmark could ask for
MAX_REPEATS = 1000  # worker processes (or jobs) per run
MAX_BATCH = 1 << 20
Iterations = Int(0, MAX_ITERS)
Seconds = Real(ge=0, le=MAX_SECONDS)


class WarmupPolicy(_Strict):
    min_iters: Iterations = 2
    max_iters: Int(1, MAX_ITERS) = 50
    max_time_s: Real(gt=0, le=MAX_SECONDS) = 30.0
    window: Int(1, 10_000) = 3
    tolerance: Real(gt=0, le=100) = 0.1


class MeasurePolicy(_Strict):
    min_iters: Int(5, MAX_ITERS) = 5
    min_time_s: Seconds = 1.0
    max_iters: Int(1, MAX_ITERS) = 10000


# MLPerf LoadGen's scenarios (`dlbench run --scenario`, infer mode: dlbench.axes.Scenario): what each
# one's figure is is src/dlbench/store/loadgen.py's METRIC_KEYS; how queries become batches,
# runners/common/loadgen_harness.py.

class LoadGenPolicy(_Strict):
    """LoadGen's settings for one profile, given to every scenario run and recorded with it.
    Durations and query counts are LoadGen's own minimums (a test ends once both are met, or at
    max_duration_s, which makes it INVALID if they were not); single_stream reports its 90th and
    multi_stream its 99th percentile latency, early stopping included (LoadGen needs 64 queries at
    the 90th, 662 at the 99th before its estimate can hold). The server's bound is its 99th
    percentile target latency; its rate is searched over `server_search_steps` LoadGen tests.
    Generation (mode generate) runs the server only, bounded instead by the 99th percentiles of time
    to first token (`server_ttft_ms`) and time per output token (`server_tpot_ms`), one request at
    a time (batch 1: batch_sizes(scenario, "generate")).
    max_batch and batch_timeout_ms are the runner's batching for server and offline; sample_count
    the query sample library's size; seed LoadGen's three seeds (QSL, sample index, schedule)."""

    min_duration_s: Real(gt=0, le=MAX_SECONDS) = 10.0
    max_duration_s: Real(gt=0, le=MAX_SECONDS) = 120.0
    min_query_count: Int(1, MAX_ITERS) = 1024
    sample_count: Int(1, 1_000_000) = 1024
    samples_per_query: Int(1, 1024) = 8
    max_batch: Int(1, MAX_BATCH) = 8
    batch_timeout_ms: Real(ge=0, le=60_000) = 2.0
    server_target_latency_ms: Real(gt=0, le=3_600_000) = 100.0
    server_search_steps: Int(1, 100) = 5
    # generation's server (mode generate): 99th-percentile bounds on time to first token and time per
    # output token, as MLPerf states its LLM targets (llama2-70b server: 2 s and 200 ms)
    server_ttft_ms: Real(gt=0, le=3_600_000) = 2000.0
    server_tpot_ms: Real(gt=0, le=3_600_000) = 200.0
    warmup_queries: Int(1, 10_000) = 3
    seed: Int(0, 2**31 - 1) = 0

    @model_validator(mode="after")
    def _durations(self):
        if self.max_duration_s < self.min_duration_s:
            raise ValueError(f"max_duration_s ({self.max_duration_s:g}) is below min_duration_s ({self.min_duration_s:g})")
        return self

    def batch_sizes(self, scenario: str, mode: str = "infer") -> list[int]:
        """The batch sizes a scenario runs (a batch is padded up to the next): single_stream 1,
        multi_stream its samples per query, offline and server the powers of two below max_batch
        and max_batch itself; generation's server 1 (each request is one sequence, served alone)."""
        if scenario == "single_stream" or mode == "generate":
            return [1]
        if scenario == "multi_stream":
            return [self.samples_per_query]
        sizes = [1 << i for i in range(self.max_batch.bit_length()) if 1 << i < self.max_batch]
        return sizes + [self.max_batch]


class Profile(_Strict):
    description: str = ""
    warmup: WarmupPolicy
    measure: MeasurePolicy
    repeats: Int(1, MAX_REPEATS) = 3
    # How many of each network's modes this profile runs, in the order the suite lists them; None
    # runs them all. `smoke` takes one (train in the shipped suites): one run per network and
    # framework keeps a look over every suite and framework within minutes.
    modes_per_network: Int(1, 16) | None = None
    loadgen: LoadGenPolicy = LoadGenPolicy()


class ProfilesFile(_Strict):
    smoke: Profile
    default: Profile
    paper: Profile


BatchList = Annotated[list[Int(1, MAX_BATCH)], Field(min_length=1, max_length=1024)]


class PerDevice(_Strict):
    cpu: BatchList
    cuda: BatchList


class BatchSizes(_Strict):
    smoke: BatchList
    default: Union[BatchList, PerDevice]
    paper: BatchList


SequenceLength = Int(1, MAX_SEQUENCE)


class PerDeviceLength(_Strict):
    cpu: SequenceLength
    cuda: SequenceLength


class SequenceLengths(_Strict):
    """A language model's sequence length per profile (and, in `default`, per device): it replaces
    the network's own `input.sequence_length`, which stays the context its tables are sized for."""

    smoke: SequenceLength
    default: Union[SequenceLength, PerDeviceLength]
    paper: SequenceLength


class PerDeviceCount(_Strict):
    cpu: SequenceLength
    cuda: SequenceLength


class PerProfileCount(_Strict):
    """One token count per profile (and, in `default`, per device)."""

    smoke: SequenceLength
    default: Union[SequenceLength, PerDeviceCount]
    paper: SequenceLength


class GenerationSizes(_Strict):
    """Mode generate's sizes: the prompt's tokens and the new tokens per sequence, per profile, and
    the batch sizes (sequences generated together) when they differ from the entry's own. A prompt
    and its new tokens must fit the network's position table (checked when the suite is loaded)."""

    prompt_length: PerProfileCount
    new_tokens: PerProfileCount
    batch_sizes: BatchSizes | None = None


LearningRate = Real(gt=0, le=1e6)
Momentum = Real(ge=0, lt=1)


class Hyperparameters(_Strict):
    learning_rate: LearningRate = 0.01
    momentum: Momentum = 0.9


class BenchmarkEntry(_Strict):
    network: str  # a name in suites/networks, or a path to a .yaml relative to the suite file
    modes: Annotated[list[Mode], Field(min_length=1)] = ["train", "infer"]
    batch_sizes: BatchSizes
    sequence_length: SequenceLengths | None = None  # token inputs only; the network's own when absent
    generation: GenerationSizes | None = None  # mode generate's prompt, new tokens and batch sizes
    # one value or a list: the benchmark runs under each (`--precision`/`--compile` replace them)
    precision: Precision | Annotated[list[Precision], Field(min_length=1)] = "fp32"
    compile: Compile | Annotated[list[Compile], Field(min_length=1)] = "default"
    learning_rate: LearningRate | None = None
    momentum: Momentum | None = None
    # the devices the benchmark is planned on: a network too large for a CPU's memory or time (a
    # billion-parameter decoder) lists [cuda], and is left out of the suite on a CPU, in every profile
    devices: Annotated[list[Device], Field(min_length=1)] = ["cpu", "cuda"]


class SuiteFile(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    description: str = ""
    defaults: Hyperparameters = Hyperparameters()
    benchmarks: Annotated[list[BenchmarkEntry], Field(min_length=1)]


@dataclass(frozen=True)
class Benchmark:
    """One network under one workload; the unit `dlbench run` measures at each batch size."""

    suite: str
    name: str  # "<network>-<mode>"
    network: NetworkSummary
    network_file: str
    mode: Mode
    batch_sizes: tuple[int, ...]
    precision: str
    learning_rate: float
    momentum: float
    profile: str
    policy: Profile
    compile: str = "default"  # eager | compiled | default (the runner's own; resolved per framework)
    scenario: str | None = None  # a LoadGen scenario (infer mode); None: the harness's back-to-back iterations
    compression: str | None = None  # a data-parallel job's only (definitions/distributed.py): never asked here
    parallelism: str | None = None  # a distributed training job's only (definitions/distributed.py): never asked here
    generation: "Generation | None" = None  # mode generate only


@dataclass(frozen=True)
class Generation:
    """A generate benchmark's request shape: `prompt_length` tokens in, `new_tokens` out, per sequence."""

    prompt_length: int
    new_tokens: int


@dataclass(frozen=True)
class Suite:
    name: str
    description: str
    path: Path
    benchmarks: tuple[Benchmark, ...]


