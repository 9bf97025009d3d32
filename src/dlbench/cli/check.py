"""`dlbench check`: the frameworks build the same networks (shared weights and input, compared
outputs and one update); each result is kept in the store's checks/."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from .. import paths
from ..definitions.loader import DefinitionError, load_network
from ..execution.backends import BACKENDS, backend
from ..execution.environments import EnvironmentBuildError
from ..store.store import StoreWriteError
from . import lookup
from .build_progress import BuildLog
from .console import err, fail, out
from .options import (
    DEVICES,
    DeviceOption,
    FrameworksOption,
    StoreOption,
    TimeoutOption,
    check_choice,
    resolve_device,
)
from .signals import stops_on_signals


@stops_on_signals
@lookup.reports_unsaved_records
def check(
    framework: FrameworksOption = ["all"],
    network: Annotated[Optional[list[str]], typer.Option(help="Only these networks; repeatable (default: all).")] = None,
    device: DeviceOption = "cpu",
    env: Annotated[str, typer.Option(help="venv | current | docker")] = "venv",
    store: StoreOption = None,
    timeout: TimeoutOption = 900.0,
    precision: Annotated[Optional[str], typer.Option(
        help="float64 (where rounding decides no ReLU or max-pool: every tensor gated to 1e-9; the default in "
             "train mode) | fp32 (the default in generate mode) | amp_bf16 | amp_fp16 (each framework's "
             "mixed-precision step against the reference framework's float64 one, to its unit roundoff scaled by "
             "the network's depth)")] = None,
    mode: Annotated[str, typer.Option(
        help="train (logits, loss and one SGD-momentum step) | generate (decoder networks: the first step's "
             "logits and the greedily generated ids, through each framework's key/value cache)")] = "train",
    sequence_length: Annotated[Optional[int], typer.Option(
        "--sequence-length", min=2,
        help="Check the token networks at this sequence length, or at their own context where that is shorter "
             "(default: each network's own context; a suite runs them at its own lengths, `dlbench list` shows "
             "them).")] = None,
) -> None:
    """Prove the frameworks build the same networks: shared weights and input, compared outputs and updates."""
    from ..execution.equivalence import GENERATION_PRECISIONS, PRECISIONS, check_network
    from ..store.checks import CheckStore

    check_choice("device", device, DEVICES)
    check_choice("mode", mode, ["train", "generate"])
    if mode == "generate":
        if sequence_length is not None:
            raise fail("--sequence-length is for --mode train; --mode generate uses each network's prompt and new "
                       "tokens of the smoke profile of its suite")
        precision = precision or "fp32"
        check_choice("precision", precision, GENERATION_PRECISIONS)
    precision = precision or "float64"
    check_choice("precision", precision, list(PRECISIONS))
    check_choice("environment backend", env, list(BACKENDS))
    registry = lookup.registry()
    runners = [lookup.runner(registry, n) for n in lookup.framework_names(registry, framework)]
    # torch is the reference when it is asked for: the others are compared against it.
    runners.sort(key=lambda r: r.name != "torch")
    catalog = lookup.catalog()
    names = network or catalog.network_names()
    for n in names:
        check_choice("network", n, catalog.network_names())
    if mode == "generate":
        check_generation_mode(runners, names if network else None, device, env, store, timeout, precision)
        return
    try:
        summaries = [load_network(catalog.networks_dir / f"{n}.yaml") for n in names]
        if sequence_length is not None:  # the longer token networks again at that length; the others as they are
            summaries = [load_network(catalog.networks_dir / f"{s.name}.yaml", sequence_length,
                                      (catalog.networks_dir / f"{s.name}.yaml", "--sequence-length"))
                         if s.resolved["input"].get("sequence_length", 0) > sequence_length else s for s in summaries]
    except DefinitionError as e:
        raise fail(str(e)) from None
    resolved_device = resolve_device(device)
    flavour = "cuda" if resolved_device == "cuda" else "cpu"
    envs = _environments(runners, env, flavour)
    # One step with the hyper-parameters each network trains with in its suite.
    step = {}
    for s in lookup.load_suites("all", "smoke", "cpu"):
        for b in s.benchmarks:
            if b.mode == "train":
                step.setdefault(b.network.name, (b.learning_rate, b.momentum))
    checks = CheckStore(lookup.open_store(store).root)
    table = Table(title=f"dlbench check ({resolved_device}, {precision}; reference: {runners[0].name})")
    for col in ("network", "framework", "version", "params", "status", "logits", "loss", "weights", "update",
                "worst tensor", "round trip"):
        table.add_column(col, justify="right" if col in ("params", "logits", "loss", "weights", "update", "round trip")
                         else "left")
    bad = 0
    unsaved: list[StoreWriteError] = []
    for summary in summaries:
        lr, momentum = step.get(summary.name, (0.01, 0.9))
        with err.status(f"checking {summary.name}"):
            results = check_network(summary, envs, resolved_device, timeout, learning_rate=lr, momentum=momentum,
                                    precision=precision)
        for res in results:
            try:
                checks.save(res)
            except StoreWriteError as e:  # kept in the spare store; the other checks still go there or in place
                unsaved.append(e)
            bad += not res.ok
            style = {"equivalent": "green", "reference": "cyan", "skipped": "yellow"}.get(res.status, "red")
            e = res.errors
            table.add_row(summary.name, res.framework, escape(res.framework_version or ""),
                          f"{res.params:,}" if res.params is not None else "", f"[{style}]{res.status}[/]",
                          *(f"{e[k]:.1e}" if k in e else "" for k in ("logits", "loss", "weights", "update")),
                          escape(res.worst_tensor or ""), f"{e['roundtrip']:.0e}" if "roundtrip" in e else "")
            if res.reason and res.status != "equivalent":
                err.print(f"[{style}]{res.status}[/] {summary.name} on {res.framework}: {escape(res.reason)}",
                          highlight=False, soft_wrap=True)
    dropped = [s.name for s in summaries if has_dropout(s.resolved)]
    if dropped:  # the step is deterministic to be comparable: each framework draws its own masks
        table.caption = (f"dropout forced to 0 in this check (timed runs use the network's rates): "
                         f"{', '.join(dropped)}")
    out.print(table)
    if unsaved:  # one error (reports_unsaved_records: exit 1), which says where they are kept
        more = f" ({len(unsaved) - 1} more check files kept beside it)" if len(unsaved) > 1 else ""
        raise StoreWriteError(str(unsaved[0]) + more, unsaved[0].kept)
    if bad:
        raise fail(f"{bad} framework/network pairs are not equivalent or could not be checked", 1)


def generation_sizes() -> dict[str, tuple[int, int]]:
    """network -> (prompt, new tokens) of the smoke profile of the suites that generate with it."""
    sizes: dict[str, tuple[int, int]] = {}
    for s in lookup.load_suites("all", "smoke", "cpu", ("generate",)):
        for b in s.benchmarks:
            if b.mode == "generate" and b.generation is not None:
                sizes.setdefault(b.network.name, (b.generation.prompt_length, b.generation.new_tokens))
    return sizes


def check_generation_mode(runners, names: list[str] | None, device: str, env: str, store, timeout: float,
                          precision: str) -> None:
    """`dlbench check --mode generate`: the decoder networks (those a suite generates with, at its
    smoke sizes), each framework's greedy ids and first-step logits against the reference's."""
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
        raise fail(str(e)) from None
    for s in summaries:
        why = decoder_problem(s.resolved)
        if why:
            raise fail(f"--mode generate: {why} (decoder networks: {', '.join(sorted(sizes)) or 'none'})")
    resolved_device = resolve_device(device)
    envs = _environments(runners, env, "cuda" if resolved_device == "cuda" else "cpu")
    checks = CheckStore(lookup.open_store(store).root)
    table = Table(title=f"dlbench check --mode generate ({resolved_device}, {precision}; reference: {runners[0].name})")
    for col in ("network", "framework", "version", "params", "prompt", "new", "status", "first logits", "ids differing"):
        table.add_column(col, justify="left" if col in ("network", "framework", "version", "status") else "right")
    bad = 0
    unsaved: list[StoreWriteError] = []
    for summary in summaries:
        prompt, new = sizes.get(summary.name, (8, 8))
        with err.status(f"checking {summary.name} (generate)"):
            results = check_generation(summary, envs, prompt, new, resolved_device, timeout, precision=precision)
        for res in results:
            try:
                checks.save(res)
            except StoreWriteError as e:
                unsaved.append(e)
            bad += not res.ok
            style = {"equivalent": "green", "reference": "cyan", "skipped": "yellow"}.get(res.status, "red")
            e = res.errors
            table.add_row(summary.name, res.framework, escape(res.framework_version or ""),
                          f"{res.params:,}" if res.params is not None else "", str(prompt), str(new),
                          f"[{style}]{res.status}[/]",
                          f"{e['first_logits']:.1e}" if "first_logits" in e else "",
                          f"{int(e['token_mismatches'])}" if "token_mismatches" in e else "")
            if res.reason and res.status != "equivalent":
                err.print(f"[{style}]{res.status}[/] {summary.name} on {res.framework}: {escape(res.reason)}",
                          highlight=False, soft_wrap=True)
    out.print(table)
    if unsaved:
        more = f" ({len(unsaved) - 1} more check files kept beside it)" if len(unsaved) > 1 else ""
        raise StoreWriteError(str(unsaved[0]) + more, unsaved[0].kept)
    if bad:
        raise fail(f"{bad} framework/network pairs do not generate alike or could not be checked", 1)


def _environments(runners, env: str, flavour: str) -> list:
    chosen = backend(env, paths.cache_dir())
    envs = []
    log = BuildLog(err)
    for r in runners:
        try:
            envs.append((r, chosen.ensure(r, flavour, log)))
        except EnvironmentBuildError as e:
            envs.append((r, e))
    return envs


def has_dropout(network: dict) -> bool:
    """A dropout layer, or attention dropout, at a rate above 0 anywhere in a resolved network."""
    return any(layer.get("rate", 0) > 0 if layer["type"] == "dropout" else layer.get("dropout", 0) > 0
               for layer in network["layers"])
