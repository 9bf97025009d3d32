"""`dlbench list`: the suites and what each runs under a profile."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..definitions.suite import PROFILES
from . import lookup
from .console import out
from .options import DEVICES, ProfileOption, check_choice, resolve_device


def list_suites(
    suite: Annotated[Optional[str], typer.Option(help="Only this suite (name or path).")] = None,
    profile: ProfileOption = "default",
    device: Annotated[str, typer.Option(help="auto | cpu | cuda (chooses the default profile's batches)")] = "auto",
) -> None:
    """Suites and their benchmarks: network, mode, batch sizes, parameters, GFLOPs per sample."""
    check_choice("profile", profile, list(PROFILES))
    check_choice("device", device, DEVICES)
    path = lookup.catalog().suite_path(suite) if suite not in (None, "all") else None
    if path is not None:
        kind = lookup.suite_kind(path)
        if kind in ("distributed", "comm"):
            from .distributed import list_distributed

            list_distributed(path, profile, resolve_device(device))
            return
        if kind == "kernels":
            from .performance import list_kernels

            list_kernels(path, profile, resolve_device(device))
            return
        if kind == "convergence":
            from .convergence import list_convergence

            list_convergence(path, profile, resolve_device(device))
            return
    suites = lookup.load_suites(suite or "all", profile, resolve_device(device))
    table = Table(title=f"dlbench suites (profile {profile})")
    for col in ("suite", "benchmark", "network", "mode", "batch sizes", "sequence", "params", "GFLOPs/sample"):
        # sequence: a token network's length; for generate, prompt+new tokens
        table.add_column(col, justify="right" if col in ("sequence", "params", "GFLOPs/sample") else "left")
    for s in suites:
        for b in s.benchmarks:
            length = b.network.resolved["input"].get("sequence_length")  # token inputs: the suite's length
            if b.generation is not None:  # mode generate: the prompt, then the new tokens
                length = f"{b.generation.prompt_length}+{b.generation.new_tokens}"
            table.add_row(escape(s.name), escape(b.name), escape(b.network.name), b.mode, ",".join(map(str, b.batch_sizes)),
                          "" if length is None else str(length), params_text(b.network),
                          f"{b.network.flops_per_sample / 1e9:.4f}")
    catalog = lookup.catalog()
    table.caption = (f"frameworks: {', '.join(lookup.registry().names())}; distributed suites (--workers): "
                     f"{', '.join(catalog.distributed_suite_names())}; kernel suites: "
                     f"{', '.join(catalog.kernel_suite_names())}; convergence suites (time to accuracy): "
                     f"{', '.join(catalog.convergence_suite_names())}")
    out.print(table)


def params_text(network) -> str:
    """The parameter count; a pre-trained model's heads apart, as its published size leaves them out."""
    heads = network.head_params
    return f"{network.params - heads:,} + {heads:,} heads" if heads else f"{network.params:,}"
