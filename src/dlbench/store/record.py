"""The run record: one measured (benchmark, framework, batch size) with everything needed to cite it.

SCHEMA_VERSION history (a record carries the version it was written with; readers upgrade older
records step by step and refuse newer ones):
  1 (2026-11-29) first version: provenance (dlbench version and commit, machine fingerprint,
    environment packages), network description and hash, workload and settings, per-repeat
    iteration times, summary statistics, status with reason and output tail.
  2 (2026-11-29) `equivalence`: the status of the latest `dlbench check` of this network on this
    framework version (equivalent | mismatch | reference | failed | unchecked), with its date and
    errors. Records of version 1 read as "unchecked" (store/migrations.py: update_to_2).
  3 (2026-11-29) telemetry: each repeat keeps its sampled series (columnar, on the monotonic clock
    of its window marks) and the figures derived for its measured window; the record keeps the
    run's summary (`telemetry`: energy, power, clocks, throttling, peaks, with reasons for what is
    missing). Older records read with telemetry {"enabled": False} (update_to_3).
  4 (2026-11-29) integrity and provenance: the file carries `checksum` ("sha256:<hex>" of the
    canonical JSON of everything else in it; store/store.py), verified on every read, and
    `upgraded_from` when `dlbench store upgrade` rewrote it from an older version; both belong
    to the file, not to Record. `machine.machine_id` (a hash of the hardware's identifying parts,
    machine.py) to filter and merge on; the GPUs' serials and PCI bus ids beside names, UUIDs,
    memory, driver and CUDA driver versions; `environment.python_version` beside the interpreter
    path and the lock (`environment.packages`: every name==version installed in the runner's
    environment). Older records read with the machine_id of their stored fingerprint and no
    checksum ("unverified", not an error) (update_to_4). Also statistics: median CI, stability,
    repeat policy (see Summary).
  5 (2026-11-30) multi-worker runs (suites `distributed` and `comm`): `distributed` (workers, hosts,
    launcher, backend, threads per worker, scaling mode, per-worker and global batch, rank 0's and
    the slowest rank's median iteration, gradient bytes per iteration, exposed communication, and
    the scaling efficiency against the one-worker baseline, named by run id), `comm` (per message
    size: median time, algorithm and bus bandwidth, the check of the result), each repeat's
    per-rank timings (`Repeat.ranks`), and the workload mode `collective` (a comm record's
    "network" is the collective: name, sizes, dtype; batch 1, one message per iteration).
    Older records read with none of these (the model's defaults: no migration). Also
    `prediction`: the performance model's iteration time for the run, made from the machine
    profile before it ran (performance/; absent when there was no profile).
  6 (2026-12-01) precision and compilation as axes: `workload.precision` is one of fp32 (IEEE
    float32, TF32 pinned off), tf32, amp_bf16, amp_fp16 (the runner records the effective flags and
    dtypes it read back in settings.runner.precision_effective); `workload.compile` (eager |
    compiled, as the framework resolved it), `workload.compile_requested` (default | eager | compiled)
    and `workload.compile_mode` (torch.compile's mode, where one was asked); each repeat's
    allocator peak (`Repeat.memory`) and compiler counters (`Repeat.compile`); the summary's
    `compile_s` (first iteration less the steady median, over repeats). Older records: precision
    "float32" reads as "fp32" on the CPU (no TF32 there; the runners never enabled reduced-precision
    CPU math) and as "float32 (TF32 not pinned)" on CUDA, where cuDNN's default allowed TF32
    convolutions; the compile mode is what the framework's runner ran then (update_to_6).
  7 (2026-12-02) contention and equivalence by default: each repeat's `contention` (the CPU time
    other processes used during its measured window as a share of the cores the worker was given,
    `other_cpu_pct`, the part beyond the cores it was not given, `contention_pct`, steal beside it,
    whether it was `contended` against `threshold_pct`, and, with --quiet-wait, how long the repeat
    waited for a quiet machine: telemetry/contention.py) and the repeat status `contended`: a
    repeat whose window was contended and that a fresh repeat replaced (its iterations are kept,
    and counted nowhere: statistics, comparisons and the iteration frame take `ok` repeats only).
    `repeat_policy` says the threshold, the replacements allowed and made, and the quiet wait.
    `equivalence` now comes from the check `dlbench run` makes before timing (or a stored one):
    besides status, reason, errors and date, `precision` (the check's: float64 for fp32 and tf32
    runs, the run's own for amp_bf16/amp_fp16, whose float64 check must hold too), `reference`
    (the framework and version compared against), `worst` ({quantity, error} of logits, loss,
    weights, update), `check_s` (the seconds of the check that gave it) and `checked_by`
    (`dlbench run` or `dlbench check`). Older records read with contention {"measured": false}
    on their repeats (update_to_7).
  8 (2026-12-02) adaptive repeats judged on the reported interval: `--target-ci` stops when the
    half-width of the interval the tables show (store/intervals.py: Student's t on the log repeat
    medians widened to the stored bootstrap) is within the target, no longer the stored
    bootstrap's. `repeat_policy.target_interval` says which interval the target was judged on
    ("reported"; "bootstrap" for the adaptive records before 8, None for fixed repeats) and
    `repeat_policy.achieved_reported_ci_pct` the reported interval's half-width (% of the median)
    when the run stopped; `achieved_ci_pct` keeps its meaning, the stored bootstrap's half-width.
    Older records read with `target_interval` "bootstrap" where adaptive and no
    `achieved_reported_ci_pct` (the tables derive their reported interval on read) (update_to_8).
  9 (2026-12-02) MLPerf LoadGen scenarios (`dlbench run --scenario`): `workload.scenario`
    (single_stream | multi_stream | offline | server; None for the harness's own back-to-back
    timing) and `loadgen` (LoadGenInfo): the settings dlbench gave LoadGen and those LoadGen took
    (durations, query counts, target latency, seeds), the batching policy, the warm-up, LoadGen's own
    result of the run the figure comes from (VALID/INVALID and why, latency percentiles, QPS,
    early-stopping figures, every `result_*` key of its detail log), the server's search, and
    `logs`: LoadGen's log files, kept in the store beside the record under
    STORE/loadgen/<run_id>/, each with its size and SHA-256 (the record's checksum covers those,
    so `store verify` proves the logs too). A LoadGen run has no `summary` (LoadGen keeps the clock,
    not the harness). Older records read with scenario None and no loadgen (the model's defaults:
    no migration).
  10 (2026-12-02) generation (issue 20): the workload mode `generate` (a decoder's prompt, then new
    tokens one at a time with a key/value cache, greedy). Each repeat's `generation` holds, per
    measured request, its time to first token (`ttft_s`: the prefill, prompt in, first new token
    out) and time per output token (`tpot_s`: the mean of its decode steps), and the first
    request's TTFT (`first_ttft_s`, compilation included); its `iter_s` are whole requests, so the
    summary's samples/s is sequences/s. The record's `generation` (GenerationSummary) has the
    prompt and new-token counts and the distributions over every request of every ok repeat: TTFT,
    TPOT and tokens/s per request (batch x new tokens / request time), each with median, mean,
    stdev, min, max, quartiles, 90th and 99th percentiles and the repeats' medians. Older records
    have none (absent: none) (the model's defaults: no migration).
  11 (2026-12-02) time to accuracy (suite kind `convergence`, issue 21): the workload mode
    `convergence`; `convergence` (the task: dataset, target, optimiser and schedule, augmentation,
    batch, cadence, epochs; per seeded run its outcome, time and epochs to target, initialisation
    time, accuracy curve, input-bound share and its MLLOG file, kept in STORE/mllog/<run_id>/ with
    its SHA-256; the score by MLPerf's rule). Older records have none (the model's defaults: no
    migration).
  12 (2026-12-02) where a prediction came from: `prediction.sources`, the share of the predicted
    time from each source of performance/model.py's SOURCES: `shape` (kernels measured at that very
    shape), `class` (an operation class's efficiency measured by calibrate's probes, or the
    framework's measured element-wise bandwidth for work that is no kernel), `ceilings` (the
    roofline at a calibrated profile's measured ceilings alone), `datasheet` (a datasheet's peaks
    times stated efficiencies). Older records read with no split (`sources` {}; `measured_share`
    keeps saying the `shape` part) (the model's defaults: no migration).
  13 (2026-12-02) LoadGen's server scenario on generation (`dlbench run --mode generate --scenario
    server`, issue 20): LoadGen's token latencies. `loadgen.result` (and each test of `search`) has
    `ttft_ns` (time to first token) and `tpot_ns` (time per output token): min, mean, max and
    percentiles as LoadGen's detail log states them, and `tokens_per_s` (completed tokens/s);
    `early_stopping` joins LoadGen's TTFT and TPOT early-stopping texts. `loadgen.generation` holds
    the request shape (prompt, new tokens), the bounds (`ttft_ms`, `tpot_ms`, 99th percentile) and
    the serving policy. The server's figure is the highest rate meeting both bounds. Older records
    read with none of these ({}/None) (the model's defaults: no migration).
  14 (2026-12-03) the machine's speed beside each measurement: each repeat's `yardstick`, the
    median seconds (by kernel key) of the two fixed kernels its worker timed in the run's framework
    before building the network (performance/yardstick.py: a float32 512^3 matrix product and a relu
    over 16 MiB), so a prediction can be scored against the machine as fast as it was when the run
    ran (`dlbench predict --accuracy`). Older records read with none (None) (the model's
    defaults: no migration).
  15 (2026-12-07) containers for real (issue 43): a record of the docker backend says how its worker's
    container was had and run, in `environment.container`: `engine` (the client, its kind and
    version, the engine behind it and its version, the API: podman-cli or docker-api, the builder:
    buildx, classic or podman, and the socket), `image_digest` (the registry digest, None for an image
    only ever built locally: its `environment.image_id` is then its content address),
    `image_created`, `image_size_bytes`, `base_image` (the Dockerfile's BASE_IMAGE build argument as
    built: its pinned default or $DLBENCH_BASE_IMAGE) and `base_image_id`, `venv_lock_checked` (the
    image's packages were checked against the venv's lock when it was built), `run_options` (the
    engine options every worker container ran with: --init, --pull never, --network none, shm,
    user, memory limit, GPUs) and `stop` (how it is stopped). Older records have none (a docker
    record before 15 has only image, image_id, dockerfile and gpus) (a free-form dict: the model's
    defaults: no migration). Added the same day without a version of its own (the dict is
    free-form, so every reader of 15 reads it): `cpu`, where the container competed for the CPU
    (`placement` "caller": in the caller's cgroup `cgroup_parent`, with the `cpu_shares` rule that
    gives it its worker's weight on the host; "engine": the engine's own cgroup, `reason` saying why);
    a 15 record without it ran in the engine's cgroup.
  16 (2026-12-07) shaped links (`dlbench run --link RATE[,DELAY]`, issue 44): `link` (LinkInfo) on
    the records of a job whose workers ran in network namespaces joined by a shaped link: the link
    as asked (`asked`, `rate_bps`, `delay_s`), how it was shaped (`shaping`: the qdiscs), its
    `subnet`, the link as measured before the jobs (`measured`: one TCP stream's bandwidth and the
    median one-byte round trip between two workers' namespaces) and, for training, the bytes on the
    wire per measured iteration read from the hub-side veth counters (`wire`: per worker, with the
    ring all-reduce's analytical 2(n-1)/n x gradient bytes beside). Its benchmark names carry the
    link (`fcn5-train-w2@1gbit`), so runs on different links never pool or pair. Older records
    read with none (None) (the model's
    defaults: no migration).
  17 (2026-12-07) gradient compression of data-parallel training (`dlbench run --compression`,
    issue 44): `workload.compression` (none | fp16 | bf16 | powersgd:RANK | topk:DENSITY |
    gtopk:DENSITY; None where the run is no data-parallel training) pairs runs as the other axes
    do, and `distributed.exchange` holds the method's analytical bytes of one iteration's exchange
    (performance/communication.py exchange_bytes: one rank's payload, the mean bytes a rank sends,
    every rank's together, the rounds on the longest path, the formula). What the runner's hook or
    step did is in settings.runner.compression. Older data-parallel training records exchanged
    dense float32 gradients: they read with compression "none" (update_to_17), and with no
    `distributed.exchange` (the model's
    defaults: no migration).
  18 (2026-12-07) oversubscribed jobs (`dlbench run --oversubscribe`, issue 44): more ranks (times
    threads per rank) on a machine than it has cores, the kernel time-slicing them.
    `distributed.oversubscribed` (Oversubscription: the most crowded machine, its ranks' threads
    and its cores) on such a job's records; None where every thread had a core of its own. An
    oversubscribed job's iteration times include waiting for a core: only comparisons bound by the
    link (a shaped one, --link) say something. Older records read with None, which is true of them:
    dlbench refused to oversubscribe before (the model's
    defaults: no migration).
  19 (2026-12-07) time to accuracy of data-parallel training (`dlbench run --suite convergence
    --workers N [--compression ...] [--link ...]`, issue 44): a convergence record of N > 1
    workers has `distributed` (workers, placement, launch, backend, per-worker and global batch,
    the method's analytical `exchange`), `workload.compression`, `link` on a shaped link, and a
    benchmark name with the workers and link (`digits_cnn-w2@1gbit`); each seeded run's
    `wire_sent_bytes` (per worker, the frame bytes its link port carried over the whole job,
    initialisation included) on a link; and `convergence.against_dense` (DenseComparison) on a
    compressed run: the dense run of the same invocation it is compared with, seed by seed (time
    to target of each, the speedup, or why there is none: a seed that did not reach the target)
    and score against score. Older records have none (the model's defaults: no migration).
  20 (2026-12-07) expert parallelism (`dlbench run --suite distributed --parallelism expert`, issue
    45): `workload.parallelism` (data | expert; None where the run is no distributed training)
    pairs runs as the other axes do; `distributed.step_losses`, the training loss after the first
    step and each warm-up step of the first repeat, the mean over the ranks (data and expert
    parallelism of one network from the same weights and data must agree); and for expert
    parallelism `distributed.all_to_all` (AllToAllInfo: the experts per worker, the bytes a rank
    sends to the others per step by the dispatch and combine all-to-alls, forward and backward, the
    seconds per step in them and their share of the step). `distributed.grad_bytes` and
    `distributed.exchange` of an expert-parallel run count the weights still all-reduced (every one
    but the experts'). Older data-parallel training records read with parallelism "data"
    (update_to_20), and with none of the rest (the model's
    defaults: no migration).
"""

from __future__ import annotations

import re
import secrets
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..axes import Parallelism, Scenario

SCHEMA_VERSION = 20

PARALLELISMS = Parallelism.names()  # runners/common/contract.py Parallelism, as a record spells them
SCENARIOS = Scenario.names()  # MLPerf LoadGen's (dlbench.axes.Scenario), as a record spells them
Status = Literal["ok", "failed", "timeout", "skipped"]
# a repeat may also be `contended`: it ran, but other processes took the worker's CPU during its
# window, and a fresh repeat replaced it (schema 7)
RepeatStatus = Literal["ok", "failed", "timeout", "skipped", "contended"]
# Every integer of a record fits the int64 that SQLite (the row index), numpy and parquet hold: a
# record with a batch size of 1e20 is invalid (reported and skipped), never a crash of its readers.
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
# What a run id may be: it names the record's file, STORE/runs/<run_id>.json (new_run_id's form is
# 20261129T232046Z-0123456789ab). Letters, digits, '_', '-' and '.', not first: never a path.
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
RunId = Annotated[str, Field(pattern=RUN_ID_PATTERN)]


def valid_run_id(run_id: object) -> bool:
    return isinstance(run_id, str) and re.fullmatch(RUN_ID_PATTERN, run_id) is not None


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def new_run_id(now: datetime | None = None) -> str:
    """Sortable by start time, unique without coordination between machines or processes."""
    now = now or datetime.now(timezone.utc)
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(6)}"


class Repeat(_Model):
    """One worker process: first iteration, warm-up and the measured iterations."""

    index: Int64
    status: RepeatStatus
    reason: str | None = None
    first_iter_s: float | None = None
    warmup_iter_s: list[float] = []
    warmup_settled: bool | None = None
    iter_s: list[float] = []
    window_monotonic_ns: list[Int64] = []
    wall_s: float | None = None
    telemetry: dict[str, Any] | None = None  # the sampler's columnar series for this worker
    derived: dict[str, Any] | None = None  # figures for this repeat's measured window
    # multi-worker jobs: one entry per rank (rank, host, iter_s, local_iter_s, first_iter_s); the
    # repeat's iter_s is then the slowest rank's per iteration (analysis/distributed.py)
    ranks: list[dict[str, Any]] | None = None
    # the framework allocator's peak device memory over this worker ({"peak_allocated_bytes",
    # "peak_reserved_bytes", "source"} or {"unavailable": why}) and its compiler's counters (schema 6)
    memory: dict[str, Any] | None = None
    compile: dict[str, Any] | None = None
    # other processes' CPU during the measured window, steal, contended or not, the quiet wait
    # before the repeat (telemetry/contention.py.window_contention; schema 7)
    contention: dict[str, Any] | None = None
    # mode generate (schema 10): {"new_tokens", "first_ttft_s", "ttft_s": [per request], "tpot_s": [...]}
    generation: dict[str, Any] | None = None
    # schema 14: kernel key -> median seconds of the worker's yardstick (performance/yardstick.py)
    yardstick: dict[str, float] | None = None


class MedianInterval(_Model):
    """Confidence interval of the median iteration time and the throughput it implies (how it is
    made, and why: src/dlbench/statistics.py)."""

    confidence: float  # 0.95
    method: Literal["two-level bootstrap", "block bootstrap"]
    level: Literal["repeats", "iterations"]  # the outermost independent unit that was resampled
    units: Int64  # how many of those units (repeats, or iteration blocks of a single repeat)
    resamples: Int64
    median_s: tuple[float, float]  # low, high
    samples_per_s: tuple[float, float]  # low, high: batch / the time interval's high, low
    half_width_pct: float  # (high - low) / 2 of median_s, as a percentage of the median


class Stability(_Model):
    """Whether the repeats (fresh processes) agree beyond their own spread."""

    unstable: bool
    reason: str  # one line for people
    kruskal_p: float | None = None
    spread_to_iqr: float | None = None  # (max - min) of repeat medians / median within-repeat IQR


class Summary(_Model):
    """Over every measured iteration of every successful repeat."""

    repeats: Int64
    iterations: Int64
    median_s: float
    mean_s: float
    stdev_s: float
    min_s: float
    max_s: float
    q1_s: float
    q3_s: float
    iqr_s: float
    cv: float
    repeat_medians_s: list[float]
    first_iter_s: float | None
    ms_per_iter: float
    samples_per_s: float
    ci: MedianInterval | None = None  # None in records before schema 4
    stability: Stability | None = None
    # median over repeats of (first iteration - that repeat's median): what compiling (tracing,
    # autotuning, first-call allocation) costs once; None where no repeat timed its first iteration
    compile_s: float | None = None


class NetworkInfo(_Model):
    name: str
    file: str
    hash: str
    params_described: Int64
    flops_per_sample: Int64
    definition: dict[str, Any]

    @classmethod
    def of(cls, network, file: str) -> "NetworkInfo":
        """What a record keeps of a resolved network (definitions/network.py) read from `file`."""
        return cls(name=network.name, file=file, hash=network.definition_hash, params_described=network.params,
                   flops_per_sample=network.flops_per_sample, definition=network.resolved)


class Workload(_Model):
    mode: Literal["train", "infer", "collective", "generate", "convergence"]
    batch_size: Int64
    precision: str  # fp32 | tf32 | amp_bf16 | amp_fp16 (a collective: its dtype; see update_to_6 for older names)
    compile: str = "eager"  # eager | compiled, as resolved for the framework (runner.toml [execution])
    # what the run asked for: default (each framework as it runs when not told: the leaderboard
    # ranks those together), eager or compiled
    compile_requested: str = "default"
    compile_mode: str | None = None  # torch.compile's mode (default | max-autotune) when compiled
    learning_rate: float
    momentum: float
    device: Literal["cpu", "cuda"]
    # an MLPerf LoadGen scenario (schema 9); None: the harness's back-to-back iterations
    scenario: Literal[SCENARIOS] | None = None
    # how a data-parallel job exchanged its gradients (schema 17, runners/common/contract.py
    # Compression: none, fp16, powersgd:4, topk:0.01, 2bit:0.5, ...); None: not data-parallel training
    compression: str | None = None
    # how a training job of the distributed suite split the network over its workers (schema 20,
    # runners/common/contract.py Parallelism); None: not distributed training
    parallelism: Literal[PARALLELISMS] | None = None


class Settings(_Model):
    profile: str
    repeats: Int64
    threads_requested: Int64 | None
    threads_effective: dict[str, Any] = {}
    timeout_s: float
    policy: dict[str, Any]
    runner: dict[str, Any] = {}


class RepeatPolicy(_Model):
    """How many repeats a run asked for and why it stopped where it did."""

    kind: Literal["fixed", "adaptive"]
    min_repeats: Int64  # the profile's or --repeats; adaptive runs check their interval from here on
    max_repeats: Int64  # --max-repeats (= min_repeats when fixed)
    target_ci_pct: float | None = None  # --target-ci: half-width of the median's interval, % of the median
    achieved_ci_pct: float | None = None  # the stored bootstrap interval's (Summary.ci) half-width, %
    # schema 8: which interval the target was judged on ("reported": store/intervals.py, what the
    # tables show; "bootstrap": Summary.ci, adaptive runs before 8; None: fixed repeats), and the
    # reported interval's half-width, % of the median, when the run stopped (None before 8)
    target_interval: Literal["reported", "bootstrap"] | None = None
    achieved_reported_ci_pct: float | None = None
    # fixed: ran the repeats asked for; target_met / cap_reached: adaptive outcomes;
    # failed_repeat: a repeat did not complete (failed, timeout, skipped); not_started: no environment
    stopped: Literal["fixed", "target_met", "cap_reached", "failed_repeat", "not_started"]
    # contention (schema 7): a repeat whose window had other processes above the threshold is
    # contended; up to max_replacements of them were replaced by fresh repeats (`replaced` made);
    # quiet_wait_s: the most each repeat waited for a quiet machine (None: no waiting)
    contention_threshold_pct: float | None = None  # None: contention not measured (--no-telemetry)
    max_replacements: Int64 = 0
    replaced: Int64 = 0
    quiet_wait_s: float | None = None


class Scaling(_Model):
    """Throughput with N workers against one worker (analysis/distributed.py)."""

    mode: Literal["strong", "weak"]  # strong: same global batch as the baseline; weak: same per-worker batch
    baseline_run_id: str | None = None  # the one-worker run it is measured against
    baseline_source: Literal["same_invocation"] | None = None  # where that run came from
    baseline_samples_per_s: float | None = None
    speedup: float | None = None  # throughput / baseline throughput
    efficiency: float | None = None  # speedup / workers
    reason: str | None = None  # why there is no efficiency (the baseline failed; this is the baseline)


class ExchangeInfo(_Model):
    """The analytical bytes of one iteration's gradient exchange by the run's compression
    (performance/communication.py ExchangeBytes), from the network's trainable tensors."""

    method: str  # as workload.compression
    payload_bytes: Int64  # one rank's message: the all-reduced buffer or its (value, index) pairs
    bytes_per_rank: float  # mean bytes one rank sends per iteration
    total_bytes: float  # every rank's together: what the wire carries per iteration
    rounds: Int64  # messages one after the other on the longest path
    formula: str


class Oversubscription(_Model):
    """A job whose ranks ran more threads on a machine than it has cores (--oversubscribe): the
    kernel time-sliced them, so an iteration's time includes waiting for a core."""

    machine: str  # the most crowded machine (placement.py Placement.machines' name)
    threads: Int64  # its ranks x threads per rank
    cores: Int64  # the cores they shared


class AllToAllInfo(_Model):
    """Expert parallelism's all-to-alls (schema 20): tokens dispatched to the workers holding their
    experts and the experts' outputs combined back, forward and backward. Per measured step, from
    each rank's totals around the measured window, pooled over the repeats."""

    experts_per_worker: list[Int64]  # per Mixture-of-Experts layer, in order
    dispatch: str  # how tokens are sent: dropless, or with a capacity (the runner's words)
    bytes_per_step: float  # mean over the ranks of the bytes a rank sends to the others per step
    calls_per_step: float  # all-to-alls one rank makes per step (counts, dispatch, combine, their backward)
    # the slowest rank's mean time in them per step (waiting for peers included); None where the
    # runner cannot time them apart (inside one compiled program: `timing` says what it measured)
    seconds_per_step: float | None = None
    share: float | None = None  # seconds_per_step / the slowest rank's median step
    timing: str | None = None  # how the runner timed them (settings.runner.expert_parallel)


class DistributedInfo(_Model):
    """How a multi-worker job was laid out, and the figures only such a job has."""

    workers: Int64
    hosts: list[str]  # one entry per host, in rank order
    placement: Literal["local", "hosts", "slurm"]
    launch: str  # how the ranks were started: torchrun | ranks
    backend: str | None = None  # the framework's communication backend (gloo, nccl, ...), as rank 0 reported it
    threads_per_worker: Int64
    per_worker_batch: Int64 | None = None
    global_batch: Int64 | None = None
    rank0_median_s: float | None = None
    slowest_median_s: float | None = None  # median over iterations of the slowest rank's time
    grad_bytes: Int64 | None = None  # gradient bytes all-reduced per iteration (each rank's payload)
    exposed_comm_s: float | None = None  # communication not hidden behind backward (may be < 0 by noise)
    exposed_comm_method: str | None = None
    local_median_s: float | None = None  # slowest rank's median step without the gradient exchange
    scaling: Scaling | None = None  # training runs
    exchange: ExchangeInfo | None = None  # training runs of N > 1 workers (schema 17)
    oversubscribed: Oversubscription | None = None  # --oversubscribe and more threads than cores (schema 18)
    # the loss after the first step and each warm-up step of the first repeat, mean over the ranks (schema 20)
    step_losses: list[float] | None = None
    all_to_all: AllToAllInfo | None = None  # expert-parallel training runs (schema 20)


class CommSize(_Model):
    size_bytes: Int64  # as the suite asked
    bytes: Int64 | None = None  # the collective's largest buffer as run (a multiple of the ranks' share)
    time_s: float | None = None  # median over iterations (and repeats) of the slowest rank's time
    algbw_gbps: float | None = None  # GB/s, 1e9 bytes
    busbw_gbps: float | None = None
    iterations: Int64 = 0
    correct: bool | None = None  # None: not run at this size
    error: str | None = None  # the first wrong element, per rank
    skipped: str | None = None  # why not run at this size


class CommInfo(_Model):
    collective: Literal["all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all"]
    dtype: str
    workers: Int64
    bus_factor: float
    sizes: list[CommSize]


class Prediction(_Model):
    """What the performance model (src/dlbench/performance/model.py) predicted for this run before
    it ran, from a machine profile: the iteration time and its phases, in seconds."""

    model_version: Int64
    profile: str  # the machine profile: "<machine id prefix>@<revision>"
    workers: Int64 = 1
    schedule: str | None = None  # gradient communication schedule (none | wfbp | mgwfbp), N workers
    iteration_s: float | None = None
    phases: dict[str, float] = {}  # io, forward, backward, update, communication, communication_exposed
    measured_share: float | None = None  # of the predicted time, the part from measured kernel times
    # of the predicted time, the share from each source (performance/model.py SOURCES: shape, class,
    # ceilings, datasheet); {} in records before schema 12
    sources: dict[str, float] = {}
    unmeasured_kernels: Int64 = 0  # kernels of this network the profile has no time for (roofline)
    notes: list[str] = []
    error: str | None = None  # why the profile could not predict this run


class LoadGenLog(_Model):
    """One of LoadGen's log files, kept in the store: `path` relative to the store's root
    (loadgen/<run_id>/<LoadGen run>/<file>), its size and the SHA-256 of its bytes."""

    path: Annotated[str, Field(pattern=r"^loadgen/[A-Za-z0-9][A-Za-z0-9_.-]{0,127}/[A-Za-z0-9_-]{1,64}/"
                                       r"mlperf_log_[a-z]+\.txt$")]
    bytes: Int64
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class LoadGenResult(_Model):
    """LoadGen's own result of one test, as its detail log states it (store/loadgen.py reads it)."""

    log_dir: str  # the LoadGen run's folder under loadgen/<run_id>/
    validity: Literal["VALID", "INVALID"]
    invalid_reasons: list[str] = []  # LoadGen's words: its invalid reason, the unmet conditions, early stopping's text
    target_qps: float | None = None  # server: the Poisson rate LoadGen was asked for
    meets_bound: bool | None = None  # server: LoadGen's result_perf_constraints_met (99th percentile within the bound)
    query_count: Int64 | None = None
    latency_ns: dict[str, float] = {}  # min, mean, max, and percentiles "50.00" ... "99.90" (per sample)
    samples_per_s: float | None = None  # the scenario's throughput (see store/loadgen.py: which key)
    # generation's server (schema 13, LoadGen's token latencies): time to first token and time per
    # output token, ns: min, mean, max and percentiles "50.00" ... "99.90"; completed tokens/s
    ttft_ns: dict[str, float] = {}
    tpot_ns: dict[str, float] = {}
    tokens_per_s: float | None = None
    early_stopping: str | None = None  # LoadGen's early-stopping text (token latencies: TTFT's and TPOT's)
    figures: dict[str, Any] = {}  # every result_* and early_stopping_* key of the detail log, as LoadGen wrote it


class LoadGenInfo(_Model):
    """A run under MLPerf LoadGen (schema 9): what it was asked, what it found, where its logs are."""

    scenario: Literal[SCENARIOS]
    loadgen_version: str | None = None
    mode: str = "PerformanceOnly"
    metric: str  # what the scenario's figure is: p90 latency, p99 latency, samples/s, server QPS
    metric_value: float | None = None
    settings: dict[str, Any]  # what dlbench gave LoadGen (profile: durations, counts, bound, seeds, batching)
    effective: dict[str, Any] = {}  # LoadGen's effective_* settings of the chosen test
    batching: dict[str, Any] = {}  # max batch, timeout, the padded batch sizes
    warmup_latency_s: dict[str, float] = {}  # median per padded batch size (generation: per request), before LoadGen
    # generation's server (schema 13): prompt and new tokens per request, the TTFT and TPOT bounds
    # (ms, 99th percentile) and the serving policy; {} for other runs
    generation: dict[str, Any] = {}
    result: LoadGenResult  # the test the figure comes from (the server: the highest rate that met the bound)
    search: list[LoadGenResult] = []  # server: every test of the search, in order
    logs: list[LoadGenLog] = []


class Distribution(_Model):
    """One per-request quantity of a generate run over every measured request of its ok repeats."""

    unit: str  # "s" or "tokens/s"
    requests: Int64
    median: float
    mean: float
    stdev: float
    min: float
    max: float
    q1: float
    q3: float
    p90: float
    p99: float
    repeat_medians: list[float]


class GenerationSummary(_Model):
    """A generate run's request shape and its per-request distributions (analysis/generation.py)."""

    prompt_length: Int64
    new_tokens: Int64
    batch_size: Int64  # sequences generated together in one request
    ttft: Distribution | None = None  # time to first token (prefill), seconds
    tpot: Distribution | None = None  # time per output token after the first (decode), seconds
    tokens_per_s: Distribution | None = None  # generated tokens (batch x new tokens) / request time
    first_ttft_s: float | None = None  # median over repeats of the first request's TTFT (compilation included)


class ConvergenceRun(_Model):
    """One seeded run of a convergence task (a fresh worker process)."""

    seed: Int64
    status: Status  # of the worker: ok (it ran; `reached` says whether to the target), failed, ...
    reason: str | None = None
    reached: bool = False
    epochs: Int64 | None = None  # epochs trained
    epochs_to_target: Int64 | None = None
    time_to_target_s: float | None = None  # run_start to run_stop (MLPerf's clock)
    init_s: float | None = None  # initialisation, timed apart
    run_s: float | None = None
    read_s: float | None = None  # of run_s: reading the splits and building the pipelines
    evals: list[dict[str, Any]] = []  # {epoch, accuracy, time_s (since run_start)}
    epoch_s: list[float] = []
    train_s: float | None = None  # training only (evaluations excluded)
    input_wait_s: float | None = None  # blocked in the pipeline's next() during training
    input_bound_share: float | None = None  # input_wait_s / train_s
    steps: Int64 | None = None
    train_samples: Int64 | None = None
    eval_samples: Int64 | None = None
    cache_clear: dict[str, Any] = {}
    pipeline: dict[str, Any] = {}
    mllog: str | None = None  # the MLLOG file, relative to the store (mllog/<run_id>/seed-<seed>.log)
    mllog_sha256: str | None = None
    # a data-parallel run on a shaped link: frame bytes each worker's hub-side port received from
    # it over the whole job (initialisation, training and evaluations), rank order (schema 19)
    wire_sent_bytes: list[float] = []


class SeedAgainstDense(_Model):
    """One seed of a compressed data-parallel convergence run beside the same seed run dense."""

    seed: Int64
    dense_s: float | None = None  # the dense run's time to target (None: it did not reach it)
    time_s: float | None = None  # this run's
    speedup: float | None = None  # dense_s / time_s; None: reason says why
    reason: str | None = None


class DenseComparison(_Model):
    """A compressed data-parallel convergence run against the dense one (compression none, same
    task, framework, workers, link and seeds) run in the same invocation (schema 19)."""

    dense_run_id: str
    seeds: list[SeedAgainstDense]
    score_speedup: float | None = None  # the dense score over this score
    reason: str | None = None  # why there is no score_speedup


class ConvergenceInfo(_Model):
    """A convergence task on one framework: what it asked and every seeded run; the score is
    MLPerf's: with 3 or more runs the fastest and the slowest are dropped and the rest averaged, one
    run that did not reach the target allowed (it is the slowest); with fewer, the mean of all, none
    allowed to miss (analysis/convergence.py)."""

    task: str
    dataset: dict[str, Any]  # name, format, source (package | data_dir), folder, samples per split
    metric: str  # top1
    target: float
    optimizer: dict[str, Any]
    augmentation: dict[str, Any]
    batch_size: Int64
    max_epochs: Int64
    eval_every_epochs: Int64
    loader_workers: Int64
    max_init_s: float
    runs: list[ConvergenceRun]
    score_s: float | None = None  # time to target by the rule above; None: no score (reason says why)
    score_rule: str
    scored_seeds: list[Int64] = []
    reached: Int64 = 0  # runs that reached the target
    epochs_to_target: float | None = None  # mean over the scored runs
    input_bound_share: float | None = None  # mean over the runs that trained
    reason: str | None = None
    against_dense: DenseComparison | None = None  # a compressed data-parallel run (schema 19)


class LinkMeasurement(_Model):
    """The link as it performed before the jobs (execution/wire.py's socket test)."""

    bandwidth_bps: float  # one TCP stream worker 0 -> worker 1, payload bits over the receiver's time
    rtt_s: float  # median round trip of a one-byte TCP echo between them
    seconds: float  # how long the stream was received
    method: str


class WireBytes(_Model):
    """Bytes on the wire per measured iteration of a training job, from the interface counters."""

    sent_per_iter: list[float]  # per worker (rank order): frame bytes its interface sent, median over repeats
    mean_per_worker: float  # their mean
    ring_allreduce_bytes: float | None = None  # 2(n-1)/n x the gradient bytes: a ring all-reduce's per worker
    iterations: Int64  # measured iterations the figures come from, over the repeats
    source: str


class LinkInfo(_Model):
    """The shaped link a multi-worker job ran on (schema 16)."""

    asked: str  # as given to --link: "1gbit", "10gbit,50us"
    rate_bps: Int64
    delay_s: float = 0.0  # added by each worker's egress (a round trip crosses two)
    shaping: str  # the qdiscs on each worker's egress
    subnet: str  # the workers' addresses, inside their namespaces only
    measured: LinkMeasurement | None = None
    wire: WireBytes | None = None  # training runs
    wire_reason: str | None = None  # why a training run has no `wire`


class Record(_Model):
    schema_version: Int64 = SCHEMA_VERSION
    run_id: RunId
    started_at: datetime
    ended_at: datetime
    dlbench: dict[str, Any]  # version, commit, dirty
    suite: str
    benchmark: str
    network: NetworkInfo
    workload: Workload
    framework: dict[str, Any]  # name, version, build, devices (as the runner reported them)
    environment: dict[str, Any]  # backend, flavour, python, key, packages
    machine: dict[str, Any]
    settings: Settings
    repeats: list[Repeat] = []
    summary: Summary | None = None
    params: Int64 | None = Field(None, description="trainable parameters as the framework built them")
    status: Status
    reason: str | None = None
    output_tail: str = ""
    equivalence: dict[str, Any] = {"status": "unchecked"}
    telemetry: dict[str, Any] = {"enabled": False}
    repeat_policy: RepeatPolicy | None = None  # None in records before schema 4
    distributed: DistributedInfo | None = None  # multi-worker runs (schema 5)
    comm: CommInfo | None = None  # collective runs (schema 5)
    prediction: Prediction | None = None  # the performance model's, made before the run (schema 5)
    loadgen: LoadGenInfo | None = None  # MLPerf LoadGen scenario runs (schema 9)
    generation: GenerationSummary | None = None  # mode generate (schema 10)
    convergence: ConvergenceInfo | None = None  # time to accuracy (schema 11)
    link: LinkInfo | None = None  # a job on a shaped link (schema 16)
