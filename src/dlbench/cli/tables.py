"""Run rows as terminal tables: `dlbench results` and the end of `dlbench run`.

By default a table shows the key columns in at most WIDTH (120) characters, the interval as ±% of
the median; a run id is never broken (other cells are shortened with an ellipsis if a long name
needs the room). `--columns` picks any of the row columns (rows.COLUMNS), `--wide` shows them all,
as plain columns as long as they need (for `less -S` or a file).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich import box
from rich.markup import escape
from rich.table import Table

from ..axes import OTHER_AXES
from ..store.rows import COLUMNS
from .console import safe

WIDTH = 120
RESULTS_COLUMNS = ("run_id", "benchmark", "framework", "batch_size", "precision", "compile",
                   *(a.field for a in OTHER_AXES), "status", "ms_per_iter", "ci_pct", "samples_per_s", "stability",
                   "oversubscribed")
# columns of RESULTS_COLUMNS shown by default only where some shown run has a value
SOMETIMES_COLUMNS = frozenset({*(a.field for a in OTHER_AXES), "oversubscribed"})
RUN_COLUMNS = ("benchmark", "framework", "framework_version", "batch_size", "precision", "status", "ms_per_iter",
               "ci_pct", "samples_per_s", "repeats", "stability")
# LoadGen scenario runs (`dlbench run --scenario`): LoadGen's verdict and per-sample latency percentiles
LOADGEN_RUN_COLUMNS = ("benchmark", "framework", "framework_version", "scenario", "status", "loadgen_result",
                       "latency_p50_ms", "latency_p90_ms", "latency_p99_ms", "samples_per_s", "server_qps")
LOADGEN_RESULTS_COLUMNS = ("run_id", "benchmark", "framework", "scenario", "loadgen_result", "latency_p50_ms",
                           "latency_p99_ms", "samples_per_s", "server_qps")
# generation's LoadGen server (`--mode generate --scenario server`): LoadGen's TTFT and TPOT percentiles
# and the highest rate meeting both bounds
LOADGEN_GENERATION_RUN_COLUMNS = ("benchmark", "framework", "framework_version", "status", "loadgen_result",
                                  "ttft_ms", "ttft_p99_ms", "tpot_ms", "tpot_p99_ms", "tokens_per_s", "server_qps")
LOADGEN_GENERATION_RESULTS_COLUMNS = ("run_id", "benchmark", "framework", "loadgen_result", "ttft_p99_ms",
                                      "tpot_p99_ms", "tokens_per_s", "server_qps")
# mode generate's own table (after the run table): per request, time to first token and per output token
GENERATION_COLUMNS = ("benchmark", "framework", "batch_size", "compile", "status", "prompt_tokens", "new_tokens",
                      "ttft_ms", "ttft_p99_ms", "tpot_ms", "tpot_p99_ms", "tokens_per_s")
HEADERS = {"loadgen_result": "LoadGen", "latency_p50_ms": "p50 ms", "latency_p90_ms": "p90 ms",
           "latency_p99_ms": "p99 ms", "server_qps": "server q/s", "batch_size": "batch", "framework_version": "version", "ms_per_iter": "ms/iter", "ci_pct": "95% CI",
           "samples_per_s": "samples/s", "first_iter_ms": "first ms", "precision": "prec.",
           "prompt_tokens": "prompt", "new_tokens": "new", "ttft_ms": "TTFT ms", "ttft_p99_ms": "TTFT p99",
           "tpot_ms": "TPOT ms", "tpot_p99_ms": "TPOT p99", "tokens_per_s": "tokens/s",
           "oversubscribed": "oversub."}
FORMATS = {"latency_p50_ms": ".3g", "latency_p90_ms": ".3g", "latency_p99_ms": ".3g", "server_qps": ".4g",
           "ms_per_iter": ".3g", "samples_per_s": ".4g", "first_iter_ms": ".3g", "iqr_ms": ".3g", "mfu": ".1%",
           "tokens_per_s": ".4g", "model_tflops": ".3g", "ttft_ms": ".3g", "ttft_p99_ms": ".3g", "tpot_ms": ".3g",
           "tpot_p99_ms": ".3g"}
NUMERIC_LEFT = (*(a.field for a in OTHER_AXES), "run_id", "benchmark", "network", "framework", "framework_version", "status", "stability", "precision",
                "compile", "device", "machine", "equivalence", "reason", "stability_reason", "mode", "suite",
                "scenario", "loadgen_result", "loadgen_reason", "oversubscribed")
ONE_PROCESS = "* one repeat: an interval of that process's iterations only, not a 95% interval of the run"


def parse_columns(values: Iterable[str] | None) -> tuple[str, ...] | None:
    """`--columns a,b --columns c` -> ("a", "b", "c"); ValueError naming an unknown column."""
    if not values:
        return None
    chosen = [c.strip() for v in values for c in v.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in COLUMNS]
    if unknown:
        raise ValueError(f"--columns: unknown column {unknown[0]!r}; columns: {', '.join(COLUMNS)}")
    return tuple(dict.fromkeys(chosen))


def cell(row: dict, column: str) -> str:
    """A value as a table shows it; text with its control characters escaped."""
    value = row.get(column)
    if value is None:
        return ""
    if column == "ci_pct":
        return f"±{value:.2g}%" + ("*" if row.get("ci_level") == "iterations" else "")
    if column == "repeats":
        stop = {"target_met": " (target met)", "cap_reached": " (cap)"}.get(row.get("repeat_stop") or "", "")
        return f"{value}{stop}"
    if isinstance(value, float):
        return format(value, FORMATS.get(column, ".3f"))
    return safe(str(value))


def footnotes(rows: Sequence[dict], columns: Sequence[str]) -> list[str]:
    if "ci_pct" in columns and any(r.get("ci_level") == "iterations" and r.get("ci_pct") is not None for r in rows):
        return [ONE_PROCESS]
    return []


def rich_table(rows: Sequence[dict], columns: Sequence[str], title: str, styles: dict[str, str] | None = None) -> Table:
    """Compact: no vertical rules, a run id never wrapped, long text cut with an ellipsis.
    `styles`: run id -> a rich style for its status cell."""
    t = Table(title=escape(title), box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 0))  # a space between columns
    for c in columns:
        t.add_column(HEADERS.get(c, c), justify="left" if c in NUMERIC_LEFT else "right",
                     no_wrap=c == "run_id", overflow="ellipsis" if c != "run_id" else "fold",
                     min_width=len(str(rows[0].get(c) or "")) if c == "run_id" and rows else None)
    for row in rows:
        cells = [escape(cell(row, c)) for c in columns]
        if styles and "status" in columns and row.get("run_id") in styles:
            i = columns.index("status")
            cells[i] = f"[{styles[row['run_id']]}]{cells[i]}[/]"
        if "stability" in columns and row.get("stability") == "unstable":
            i = columns.index("stability")
            cells[i] = f"[yellow]{cells[i]}[/]"
        t.add_row(*cells)
    return t


def plain_table(title: str, rows: Sequence[dict], columns: Sequence[str]) -> str:
    """Plain columns, each as wide as its widest cell: for many rows (rich lays out about 500 rows a
    second) and for --wide."""
    cells = [list(columns)] + [[cell(row, c) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([title, *lines, *footnotes(rows, columns)]) + "\n"
