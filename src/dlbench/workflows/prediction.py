"""`predict`: an iteration's time per phase from a machine profile; with `suite`, the machines compared
on each of a suite's benchmarks (performance/choice.py); with `accuracy`, the prediction error of the
runs in the store. Printing nothing: the command line (cli/prediction.py) renders what it returns.

    from dlbench.workflows import PredictRequest, predict
    one = predict(PredictRequest(network="resnet50", framework="torch", batch=64, machine=["h100"]))
    one.prediction.iteration_s
    ranked = predict(PredictRequest(suite=["fcn"], machine=["a100", "h100"]))   # a MachineComparison

A machine profile is a calibrated one from the store, or a shipped datasheet machine (suites/machines/,
performance/datasheet.py) by its name. Bad input is one RequestError, raised before anything is predicted."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Union

from ..axes import PRECISIONS
from ..definitions.loader import DefinitionError
from ..machine import fingerprint
from ..store.store import Store
from . import lookup
from .lookup import check_choice
from .requests import RequestError

if TYPE_CHECKING:
    from ..performance.model import Prediction as IterationPrediction
    from ..store.profiles import MachineProfile
    from ..store.store import Unreadable

# the modes a prediction takes: the model predicts steps, so not generate's requests
PREDICTED_MODES = ("train", "infer")


@dataclass(frozen=True)
class PredictRequest:
    """`dlbench predict`'s options. One prediction needs network, framework and batch (one machine, one
    workers count); `suite` compares the `machine` profiles (and `workers` counts) on the suite's
    benchmarks, for `framework` ('all' when None, or a comma list); `accuracy` scores the runs in the
    store (of `suite` and `framework` only, when given), predicted again from one `machine` when
    `recompute`. `efficiency`: CLASS=VALUE settings or YAML files, for datasheet machines."""

    network: str | None = None
    framework: str | None = None
    batch: int | None = None
    mode: str = "train"
    workers: list[int] | None = None
    machine: list[str] | None = None
    efficiency: list[str] | None = None
    schedule: str | None = None
    precision: str = "fp32"
    threads: int | None = None
    io_bandwidth: float | None = None
    accuracy: bool = False
    recompute: bool = False
    suite: list[str] | None = None
    store: Path | None = None


@dataclass(frozen=True)
class SinglePrediction:
    """One prediction: the network's name, the request's settings, the profile predicted from, and
    performance/model.py's Prediction (phases, layers, notes)."""

    network: str
    framework: str
    batch: int
    mode: str
    precision: str
    workers: int
    profile: MachineProfile
    prediction: IterationPrediction


@dataclass(frozen=True)
class MachineComparison:
    """`suite` with the machines: performance/choice.py's rows (ranked per benchmark), for `frameworks`
    on `device`, and the profiles compared."""

    suites: list[str]
    frameworks: list[str]
    device: str
    profiles: list
    rows: list


@dataclass(frozen=True)
class PredictionAccuracy:
    """`accuracy`: each run's prediction error (`runs`, performance/accuracy.py prediction_errors), the
    groups of them (`groups`), the data term checks of convergence runs; `profile`: the one predicted
    from again (None: each record's stored prediction). `matching`: whether suites or frameworks chose
    the runs (no run at all says so). Files that could not be read are in `unreadable`, datasheets a
    run could not be predicted from in `problems`. `link_term`: each training run on a shaped link,
    its loopback run plus the link's α–β term against its measured iteration, and `crossovers` the
    predicted and measured bandwidth below which a compression beats dense
    (performance/link_term.py)."""

    store: Store
    profile: MachineProfile | None
    runs: list[dict]
    groups: list[dict]
    data_term: list
    matching: bool
    unreadable: list[Unreadable] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    link_term: list = field(default_factory=list)
    crossovers: list = field(default_factory=list)


PredictResult = Union[SinglePrediction, MachineComparison, PredictionAccuracy]


def predict(request: PredictRequest) -> PredictResult:
    """What `request` asks (see PredictRequest); RequestError for bad input, before anything is predicted."""
    from ..performance.communication import SCHEDULES

    r = request
    if r.io_bandwidth is not None and not 0 < r.io_bandwidth < math.inf:
        raise RequestError(f"--io-bandwidth must be a number of GB/s above 0, not {r.io_bandwidth:g}")
    machines, counts = r.machine or [], r.workers or [1]
    settings = efficiency_settings(r.efficiency)
    if r.accuracy:
        given = [o for o, v in (("--network", r.network), ("--batch", r.batch), ("--schedule", r.schedule))
                 if v is not None]
        if given or counts != [1]:
            raise RequestError(f"--accuracy scores the runs in the store; {', '.join(given) or '--workers'} is "
                               "for one prediction")
        if len(machines) > 1:
            raise RequestError("--accuracy --recompute predicts from one --machine")
        st = lookup.existing_store(r.store)
        profile = machine_profile(machines[0] if machines else None, st, settings) if r.recompute else None
        return prediction_accuracy(store=st, suites=r.suite, frameworks=[r.framework] if r.framework else None,
                                   profile=profile, io_bandwidth=r.io_bandwidth)
    if r.recompute:
        raise RequestError("--recompute and --runs go with --accuracy")
    if r.suite:
        given = [o for o, v in (("--network", r.network), ("--batch", r.batch), ("--io-bandwidth", r.io_bandwidth),
                                ("--threads", r.threads)) if v is not None]
        if given:
            raise RequestError(f"--suite compares machines on the suite's benchmarks; {', '.join(given)} is for "
                               "one prediction")
        frameworks = lookup.framework_names(lookup.registry(), [r.framework or "all"])
        if r.schedule is not None:
            check_choice("schedule", r.schedule, list(SCHEDULES))
        st = lookup.open_store(r.store)
        return compare_machines(suites=r.suite, frameworks=frameworks,
                                profiles=[machine_profile(m, st, settings) for m in machines or [None]],
                                workers=counts, schedule=r.schedule)
    if len(machines) > 1 or len(counts) > 1:
        raise RequestError("several --machine or --workers values go with --suite (one prediction takes one of each)")
    missing = [o for o, v in (("--network", r.network), ("--framework", r.framework), ("--batch", r.batch))
               if v is None]
    if missing:
        raise RequestError(f"predict needs {', '.join(missing)} (or --accuracy)")
    check_choice("framework", r.framework, lookup.registry().names())
    check_choice("mode", r.mode, list(PREDICTED_MODES))
    check_choice("precision", str(r.precision), list(PRECISIONS))
    if r.schedule is not None:
        check_choice("schedule", r.schedule, list(SCHEDULES))
    workers = counts[0]
    if workers > 1 and r.mode != "train":
        raise RequestError("--workers above 1 needs --mode train: only training exchanges gradients")
    return predict_one(network=r.network, framework=r.framework, batch=r.batch, mode=r.mode, workers=workers,
                       machine=machines[0] if machines else None, schedule=r.schedule, precision=str(r.precision),
                       threads=r.threads, io_bandwidth=r.io_bandwidth, store=lookup.open_store(r.store),
                       settings=settings)


def efficiency_settings(values: list[str] | None):
    """`efficiency`: (user files, CLASS=VALUE settings), checked; None when not given."""
    from ..definitions.machines import load_efficiency
    from ..performance.datasheet import parse_efficiency_setting

    if not values:
        return None
    files, settings = [], {}
    for v in values:
        if "=" not in v and Path(v).suffix in (".yaml", ".yml"):
            try:
                files.append(load_efficiency(Path(v)))
            except DefinitionError as e:
                raise RequestError(str(e)) from None
            continue
        try:
            name, number = parse_efficiency_setting(v)
        except ValueError as e:
            raise RequestError(str(e)) from None
        settings[name] = number
    return files, settings


def machine_profile(spec: str | None, store: Store, settings=None) -> MachineProfile:
    """A machine: a shipped datasheet machine by name (datasheet:NAME too), else what
    ProfileStore.resolve finds (a file, a machine id or hostname, this machine's latest)."""
    from ..performance.datasheet import DatasheetMachines
    from ..store.profiles import ProfileError, ProfileStore

    catalog = lookup.catalog()
    name = spec.removeprefix("datasheet:") if spec else None
    if name is not None and not Path(spec).is_file() and (name in catalog.machine_names() or spec != name):
        try:
            machines = DatasheetMachines(catalog.machines_dir)
            if settings is not None:
                files, values = settings
                eff = machines.efficiency
                for f in files:
                    eff = eff.overridden(f, origin="--efficiency file")
                machines.efficiency = eff.overridden(values=values, origin="--efficiency")
            return machines.profile(name, lookup.registry().names())
        except DefinitionError as e:
            raise RequestError(str(e)) from None
    if settings is not None:
        raise RequestError(f"--efficiency applies to datasheet machines ({', '.join(catalog.machine_names())}); "
                           f"--machine {spec or '(this machine)'} is a measured profile")
    try:
        return ProfileStore(store).resolve(spec, fingerprint()["machine_id"])
    except ProfileError as e:
        raise RequestError(str(e)) from None


def network_summary(network: str):
    """A network of suites/networks by name, or a path to its .yaml."""
    from ..definitions.loader import load_network

    catalog = lookup.catalog()
    path = catalog.networks_dir / f"{network}.yaml"
    if not path.is_file():
        candidate = Path(network)
        if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
            path = candidate
        else:
            raise RequestError(f"unknown network {network!r}; valid networks: {', '.join(catalog.network_names())} "
                               "(or a path to a .yaml file)")
    try:
        return load_network(path)
    except DefinitionError as e:
        raise RequestError(str(e)) from None


def predict_one(*, network: str, framework: str, batch: int, mode: str, workers: int, machine: str | None,
                schedule: str | None, precision: str, threads: int | None, io_bandwidth: float | None,
                store: Store, settings=None) -> SinglePrediction:
    from ..performance.model import DataPath, PredictionError
    from ..performance.model import predict as predict_iteration
    from ..performance.workload import decompose

    summary = network_summary(network)
    profile = machine_profile(machine, store, settings)
    work = decompose(summary.resolved, batch, mode, precision)
    path = DataPath(work.input_bytes_per_sample, read_bytes_per_s=io_bandwidth * 1e9 if io_bandwidth else None)
    try:
        p = predict_iteration(work, framework, profile, workers, schedule, data_path=path, threads=threads,
                              facts=lookup.runner(lookup.registry(), framework).model)
    except PredictionError as e:
        raise RequestError(str(e)) from None
    return SinglePrediction(network=summary.name, framework=framework, batch=batch, mode=mode, precision=precision,
                            workers=workers, profile=profile, prediction=p)


def prediction_accuracy(*, store: Store, suites: list[str] | None, frameworks: list[str] | None, profile,
                        io_bandwidth: float | None = None) -> PredictionAccuracy:
    from ..performance.accuracy import accuracy_table_rows, prediction_errors
    from ..performance.data_term import data_term_checks
    from ..performance.link_term import link_term_checks

    unreadable: list = []
    records = [r for r in store.records(unreadable)
               if (not suites or r.suite in suites) and (not frameworks or r.framework.get("name") in frameworks)]
    registry = lookup.registry()
    facts = {n: lookup.runner(registry, n).model for n in registry.names()}
    datasheets, match = _datasheets_of(records, registry.names())
    rows = prediction_errors(records, profile, facts, datasheets=datasheets, match_datasheet=match,
                             yardsticks=None if profile is not None else _stored_yardsticks(store, records))
    checks = data_term_checks(records, io_bandwidth * 1e9 if io_bandwidth else None)
    link_term, crossovers = link_term_checks(records)
    problems = sorted({f"{row['datasheet']}: {row['datasheet_problem']}" for row in rows
                       if row.get("datasheet_problem")})
    return PredictionAccuracy(store=store, profile=profile, runs=rows, groups=accuracy_table_rows(rows),
                              data_term=checks, matching=bool(suites or frameworks), unreadable=unreadable,
                              problems=problems, link_term=link_term, crossovers=crossovers)


def _stored_yardsticks(store: Store, records: list) -> dict:
    """The yardstick of each profile the records' stored predictions came from, by its ref; a profile
    no longer in this store (merged records) is left out: those runs are scored raw only."""
    from ..store.profiles import ProfileError, ProfileStore

    profiles, found = ProfileStore(store), {}
    for ref in {r.prediction.profile for r in records if r.prediction is not None and r.prediction.profile}:
        if ref.startswith("datasheet:"):
            continue
        try:
            found[ref] = profiles.resolve(ref, "").yardstick
        except ProfileError:
            continue
    return found


def _datasheets_of(records: list, frameworks: list[str]):
    """The datasheet machines whose GPU names match a CUDA run among `records`, as profiles, and the
    matcher (performance/accuracy.py datasheet_matcher); ({}, None) when no run matches one."""
    from ..performance.accuracy import datasheet_matcher
    from ..performance.datasheet import DatasheetMachines

    catalog = lookup.catalog()
    try:
        machines = DatasheetMachines(catalog.machines_dir)
        match = datasheet_matcher({name: machines.sheet(name).gpu_names for name in machines.names()})
        wanted = {match(r.machine) for r in records if r.workload.device == "cuda"} - {None}
        return {name: machines.profile(name, frameworks) for name in sorted(wanted)}, match if wanted else None
    except DefinitionError as e:
        raise RequestError(str(e)) from None


def compare_machines(*, suites: list[str], frameworks: list[str], profiles: list, workers: list[int],
                     schedule: str | None) -> MachineComparison:
    """performance/choice.py's rows for every framework and machine on each benchmark of `suites`."""
    from ..performance.choice import compare_machines as choice_rows
    from ..performance.choice import jobs_of_suite

    device = "cuda" if any(p.device == "cuda" for p in profiles) else profiles[0].device
    catalog = lookup.catalog()
    jobs = [job for name in suites for s in lookup.load_suites(catalog, name, "default", device)
            for job in jobs_of_suite(s.benchmarks)]
    registry = lookup.registry()
    rows = choice_rows(jobs, {f: lookup.runner(registry, f).model for f in frameworks}, profiles, workers, schedule)
    return MachineComparison(suites=suites, frameworks=frameworks, device=device, profiles=profiles, rows=rows)
