"""The options several commands share, declared once (typer `Annotated` aliases; each command gives
its own default), the values they accept, and the checks of those values (exit 2, one message).

An option that takes an axis's values (precision, compile, mode, scenario) is declared with
`axis_option`: typed by the axis of dlbench.axes, checked as the command line is parsed, its choices
in --help, and one error for a value it does not accept, the same for every command:
`Invalid value for '--precision': unknown precision 'bf16'; valid precisions: fp32, tf32, ...`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional, Sequence

import typer

from ..axes import Axis, RequestAxis
from ..machine import detect_device
from ..workflows.lookup import check_choice as choices_checked
from ..workflows.lookup import listed_choices as listed
from ..workflows.requests import RequestError
from .console import fail

DEVICES = ("auto", "cpu", "cuda")
TABLE_OR_JSON = ("table", "json")

StoreOption = Annotated[Optional[Path], typer.Option(
    "--store", help="Results store (default: $DLBENCH_STORE, else ./results).")]
FormatOption = Annotated[str, typer.Option("--format", help=" | ".join(TABLE_OR_JSON))]
ProfileOption = Annotated[str, typer.Option(help="smoke | default | paper")]
DeviceOption = Annotated[str, typer.Option(help=" | ".join(DEVICES))]
FrameworksOption = Annotated[list[str], typer.Option(help="Framework name, 'all', or a comma list; repeatable.")]
ThreadsOption = Annotated[Optional[int], typer.Option(
    min=1, help="Threads per worker (default: all available cores).")]
TimeoutOption = Annotated[float, typer.Option(min=1, help="Seconds before a worker process is killed.")]
# the filters of `results` and `history`
FrameworkFilter = Annotated[Optional[list[str]], typer.Option(help="Only these frameworks; repeatable, or a comma list.")]
MachineFilter = Annotated[Optional[list[str]], typer.Option(help="Only these hostnames or machine ids; repeatable.")]


def check_choice(kind: str, value: str, choices: Sequence[str]) -> None:
    try:
        choices_checked(kind, value, choices)
    except RequestError as e:
        raise fail(str(e)) from None


def check_format(value: str, choices: Sequence[str] = TABLE_OR_JSON) -> None:
    """`--format`: one of `choices` (table or json, unless the command writes more)."""
    check_choice("format", value, choices)


def listed_choices(kind: str, given: list[str] | None, valid: Sequence[str]) -> list[str] | None:
    """A list option's values (repeatable, comma lists, 'all' = every valid one), checked and
    deduplicated in order; None where the option was not given."""
    try:
        return listed(kind, given, valid)
    except RequestError as e:
        raise fail(str(e)) from None


def resolve_device(device: str) -> str:
    """`--device auto`: cuda where this machine has a usable GPU, else cpu."""
    return detect_device() if device == "auto" else device


def axis_option(axis: type[Axis], help: str, *, accepted: Sequence[Axis | str] | None = None, words: Sequence[str] = (),
                lists: bool = False, kind: str | None = None):
    """A typer option whose values are `axis`'s members (`accepted`: a subset, default all of them)
    or one of `words` (`all`, `default`: what the workflow resolves), kept as the plain word.
    `lists`: repeatable, each value a comma list, the option's value one flat list of them in order
    (`--precision fp32,amp_bf16 --precision tf32`). `kind` names the values in the error (default
    the axis's name)."""
    members = tuple(axis) if accepted is None else tuple(axis(a) for a in accepted)
    choices = [m.value for m in members] + list(words)
    kind = kind or axis.axis_name()

    def parse(given):
        if given is None:
            return None
        names = [n.strip() for n in str(given).split(",") if n.strip()] if lists else [str(given)]
        for name in names or [""]:
            if name not in choices:
                raise typer.BadParameter(f"unknown {kind} {name!r}; valid {kind}s: {', '.join(choices)}")
        values = [name if name in words else axis(name) for name in names]
        return values if lists else values[0]

    def flat(value):
        return None if value is None else [v for given in value for v in given]

    metavar = "|".join(choices) + (",..." if lists else "")
    return typer.Option(help=help, parser=parse, metavar=metavar, **({"callback": flat} if lists else {}))


def run_axis_option(spec: RequestAxis, help: str):
    """`dlbench run`'s option of a request axis (REQUEST_AXES): the values a run may ask for, comma
    lists, repeatable, `all` (every one of them) and, where the axis has a runner default,
    `default`; an unknown value named with the axis's noun."""
    words = ("default", "all") if spec.runner_default else ("all",)
    return axis_option(spec.axis, help, accepted=spec.axis.runs(), words=words, lists=True, kind=spec.noun)
