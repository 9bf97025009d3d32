"""The options several commands share, declared once (typer `Annotated` aliases; each command gives
its own default), the values they accept, and the checks of those values (exit 2, one message)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional, Sequence

import typer

from ..axes import Mode, Precision
from ..machine import detect_device
from ..workflows.lookup import check_choice as choices_checked
from ..workflows.lookup import listed_choices as listed
from ..workflows.suite_kinds import RequestError
from .console import fail

DEVICES = ("auto", "cpu", "cuda")
MODES = Mode.names()
TABLE_OR_JSON = ("table", "json")
# A timed run's precisions as a typer choice, so that --help lists them: the precision axis less
# float64, which only `dlbench check` takes (Precision.runs). Its members' values are the axis's.
RunPrecision = Enum("RunPrecision", [(p.name, p.value) for p in Precision.runs()], type=str)

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
