"""`check`: the frameworks build the same networks (shared weights and input, compared outputs and one
update; with mode generate, the decoder networks' greedy ids and first-step logits); each result is
kept in the store's checks/. Printing nothing: the command line (cli/check.py) renders what it returns.

    from dlbench.workflows import CheckRequest, check
    checked = check(CheckRequest(framework=["torch", "jax"], network=["fcn5"]))
    [(n.network, r.framework, r.status) for n in checked.networks for r in n.results]

Progress goes to `events`, an object with any of: environment(framework, progress) (an environment
being built: execution/environments.py's progress), network_started(network), network_checked(network,
results) (each network's results as they come, before the next one starts)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import paths
from ..definitions.loader import DefinitionError, load_network
from ..execution.backends import BACKENDS, backend
from ..execution.environments import EnvironmentBuildError
from ..store.store import StoreWriteError
from . import lookup
from .events import Silent
from .lookup import DEVICES, check_choice, resolved_device
from .requests import RequestError

CHECK_MODES = ("train", "generate")


@dataclass(frozen=True)
class CheckRequest:
    """`dlbench check`'s options: the frameworks (the first of them, torch when asked for, is the
    reference), the networks (None: every network; with mode generate, every decoder network a suite
    generates with), the precision (None: float64 in train mode, fp32 in generate mode) and, in train
    mode, a sequence length the longer token networks are checked at."""

    framework: list[str] = field(default_factory=lambda: ["all"])
    network: list[str] | None = None
    device: str = "cpu"
    env: str = "venv"
    store: Path | None = None
    timeout: float = 900.0
    precision: str | None = None
    mode: str = "train"
    sequence_length: int | None = None


@dataclass(frozen=True)
class NetworkCheck:
    """One network's results, one per framework (execution/equivalence.py's); in generate mode the
    prompt and new tokens it was generated with."""

    network: str
    results: list
    prompt: int | None = None
    new_tokens: int | None = None


@dataclass(frozen=True)
class CheckResults:
    """What a check found: the device it ran on, the precision and mode, the reference framework, each
    network's results (all saved in the store's checks/ but those in `unsaved`: StoreWriteErrors saying
    where each was kept instead), and the networks whose dropout the check forced to 0."""

    device: str
    precision: str
    mode: str
    reference: str
    networks: list[NetworkCheck]
    dropout_forced: list[str] = field(default_factory=list)
    unsaved: list[StoreWriteError] = field(default_factory=list)

    @property
    def failed(self) -> int:
        """The framework/network pairs that are not equivalent or could not be checked."""
        return sum(not r.ok for n in self.networks for r in n.results)


def check(request: CheckRequest, events=None) -> CheckResults:
    """Check what `request` asks (see CheckRequest); RequestError for bad input, before any environment is built."""
    from ..execution.equivalence import GENERATION_PRECISIONS, PRECISIONS

    r = request
    events = events or Silent()
    check_choice("device", r.device, DEVICES)
    check_choice("mode", r.mode, list(CHECK_MODES))
    precision = r.precision
    if r.mode == "generate":
        if r.sequence_length is not None:
            raise RequestError("--sequence-length is for --mode train; --mode generate uses each network's prompt and "
                               "new tokens of the smoke profile of its suite")
        precision = precision or "fp32"
        check_choice("precision", precision, GENERATION_PRECISIONS)
    precision = precision or "float64"
    check_choice("precision", precision, list(PRECISIONS))
    check_choice("environment backend", r.env, list(BACKENDS))
    registry = lookup.registry()
    runners = [lookup.runner(registry, n) for n in lookup.framework_names(registry, r.framework)]
    # torch is the reference when it is asked for: the others are compared against it.
    runners.sort(key=lambda x: x.name != "torch")
    catalog = lookup.catalog()
    names = r.network or catalog.network_names()
    for n in names:
        check_choice("network", n, catalog.network_names())
    if r.mode == "generate":
        return _check_generation(r, runners, names if r.network else None, precision, events)
    try:
        summaries = [load_network(catalog.networks_dir / f"{n}.yaml") for n in names]
        if r.sequence_length is not None:  # the longer token networks again at that length; the others as they are
            summaries = [load_network(catalog.networks_dir / f"{s.name}.yaml", r.sequence_length,
                                      (catalog.networks_dir / f"{s.name}.yaml", "--sequence-length"))
                         if s.resolved["input"].get("sequence_length", 0) > r.sequence_length else s
                         for s in summaries]
    except DefinitionError as e:
        raise RequestError(str(e)) from None
    from ..execution.equivalence import check_network
    from ..store.checks import CheckStore

    device = resolved_device(r.device)
    envs = _environments(runners, r.env, "cuda" if device == "cuda" else "cpu", events)
    # One step with the hyper-parameters each network trains with in its suite.
    step = {}
    for s in lookup.load_suites(catalog, "all", "smoke", "cpu"):
        for b in s.benchmarks:
            if b.mode == "train":
                step.setdefault(b.network.name, (b.learning_rate, b.momentum))
    checks = CheckStore(lookup.open_store(r.store).root)
    networks, unsaved = [], []
    for summary in summaries:
        lr, momentum = step.get(summary.name, (0.01, 0.9))
        events.network_started(summary.name)
        results = check_network(summary, envs, device, r.timeout, learning_rate=lr, momentum=momentum,
                                precision=precision)
        unsaved += _saved(checks, results)
        events.network_checked(summary.name, results)
        networks.append(NetworkCheck(summary.name, results))
    # the step is deterministic to be comparable: each framework would draw its own dropout masks
    dropped = [s.name for s in summaries if has_dropout(s.resolved)]
    return CheckResults(device=device, precision=precision, mode=r.mode, reference=runners[0].name,
                        networks=networks, dropout_forced=dropped, unsaved=unsaved)


def generation_sizes() -> dict[str, tuple[int, int]]:
    """network -> (prompt, new tokens) of the smoke profile of the suites that generate with it."""
    sizes: dict[str, tuple[int, int]] = {}
    for s in lookup.load_suites(lookup.catalog(), "all", "smoke", "cpu", ("generate",)):
        for b in s.benchmarks:
            if b.mode == "generate" and b.generation is not None:
                sizes.setdefault(b.network.name, (b.generation.prompt_length, b.generation.new_tokens))
    return sizes


def _check_generation(r: CheckRequest, runners, names: list[str] | None, precision: str, events) -> CheckResults:
    """mode generate: the decoder networks (those a suite generates with, at its smoke sizes), each
    framework's greedy ids and first-step logits against the reference's."""
    from ..definitions.generation import decoder_problem
    from ..execution.equivalence import check_generation
    from ..store.checks import CheckStore

    catalog = lookup.catalog()
    sizes = generation_sizes()
    try:
        if names is None:
            names = sorted(sizes)
        summaries = [load_network(catalog.networks_dir / f"{n}.yaml") for n in names]
    except DefinitionError as e:
        raise RequestError(str(e)) from None
    for s in summaries:
        why = decoder_problem(s.resolved)
        if why:
            raise RequestError(f"--mode generate: {why} (decoder networks: {', '.join(sorted(sizes)) or 'none'})")
    device = resolved_device(r.device)
    envs = _environments(runners, r.env, "cuda" if device == "cuda" else "cpu", events)
    checks = CheckStore(lookup.open_store(r.store).root)
    networks, unsaved = [], []
    for summary in summaries:
        prompt, new = sizes.get(summary.name, (8, 8))
        events.network_started(summary.name)
        results = check_generation(summary, envs, prompt, new, device, r.timeout, precision=precision)
        unsaved += _saved(checks, results)
        events.network_checked(summary.name, results)
        networks.append(NetworkCheck(summary.name, results, prompt, new))
    return CheckResults(device=device, precision=precision, mode=r.mode, reference=runners[0].name,
                        networks=networks, unsaved=unsaved)


def _saved(checks, results) -> list[StoreWriteError]:
    """Save each result; the errors of those the store refused (each kept in the spare store, while
    the other checks still go there or in place)."""
    unsaved = []
    for res in results:
        try:
            checks.save(res)
        except StoreWriteError as e:
            unsaved.append(e)
    return unsaved


def _environments(runners, env: str, flavour: str, events) -> list:
    """(runner, environment) for each runner, or (runner, EnvironmentBuildError) where it failed to
    build: that framework's checks are then skipped, the others still run."""
    chosen = backend(env, paths.cache_dir())
    envs = []
    for runner in runners:
        try:
            envs.append((runner, chosen.ensure(runner, flavour,
                                               lambda progress, name=runner.name: events.environment(name, progress))))
        except EnvironmentBuildError as e:
            envs.append((runner, e))
    return envs


def has_dropout(network: dict) -> bool:
    """A dropout layer, or attention dropout, at a rate above 0 anywhere in a resolved network."""
    return any(layer.get("rate", 0) > 0 if layer["type"] == "dropout" else layer.get("dropout", 0) > 0
               for layer in network["layers"])
