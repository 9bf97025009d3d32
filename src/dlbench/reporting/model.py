"""The site's view model: built once from the store, laid out by the templates.

Two levels, so that a 10,000-run store fits in memory and in time:
  RunView    a run's few dozen figures and keys, made from its full record (in a worker process
             when the store is large) and small enough to send back to the parent;
  SiteModel  everything the aggregate pages show (leaderboards, benchmark pages, history series),
             built from the RunViews alone.
A run's own page is rendered from its full record (run_page.py) where the record is read.

Grouping:
  board      (suite, hardware): one leaderboard. Hardware is what the figure depends on, not the
             host: the GPU model (and count) on a CUDA run, the CPU model and thread count on a
             CPU run, so that identical machines share a board.
  entry      (benchmark, batch size, precision, compile mode) on a board: frameworks ranked by
             throughput, a shared rank (or a range of ranks) where the data does not separate them
             (analysis/ranking.py: pairwise process-level tests, Holm-adjusted over the board). Precision and compile mode are measured axes (record schema 6): a compiled
             step and an eager one, or fp32 and amp_bf16, are different quantities.
  benchmark  (suite, hardware, benchmark): one benchmark page, every batch size, precision and
             compile mode (the precision x compile grid per framework).
  series     (suite, hardware, benchmark, batch, precision, framework, host, compile mode): one
             history line.
  speedup    (framework, benchmark, batch, precision) on one hardware with both an eager and a
             compiled successful run: compiled / eager throughput of the shown (latest successful)
             runs, i.e. the ratio of their median iteration times.
The figure shown for an entry and framework is that of its latest successful run; the run's
own page (date, versions, machine) is one click from the number.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from ..analysis.convergence import median_run
from ..axes import OTHER_AXES, Compile, Precision
from ..store.intervals import reported_interval
from ..store.record import Record
from ..store.rows import allocator_peak_mb, run_tokens_per_s
from ..store.utilisation import Peaks, model_flops_per_iter, model_tflops

SAFE_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,80}$")


_NOT_SLUG = re.compile(r"[^a-z0-9]+")


@functools.lru_cache(maxsize=8192)  # the same few statuses and names, on every row of a 10,000-run table
def slug(text: str, limit: int = 40) -> str:
    """Lower-case letters, digits and dashes only: safe in a file name and a URL, whatever `text` is."""
    return _NOT_SLUG.sub("-", text.lower()).strip("-")[:limit] or "x"


def _digest(*parts: object) -> str:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:10]


def run_page_name(run_id: str) -> str:
    """runs/<run id>.html; a run id that is not a plain token (a crafted record) gets a slug + digest."""
    if SAFE_RUN_ID.match(run_id):
        return f"runs/{run_id}.html"
    return f"runs/{slug(run_id)}-{_digest(run_id)}.html"


def network_page_name(definition_hash: str) -> str:
    """networks/<hash>.json: one file per network definition, shared by every run of it."""
    return f"networks/{slug(definition_hash, 64)}.json"


def hardware_label(r: Record) -> str:
    m = r.machine
    gpus = [str(g.get("name") or "GPU") for g in m.get("gpus", []) if isinstance(g, dict)]
    if r.workload.device == "cuda":
        if not gpus:  # never put a GPU run on a CPU board, even when its fingerprint lacks the GPU
            return f"unidentified GPU on {m.get('cpu_model') or 'unknown CPU'}"
        names = sorted(set(gpus))
        return " + ".join(f"{n} x{gpus.count(n)}" if gpus.count(n) > 1 else n for n in names)
    threads = r.settings.threads_requested or m.get("cpu_available") or "?"
    return f"{m.get('cpu_model') or 'unknown CPU'} · {threads} threads"


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class RunView:
    """What the aggregate pages need of one run."""

    run_id: str
    page: str  # path of the run's page, relative to the site's root
    started_at: datetime
    suite: str
    benchmark: str
    network: str
    mode: str
    framework: str
    framework_version: str
    device: str
    batch_size: int
    precision: str
    hardware: str
    hostname: str
    machine_id: str
    dlbench_version: str
    profile: str
    status: str
    reason: str | None
    equivalence: str
    compile: str = "eager"  # eager | compiled (workload.compile, schema 6)
    compile_requested: str = "default"  # default | eager | compiled: what the run asked for
    compile_mode: str | None = None  # torch.compile's mode, where one was asked
    # the run's value of each of OTHER_AXES, in order: keys apart what differs in them
    other_axes: tuple[str | None, ...] = ()
    samples_per_s: float | None = None
    sps_low: float | None = None  # confidence interval of the throughput (None: not in the record)
    sps_high: float | None = None
    ci_level: float | None = None
    ci_note: str | None = None  # how the interval was made, for a tooltip
    ci_nominal: bool = True  # False: one process, not a 95% interval of the run's median (store/intervals.py)
    tokens_per_s: float | None = None  # token networks: samples/s x sequence length (store/utilisation.py)
    model_tflops: float | None = None  # achieved model FLOP/s (forward x 3 in training), 1e12
    mfu: float | None = None  # model FLOP/s / the machine profile's peak matmul rate in the run's precision
    mfu_note: str | None = None  # the peak divided by and its profile, or why there is no MFU
    ms_per_iter: float | None = None
    iqr_ms: float | None = None
    cv: float | None = None
    stable: bool | None = None
    stability_note: str | None = None
    box_ms: tuple[float, float, float, float, float] | None = None  # min, q1, median, q3, max
    repeat_medians_ms: tuple[float, ...] = ()
    first_iter_ms: float | None = None
    compile_ms: float | None = None  # Summary.compile_s: first iteration less the steady median
    alloc_peak_mb: float | None = None  # the framework allocator's peak over the repeats (store/rows.py)
    alloc_note: str | None = None  # the allocator's source, or why no repeat could read a peak
    joules_per_sample: float | None = None
    avg_power_w: float | None = None
    energy_missing: str | None = None
    repeats: int = 0
    iterations: int = 0
    # mode generate (record.generation, schema 10): medians and 99th percentiles per request, ms
    ttft_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_ms: float | None = None
    tpot_p99_ms: float | None = None
    network_page: str = ""  # the network definition's JSON file in the site
    # a LoadGen scenario run (schema 9): LoadGen's verdict, its figure, its per-sample latency
    # percentiles ((percentile, ms), ...) and throughput; such a run is on its benchmark page, never
    # on a leaderboard or a history series (its figure is not the harness's back-to-back throughput)
    scenario: str | None = None
    loadgen_validity: str | None = None
    loadgen_reason: str | None = None
    loadgen_metric: str | None = None
    loadgen_value: float | None = None
    loadgen_samples_per_s: float | None = None
    latency_pct_ms: tuple[tuple[float, float], ...] = ()
    # convergence runs (schema 11): the score, epochs, runs that reached the target, input-bound
    # share, and the accuracy curve ((epoch, accuracy), ...) of the median run (analysis/convergence.py)
    time_to_target_s: float | None = None
    epochs_to_target: float | None = None
    reached: str | None = None
    target: float | None = None
    input_bound_pct: float | None = None
    accuracy_curve: tuple = ()
    # a data-parallel run (schemas 5, 16, 17, 20): its workers, the shaped link it ran on (as asked
    # and its rate), its gradient compression; a compressed convergence run's speedup over the
    # dense run of its invocation (score against score) or why there is none
    workers: int | None = None
    link: str | None = None
    link_rate_bps: float | None = None
    compression: str | None = None
    dense_speedup: float | None = None
    dense_reason: str | None = None

    def to_json(self) -> dict:
        # the fields are plain values and tuples of floats: no deep copy (dataclasses.asdict) needed
        data = {name: getattr(self, name) for name in _RUN_VIEW_FIELDS}
        data["started_at"] = self.started_at.isoformat()
        return data

    @classmethod
    def from_json(cls, data: dict) -> "RunView":
        data = dict(data)
        data["started_at"] = datetime.fromisoformat(data["started_at"])
        data["box_ms"] = tuple(data["box_ms"]) if data.get("box_ms") else None
        data["repeat_medians_ms"] = tuple(data.get("repeat_medians_ms") or ())
        data["latency_pct_ms"] = tuple(tuple(p) for p in data.get("latency_pct_ms") or ())
        data["accuracy_curve"] = tuple(tuple(p) for p in data.get("accuracy_curve") or ())
        data["other_axes"] = tuple(data.get("other_axes") or ())
        return cls(**data)

    @property
    def board_key(self) -> tuple[str, str]:
        return (self.suite, self.hardware)

    @property
    def entry_key(self) -> tuple[str, int, str, str]:
        # by the mode asked for: a default run ranks every framework as it runs when not told (torch
        # eager beside jax's jit), an explicit eager or compiled run ranks that mode everywhere
        return (self.benchmark, self.batch_size, self.precision, self.compile_requested, *self.other_axes)

    @property
    def benchmark_key(self) -> tuple[str, str, str]:
        return (self.suite, self.hardware, self.benchmark)

    @property
    def series_key(self) -> tuple:
        # per host, as `dlbench history` keys its series: two machines of one kind can still differ
        return (self.suite, self.hardware, self.benchmark, self.batch_size, self.precision, self.framework, self.hostname,
                self.compile, *self.other_axes)

    @property
    def variant(self) -> tuple:
        """(precision, compile mode, *other_axes): a column of the benchmark page's grid."""
        return (self.precision, self.compile, *self.other_axes)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.samples_per_s is not None

    @property
    def ci_half_width_pct(self) -> float | None:
        if self.sps_low is None or self.sps_high is None or not self.samples_per_s:
            return None
        return 100 * (self.sps_high - self.sps_low) / 2 / self.samples_per_s


_RUN_VIEW_FIELDS = tuple(f.name for f in dataclasses.fields(RunView))


def throughput_interval(r: Record) -> tuple[float | None, float | None, float | None, str | None, bool]:
    """(low, high, confidence, how, nominal) of the run's reported throughput interval
    (store/intervals.py), or Nones where the record holds nothing to make one from."""
    ci = reported_interval(r.summary, r.workload.batch_size)
    if ci is None:
        return None, None, None, None, True
    low, high = ci.samples_per_s
    return float(low), float(high), float(ci.confidence), ci.note, ci.nominal


def stability(r: Record) -> tuple[bool | None, str | None]:
    """(stable, reason) from Summary.stability; (None, None) where the record has no verdict."""
    verdict = getattr(r.summary, "stability", None) if r.summary is not None else None
    if verdict is None:
        return None, None
    return (not verdict.unstable), verdict.reason


def allocator_note(r: Record) -> str | None:
    """Where the allocator peak came from, or why no repeat has one (Repeat.memory, schema 6)."""
    memories = [rep.memory for rep in r.repeats if isinstance(rep.memory, dict)]
    sources = sorted({str(m["source"]) for m in memories if m.get("peak_allocated_bytes") is not None and m.get("source")})
    if sources:
        return ", ".join(sources)
    reasons = sorted({str(m["unavailable"]) for m in memories if m.get("unavailable")})
    if reasons:
        return "; ".join(reasons)
    return "not recorded (a record before schema 6)" if not memories else None


def utilisation(r: Record, peaks: Peaks | None) -> dict:
    """tokens/s, model TFLOP/s and MFU as the results rows derive them (store/utilisation.py);
    `peaks`: the store's machine profiles (None: no profiles, so every MFU says "no profile")."""
    s = r.summary
    tflops = model_tflops(model_flops_per_iter(r.workload.mode, r.workload.batch_size, r.network.flops_per_sample),
                          s.median_s if s else None)
    found = (peaks or Peaks(None)).mfu(
        tflops=tflops, precision=r.workload.precision, machine_id=str(r.machine.get("machine_id") or ""),
        device=r.workload.device, threads=r.settings.threads_requested,
        workers=r.distributed.workers if r.distributed else None)
    return {"tokens_per_s": run_tokens_per_s(r, s.samples_per_s if s else None),
            "model_tflops": tflops, "mfu": found.mfu, "mfu_note": found.source or found.reason}


def loadgen_fields(r: Record) -> dict:
    """A LoadGen scenario run's part of its RunView (nothing for other runs)."""
    info = r.loadgen
    if info is None:
        return {"scenario": r.workload.scenario}
    pct = sorted((float(k), v / 1e6) for k, v in info.result.latency_ns.items() if k.replace(".", "").isdigit())
    return {"scenario": info.scenario, "loadgen_validity": info.result.validity,
            "loadgen_reason": "; ".join(info.result.invalid_reasons) or None, "loadgen_metric": info.metric,
            "loadgen_value": info.metric_value, "loadgen_samples_per_s": info.result.samples_per_s,
            "latency_pct_ms": tuple(pct)}


def run_view(r: Record, page: str | None = None, peaks: Peaks | None = None) -> RunView:
    """`page`: where the run's page is written (default: from its run id); `peaks`: the store's
    machine profiles, for the run's MFU."""
    s = r.summary
    tel = (r.telemetry or {}).get("summary") or {}
    missing = tel.get("missing") or {}
    low, high, level, how, nominal = throughput_interval(r)
    stable, note = stability(r)
    energy_missing = None
    if tel.get("joules_per_sample") is None:
        energy_missing = (missing.get("joules_per_sample") or (r.telemetry or {}).get("reason")
                          or ("telemetry off" if not (r.telemetry or {}).get("enabled") else "not measured"))
    return RunView(
        run_id=r.run_id, page=page or run_page_name(r.run_id), started_at=r.started_at, suite=r.suite,
        benchmark=r.benchmark, network=r.network.name, mode=r.workload.mode,
        framework=str(r.framework.get("name") or "?"), framework_version=str(r.framework.get("version") or "?"),
        device=r.workload.device, batch_size=r.workload.batch_size, precision=r.workload.precision,
        hardware=hardware_label(r), hostname=str(r.machine.get("hostname") or "?"),
        machine_id=str(r.machine.get("machine_id") or ""), dlbench_version=str(r.dlbench.get("version") or "?"),
        profile=r.settings.profile, status=r.status, reason=r.reason,
        equivalence=str(r.equivalence.get("status") or "unchecked"),
        compile=r.workload.compile, compile_requested=r.workload.compile_requested,
        other_axes=_set_axes(tuple(getattr(r.workload, a.field) for a in OTHER_AXES)),
        compile_mode=r.workload.compile_mode,
        samples_per_s=s.samples_per_s if s else None, sps_low=low, sps_high=high, ci_level=level, ci_note=how,
        ci_nominal=nominal,
        ms_per_iter=s.ms_per_iter if s else None, iqr_ms=s.iqr_s * 1e3 if s else None, cv=s.cv if s else None,
        stable=stable, stability_note=note,
        box_ms=tuple(v * 1e3 for v in (s.min_s, s.q1_s, s.median_s, s.q3_s, s.max_s)) if s else None,
        repeat_medians_ms=tuple(v * 1e3 for v in s.repeat_medians_s) if s else (),
        first_iter_ms=s.first_iter_s * 1e3 if s and s.first_iter_s is not None else None,
        compile_ms=s.compile_s * 1e3 if s and s.compile_s is not None else None,
        alloc_peak_mb=allocator_peak_mb(r), alloc_note=allocator_note(r),
        joules_per_sample=_number(tel.get("joules_per_sample")), avg_power_w=_number(tel.get("avg_power_w")),
        energy_missing=energy_missing, repeats=s.repeats if s else len(r.repeats),
        iterations=s.iterations if s else 0, network_page=network_page_name(r.network.hash),
        **utilisation(r, peaks), **loadgen_fields(r), **_generation_figures(r), **_convergence_view(r),
        **_data_parallel_view(r),
    )


def _data_parallel_view(r: Record) -> dict:
    """Workers, link and compression of a multi-worker run (none for a single-process one)."""
    if r.distributed is None:
        return {}
    out = {"workers": r.distributed.workers, "compression": r.workload.compression}
    if r.link is not None:
        out.update(link=r.link.asked, link_rate_bps=r.link.rate_bps)
    against = r.convergence.against_dense if r.convergence else None
    if against is not None:
        out.update(dense_speedup=against.score_speedup, dense_reason=against.reason)
    return out


def _generation_figures(r: Record) -> dict:
    """TTFT and TPOT (median, 99th percentile, ms) of a generate run, LoadGen's for one under its
    server (schema 13); nothing for the others."""
    g = r.generation
    out = {}
    if g is None and r.loadgen is not None and r.loadgen.generation:
        for key, values in (("ttft", r.loadgen.result.ttft_ns), ("tpot", r.loadgen.result.tpot_ns)):
            if "50.00" in values and "99.00" in values:
                out.update({f"{key}_ms": values["50.00"] / 1e6, f"{key}_p99_ms": values["99.00"] / 1e6})
        return out
    for key, dist in (("ttft", g.ttft if g else None), ("tpot", g.tpot if g else None)):
        if dist is not None:
            out.update({f"{key}_ms": dist.median * 1e3, f"{key}_p99_ms": dist.p99 * 1e3})
    return out


def _convergence_view(r: Record) -> dict:
    c = r.convergence
    if c is None:
        return {}
    run = median_run(c)
    return {"time_to_target_s": c.score_s, "epochs_to_target": c.epochs_to_target,
            "reached": f"{c.reached}/{len(c.runs)}", "target": c.target,
            "input_bound_pct": c.input_bound_share * 100 if c.input_bound_share is not None else None,
            "accuracy_curve": tuple((e["epoch"], e["accuracy"]) for e in run.evals) if run else ()}


# ------------------------------------------------------------------ aggregates


@dataclass
class Ranked:
    """One framework's place in one leaderboard entry."""

    framework: str
    shown: RunView  # the latest successful run, else the latest run
    rank: int | None  # None: no successful run; else the best rank the data allows (analysis/ranking.py)
    relative: float | None  # throughput / the entry's best
    runs: int  # every run of this entry and framework
    latest_failed: RunView | None = None  # a run after the shown one that did not succeed
    rank_high: int | None = None  # the worst rank the data allows
    rank_label: str = "–"  # "2", "1=" (tied), "1–3" (a range)


@dataclass
class Entry:
    benchmark: str
    batch_size: int
    precision: str
    compile: str
    benchmark_page: str
    rows: list[Ranked]
    other_axes: tuple[str | None, ...] = ()  # the entry's value of each of OTHER_AXES


@dataclass
class Speedup:
    """Compiled over eager on one hardware: the shown (latest successful) run of each mode."""

    framework: str
    benchmark: str
    batch_size: int
    precision: str
    eager: RunView
    compiled: RunView
    benchmark_page: str = ""

    @property
    def ratio(self) -> float:
        # compiled / eager samples/s = eager median / compiled median (samples/s = batch / median)
        return self.eager.ms_per_iter / self.compiled.ms_per_iter


@dataclass
class GridCell:
    """One (precision, compile) column of one framework and batch on a benchmark page."""

    shown: RunView | None  # the latest successful run, else the latest run; None: never run
    runs: int = 0

    @property
    def ok(self) -> bool:
        return self.shown is not None and self.shown.ok


@dataclass
class GridRow:
    framework: str
    batch_size: int
    cells: list[GridCell]  # one per BenchmarkPage.variants, in that order


@dataclass
class Score:
    framework: str
    versions: list[str]
    score: float | None  # geometric mean of relative throughput over the entries it completed
    completed: int
    total: int
    rank: int | None
    equivalence: dict[str, int]  # status -> entries
    low: float | None = None  # the score's interval (analysis/ranking.py)
    high: float | None = None
    rank_high: int | None = None
    rank_label: str = "–"


@dataclass
class Board:
    suite: str
    hardware: str
    device: str
    anchor: str
    entries: list[Entry]
    scores: list[Score]
    latest: datetime
    precisions: list[str] = field(default_factory=list)
    compiles: list[str] = field(default_factory=list)
    speedups: list[Speedup] = field(default_factory=list)  # every benchmark of the board
    ranking: str = ""  # how this board's ranks were decided, in a sentence


@dataclass
class BenchmarkPage:
    suite: str
    hardware: str
    benchmark: str
    page: str
    board_anchor: str
    runs: list[RunView]  # every run, newest first
    latest: dict[tuple, RunView]  # (framework, batch, *variant) -> latest successful
    frameworks: list[str]
    batch_sizes: list[int]
    history_anchors: list[tuple[str, str]]  # (label, anchor on history.html)
    variants: list[tuple] = field(default_factory=list)  # (precision, compile, *other_axes) present, sorted
    grid: list[GridRow] = field(default_factory=list)  # framework x batch rows, a cell per variant
    speedups: list[Speedup] = field(default_factory=list)
    # LoadGen scenario runs: (framework, scenario) -> the latest one that completed
    loadgen: dict[tuple[str, str], RunView] = field(default_factory=dict)
    timed: bool = True  # whether any run is the harness's own timing (not LoadGen's)

    @property
    def precisions(self) -> list[str]:
        return sorted({v[0] for v in self.variants})

    @property
    def compiles(self) -> list[str]:
        return sorted({v[1] for v in self.variants})


@dataclass
class HistorySeries:
    key: tuple
    anchor: str
    label: str
    benchmark_page: str
    points: list[RunView]  # successful runs, oldest first
    failures: int
    change_points: list[dict] = field(default_factory=list)  # {"run_id", "when", "step_pct", "page"}


@dataclass
class SiteModel:
    generated_at: datetime
    dlbench_version: str
    runs: list[RunView]  # newest first
    boards: list[Board]
    benchmarks: list[BenchmarkPage]
    history: list[HistorySeries]
    status_counts: dict[str, int]
    problems: list[tuple[str, str]]  # (path, reason) of records that could not be read
    frameworks: list[str]
    history_note: str | None = None  # why change points are not marked, where they are not
    history_method: str = ""  # how change points were found (markup written by dlbench, shown on the history page)
    comparison: object | None = None  # set by the site writer for --compare
    compiles: list[str] = field(default_factory=list)  # the compile modes of every run

    @property
    def speedups(self) -> list[Speedup]:
        return [s for b in self.boards for s in b.speedups]


def benchmark_page_name(key: tuple[str, str, str]) -> str:
    suite, hardware, benchmark = key
    return f"benchmarks/{slug(suite, 20)}--{slug(benchmark)}--{slug(hardware, 30)}-{_digest(*key)}.html"


def board_anchor(key: tuple[str, str]) -> str:
    return f"board-{slug(key[0], 20)}-{_digest(*key)}"


def series_anchor(key: tuple) -> str:
    # an eager series keeps the anchor it had before the compile mode joined the key (links stay valid)
    digest = _digest(*key[:7], *key[8:]) if len(key) > 7 and key[7] == "eager" else _digest(*key)
    return f"series-{slug(key[2])}-{slug(key[5], 20)}-{digest}"


# The report lays out precision and compile mode itself (a benchmark page's grid, the compiled/eager
# speedups); each of OTHER_AXES keeps apart the leaderboard entries, grid columns and history series
# of runs that differ in it, its value named beside theirs.

# the axes' declared order is their display order
COMPILE_ORDER = {c.value: i for i, c in enumerate(Compile)}
PRECISION_ORDER = {p.value: i for i, p in enumerate(Precision.runs())}


def variant_order(variant: tuple) -> tuple:
    """fp32 before tf32 before the AMP modes, eager before compiled; unknown names after, by name;
    then the other axes' values (absent first), each in its axis's declared order."""
    precision, compile_, *others = variant
    return (PRECISION_ORDER.get(precision, 9), precision, COMPILE_ORDER.get(compile_, 9), compile_,
            *(_value_order(a, v) for a, v in zip(OTHER_AXES, others)))


def _value_order(spec, value: str | None) -> tuple:
    names = [v.value for v in spec.axis]
    return (-1, "") if value is None else (names.index(value) if value in names else len(names), value)


def speedups(latest: dict[tuple, RunView], benchmark: str, page: str = "") -> list[Speedup]:
    """Compiled over eager for every (framework, batch, precision) with both modes in `latest`
    ((framework, batch, precision, compile, *other_axes) -> the shown successful run, of one benchmark on
    one hardware)."""
    found = []
    # the other axes' values by name: one of them may be None (not recorded) beside a named one
    for (fw, batch, precision, mode, *others), eager in sorted(latest.items(), key=lambda kv: (*kv[0][:4], *map(str, kv[0][4:]))):
        compiled = latest.get((fw, batch, precision, "compiled", *others))
        if mode == "eager" and compiled is not None and eager.ok and compiled.ok and eager.ms_per_iter and compiled.ms_per_iter:
            found.append(Speedup(fw, benchmark, batch, precision, eager, compiled, page))
    return sorted(found, key=lambda s: (s.framework, s.batch_size, variant_order((s.precision, "")), s.benchmark))


def _grid(runs: list[RunView], variants: list[tuple]) -> list[GridRow]:
    cells: dict[tuple, list[RunView]] = defaultdict(list)
    for v in runs:
        cells[(v.framework, v.batch_size, v.variant)].append(v)
    rows = []
    for fw, batch in sorted({(v.framework, v.batch_size) for v in runs}, key=lambda k: (k[1], k[0])):
        row = []
        for variant in variants:
            mine = cells.get((fw, batch, variant), [])
            ok = [v for v in mine if v.ok]
            row.append(GridCell(_latest(ok) if ok else _latest(mine) if mine else None, len(mine)))
        rows.append(GridRow(fw, batch, row))
    return rows


def _latest(runs: list[RunView]) -> RunView:
    return max(runs, key=lambda v: (v.started_at, v.run_id))


def _rank_entry(runs_by_framework: dict[str, list[RunView]]) -> list[Ranked]:
    rows = []
    for framework, runs in runs_by_framework.items():
        ok = [v for v in runs if v.ok]
        latest = _latest(runs)
        shown = _latest(ok) if ok else latest
        failed_after = latest if ok and latest is not shown and not latest.ok else None
        rows.append(Ranked(framework, shown, None, None, len(runs), failed_after))
    best = max((r.shown.samples_per_s for r in rows if r.shown.ok), default=None)
    rows.sort(key=lambda r: (not r.shown.ok, -(r.shown.samples_per_s or 0), r.framework))
    for r in rows:
        if r.shown.ok:
            r.relative = r.shown.samples_per_s / best if best else None
    return rows  # ranked with the rest of the board (_rank_board)


def _contestant(v: RunView):
    from ..analysis.ranking import Contestant

    processes = tuple(v.batch_size * 1e3 / ms for ms in v.repeat_medians_ms if ms > 0)
    return Contestant(v.framework, v.samples_per_s, processes, v.sps_low, v.sps_high)


def _rank_board(entries: list[Entry], scores: list[Score]) -> str:
    """Ranks (ranges where the data does not separate frameworks) of every entry and of the scores,
    from analysis/ranking.py; returns the sentence that says how they were decided."""
    from ..analysis.ranking import ALPHA, CONFIDENCE, rank_board

    contestants = [[_contestant(r.shown) for r in e.rows if r.shown.ok] for e in entries]
    ranks = rank_board(contestants, {s.framework: (s.score, s.completed) for s in scores})
    for e, placed in zip(entries, ranks.entries):
        for r in e.rows:
            if r.framework in placed:
                p = placed[r.framework]
                r.rank, r.rank_high, r.rank_label = p.low, p.high, p.label
    for s in scores:
        if s.framework in ranks.score_placings:
            p = ranks.score_placings[s.framework]
            s.rank, s.rank_high, s.rank_label = p.low, p.high, p.label
        if s.framework in ranks.scores:
            s.low, s.high = ranks.scores[s.framework].low, ranks.scores[s.framework].high
    untested = sum(p.p is None for ps in ranks.pairs for p in ps)
    return (f"{ranks.tests} pairwise comparisons of frameworks on this board's benchmarks, Holm-adjusted together "
            f"at {ALPHA:g}" + (f"; {untested} pairs with a one-process run decided by their intervals" if untested else "")
            + f"; scores: {len(ranks.score_pairs)} comparisons over {CONFIDENCE:.0%} score intervals' draws")


def _scores(entries: list[Entry]) -> list[Score]:
    from scipy.stats import (
        gmean,  # here: the processes that render run pages never need scipy
    )

    frameworks = sorted({r.framework for e in entries for r in e.rows})
    total = sum(1 for e in entries if any(r.shown.ok for r in e.rows))
    scores = []
    for fw in frameworks:
        mine = [r for e in entries for r in e.rows if r.framework == fw]
        relative = [r.relative for r in mine if r.relative]
        equivalence: dict[str, int] = defaultdict(int)
        for r in mine:
            equivalence[r.shown.equivalence] += 1
        scores.append(Score(fw, sorted({r.shown.framework_version for r in mine}),
                            float(gmean(relative)) if relative else None, len(relative), total, None,
                            dict(equivalence)))
    # Completing every entry comes first: a score over fewer entries is not comparable.
    scores.sort(key=lambda s: (s.score is None, -s.completed, -(s.score or 0), s.framework))
    return scores  # ranked with the board's entries (_rank_board)


def build_model(views: list[RunView], problems: list[tuple[str, str]], generated_at: datetime,
                dlbench_version: str) -> SiteModel:
    by_board: dict[tuple, dict[tuple, dict[str, list[RunView]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    by_benchmark: dict[tuple, list[RunView]] = defaultdict(list)
    by_series: dict[tuple, list[RunView]] = defaultdict(list)
    for v in views:
        by_benchmark[v.benchmark_key].append(v)
        if v.scenario is None:  # LoadGen's figures are on the benchmark page only
            by_board[v.board_key][v.entry_key][v.framework].append(v)
            by_series[v.series_key].append(v)

    boards = []
    for key in sorted(by_board):
        entries = [Entry(bench, batch, precision, mode, benchmark_page_name((key[0], key[1], bench)),
                         _rank_entry(by_board[key][(bench, batch, precision, mode, *others)]), tuple(others))
                   for bench, batch, precision, mode, *others in sorted(by_board[key],
                                                                       key=lambda k: (k[:2], variant_order(k[2:])))]
        runs = [r.shown for e in entries for r in e.rows]
        board_speedups = []
        for bench in sorted({e.benchmark for e in entries}):
            shown = {(r.framework, e.batch_size, e.precision, r.shown.compile, *e.other_axes): r.shown
                     for e in entries if e.benchmark == bench for r in e.rows if r.shown.ok}
            board_speedups += speedups(shown, bench, benchmark_page_name((key[0], key[1], bench)))
        scores = _scores(entries)
        ranking = _rank_board(entries, scores)
        boards.append(Board(key[0], key[1], runs[0].device, board_anchor(key), entries, scores,
                            max(v.started_at for v in runs), sorted({e.precision for e in entries}),
                            sorted({r.shown.compile for e in entries for r in e.rows},
                                   key=lambda c: (COMPILE_ORDER.get(c, 9), c)),
                            board_speedups, ranking))

    # the compile mode is named in a series' label only where its benchmark has series of several modes
    modes_per_benchmark: dict[tuple, set[str]] = defaultdict(set)
    for key in by_series:
        modes_per_benchmark[key[:3]].add(key[7])
    history = []
    for key in sorted(by_series, key=lambda k: tuple(map(str, k))):
        runs = sorted(by_series[key], key=lambda v: (v.started_at, v.run_id))
        ok = [v for v in runs if v.ok]
        suite, hardware, bench, batch, precision, fw, host, mode, *others = key
        label = f"{bench} · batch {batch} · {precision}"
        if len(modes_per_benchmark[key[:3]]) > 1:
            label += f" · {mode}"
        label += "".join(f" · {v}" for v in others if v is not None)
        history.append(HistorySeries(key, series_anchor(key), f"{label} · {fw} · host {host}",
                                     benchmark_page_name((suite, hardware, bench)), ok, len(runs) - len(ok)))
    series_by_benchmark: dict[tuple, list[HistorySeries]] = defaultdict(list)
    for s in history:
        series_by_benchmark[s.key[:3]].append(s)

    pages = []
    for key in sorted(by_benchmark):
        runs = sorted(by_benchmark[key], key=lambda v: (v.started_at, v.run_id), reverse=True)
        timed = [v for v in runs if v.scenario is None]
        latest: dict = {}
        loadgen: dict = {}
        for v in runs:  # newest first: the first successful one per (framework, batch, precision, compile) wins
            if v.ok and v.scenario is None:
                latest.setdefault((v.framework, v.batch_size, *v.variant), v)
            if v.scenario is not None and v.status == "ok" and v.latency_pct_ms:
                loadgen.setdefault((v.framework, v.scenario), v)
        variants = sorted({v.variant for v in timed}, key=variant_order)
        page = benchmark_page_name(key)
        pages.append(BenchmarkPage(
            key[0], key[1], key[2], page, board_anchor(key[:2]), runs, latest,
            sorted({v.framework for v in runs}), sorted({v.batch_size for v in timed}),
            [(s.label, s.anchor) for s in series_by_benchmark[key]],
            variants, _grid(timed, variants), speedups(latest, key[2], page),
            dict(sorted(loadgen.items())), bool(timed)))

    counts: dict[str, int] = defaultdict(int)
    for v in views:
        counts[v.status] += 1
    return SiteModel(generated_at, dlbench_version,
                     sorted(views, key=lambda v: (v.started_at, v.run_id), reverse=True),
                     boards, pages, history, dict(counts), problems, sorted({v.framework for v in views}),
                     compiles=sorted({v.compile for v in views}, key=lambda c: (COMPILE_ORDER.get(c, 9), c)))


def _set_axes(values: tuple) -> tuple:
    """The values of OTHER_AXES less the trailing unset ones, so a run no other axis applies to keys,
    anchors and sorts as it did before those axes existed."""
    values = list(values)
    while values and values[-1] is None:
        values.pop()
    return tuple(values)
