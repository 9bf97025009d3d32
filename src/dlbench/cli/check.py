"""`dlbench check`: the frameworks build the same networks (shared weights and input, compared
outputs and one update); each result is kept in the store's checks/. The checking is
workflows/checks.py's (its RequestError: exit 2, one message); this module parses and renders."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..axes import Mode, Precision
from ..store.store import StoreWriteError
from ..workflows.checks import CHECK_MODES, CheckRequest, CheckResults
from ..workflows.checks import check as run_check
from . import lookup
from .build_progress import BuildLog
from .console import err, fail, out
from .options import DeviceOption, FrameworksOption, StoreOption, TimeoutOption, axis_option
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
    precision: Annotated[Optional[Precision], axis_option(Precision,
        help="float64 (where rounding decides no ReLU or max-pool: every tensor gated to 1e-9; the default in "
             "train mode) | fp32 (the default in generate mode) | amp_bf16 | amp_fp16 (each framework's "
             "mixed-precision step against the reference framework's float64 one, to its unit roundoff scaled by "
             "the network's depth)")] = None,
    mode: Annotated[Mode, axis_option(Mode, accepted=CHECK_MODES,
        help="train (logits, loss and one SGD-momentum step) | generate (decoder networks: the first step's "
             "logits and the greedily generated ids, through each framework's key/value cache)")] = Mode.TRAIN,
    sequence_length: Annotated[Optional[int], typer.Option(
        "--sequence-length", min=2,
        help="Check the token networks at this sequence length, or at their own context where that is shorter "
             "(default: each network's own context; a suite runs them at its own lengths, `dlbench list` shows "
             "them).")] = None,
) -> None:
    """Prove the frameworks build the same networks: shared weights and input, compared outputs and updates."""
    request = CheckRequest(framework=framework, network=network, device=device, env=env, store=store, timeout=timeout,
                           precision=precision and precision.value, mode=mode.value, sequence_length=sequence_length)
    events = _CheckEvents(" (generate)" if mode == "generate" else "")
    try:
        checked = lookup.refused(run_check, request, events)
    finally:
        events.stop_status()
    render = _generation_table if checked.mode == "generate" else _train_table
    out.print(render(checked))
    if checked.unsaved:  # one error (reports_unsaved_records: exit 1), which says where they are kept
        unsaved = checked.unsaved
        more = f" ({len(unsaved) - 1} more check files kept beside it)" if len(unsaved) > 1 else ""
        raise StoreWriteError(str(unsaved[0]) + more, unsaved[0].kept)
    if checked.failed:
        alike = "do not generate alike" if checked.mode == "generate" else "are not equivalent"
        raise fail(f"{checked.failed} framework/network pairs {alike} or could not be checked", 1)


STATUS_STYLES = {"equivalent": "green", "reference": "cyan", "skipped": "yellow"}


class _CheckEvents:
    """The check's progress on stderr: each environment's build as lines, a spinner while a network is
    checked, then the reason of each result that is not equivalent."""

    def __init__(self, mode_words: str):
        self.log = BuildLog(err)
        self.mode_words = mode_words  # the spinner's "checking gpt2_small (generate)"
        self.status = None

    def environment(self, framework, progress):
        self.log(progress)

    def network_started(self, network):
        self.status = err.status(f"checking {network}{self.mode_words}")
        self.status.start()

    def network_checked(self, network, results):
        self.stop_status()
        for res in results:
            if res.reason and res.status != "equivalent":
                style = STATUS_STYLES.get(res.status, "red")
                err.print(f"[{style}]{res.status}[/] {network} on {res.framework}: {escape(res.reason)}",
                          highlight=False, soft_wrap=True)

    def stop_status(self):
        if self.status is not None:
            self.status.stop()
            self.status = None


def _train_table(checked: CheckResults) -> Table:
    table = Table(title=f"dlbench check ({checked.device}, {checked.precision}; reference: {checked.reference})")
    for col in ("network", "framework", "version", "params", "status", "logits", "loss", "weights", "update",
                "worst tensor", "round trip"):
        table.add_column(col, justify="right" if col in ("params", "logits", "loss", "weights", "update", "round trip")
                         else "left")
    for net in checked.networks:
        for res in net.results:
            style = STATUS_STYLES.get(res.status, "red")
            e = res.errors
            table.add_row(net.network, res.framework, escape(res.framework_version or ""),
                          f"{res.params:,}" if res.params is not None else "", f"[{style}]{res.status}[/]",
                          *(f"{e[k]:.1e}" if k in e else "" for k in ("logits", "loss", "weights", "update")),
                          escape(res.worst_tensor or ""), f"{e['roundtrip']:.0e}" if "roundtrip" in e else "")
    if checked.dropout_forced:
        table.caption = (f"dropout forced to 0 in this check (timed runs use the network's rates): "
                         f"{', '.join(checked.dropout_forced)}")
    return table


def _generation_table(checked: CheckResults) -> Table:
    table = Table(title=f"dlbench check --mode generate ({checked.device}, {checked.precision}; "
                        f"reference: {checked.reference})")
    for col in ("network", "framework", "version", "params", "prompt", "new", "status", "first logits", "ids differing"):
        table.add_column(col, justify="left" if col in ("network", "framework", "version", "status") else "right")
    for net in checked.networks:
        for res in net.results:
            style = STATUS_STYLES.get(res.status, "red")
            e = res.errors
            table.add_row(net.network, res.framework, escape(res.framework_version or ""),
                          f"{res.params:,}" if res.params is not None else "", str(net.prompt), str(net.new_tokens),
                          f"[{style}]{res.status}[/]",
                          f"{e['first_logits']:.1e}" if "first_logits" in e else "",
                          f"{int(e['token_mismatches'])}" if "token_mismatches" in e else "")
    return table
