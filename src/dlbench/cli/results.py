"""`dlbench results`: one row per run in the store, filtered, as a table, csv, json or parquet."""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from ..store.rows import COLUMNS
from . import lookup, tables
from .console import err, fail, out
from .options import FrameworkFilter, MachineFilter, StoreOption, check_format

FORMATS = ("table", "csv", "json", "parquet")
# rich lays out a table cell by cell (about a second per 500 rows here): beyond this, plain columns.
RICH_TABLE_MAX_ROWS = 200
RESULTS_TABLE_COLUMNS = tables.RESULTS_COLUMNS


def results(
    store: StoreOption = None,
    format: Annotated[str, typer.Option("--format", help="table | csv | json | parquet (parquet needs --out)")] = "table",
    out_file: Annotated[Optional[Path], typer.Option("--out", help="Write csv, json or parquet to this file.")] = None,
    framework: FrameworkFilter = None,
    benchmark: Annotated[Optional[list[str]], typer.Option(help="Only these benchmarks or networks; repeatable.")] = None,
    machine: MachineFilter = None,
    since: Annotated[Optional[str], typer.Option(help="Only runs started at or after this date or datetime "
                                                      "(YYYY-MM-DD[THH:MM[:SS]][+HH:MM]; UTC when no zone).")] = None,
    status: Annotated[Optional[list[str]], typer.Option(help="ok | failed | timeout | skipped; repeatable.")] = None,
    columns: Annotated[Optional[list[str]], typer.Option(
        "--columns", help="The table's columns, comma-separated or repeated (any csv column); default: "
                          f"{','.join(tables.RESULTS_COLUMNS)}.")] = None,
    wide: Annotated[bool, typer.Option("--wide", help="Every column, as plain columns as wide as they need.")] = False,
) -> None:
    """One row per run in the store; filters combine with AND, repeated values of one filter with OR."""
    from ..store.index import INDEX_DIR, read_rows
    from ..store.selection import STATUSES, Selection, parse_since, split_values

    check_format(format, FORMATS)
    try:
        chosen = tables.parse_columns(columns)
    except ValueError as e:
        raise fail(str(e)) from None
    if (chosen or wide) and format != "table":
        raise fail("--columns and --wide shape the table; csv, json and parquet hold every column")
    if chosen and wide:
        raise fail("--columns or --wide, not both")
    statuses = split_values(status)
    unknown = sorted(statuses - set(STATUSES))
    if unknown:
        raise fail(f"unknown status {unknown[0]!r}; valid statuses: {', '.join(STATUSES)}")
    try:
        since_at = parse_since(since) if since is not None else None
    except ValueError as e:
        raise fail(f"--since: {e}") from None
    if format == "parquet" and out_file is None:
        raise fail("--format parquet writes a binary file, not text for a terminal: give --out FILE")
    if out_file is not None:
        if format == "table":
            raise fail("--out takes csv, json or parquet; the table is for reading in a terminal")
        if out_file.is_dir():
            raise fail(f"--out {out_file}: is a directory; give a file name")
        if not out_file.parent.is_dir():
            raise fail(f"--out {out_file}: directory {out_file.parent} does not exist")
    selection = Selection(frameworks=split_values(framework), benchmarks=split_values(benchmark),
                          machines=split_values(machine), statuses=statuses, since=since_at)
    st = lookup.existing_store(store)
    snapshot = read_rows(st, on_parse=lambda n: err.print(
        f"reading {n} records of {escape(str(st.root))} into its row index (later reads use {INDEX_DIR}/)",
        highlight=False))
    for note in snapshot.notes:
        err.print(f"[yellow]note[/] {escape(note)}", highlight=False, soft_wrap=True)
    for p in snapshot.unreadable:
        err.print(f"[yellow]skipped[/] {escape(p.reason)}", highlight=False, soft_wrap=True)
    rows = selection.apply(snapshot.rows)
    if format == "parquet":
        from ..store.frame import runs_frame

        frame = runs_frame(rows)
        _write_output(out_file, lambda tmp: frame.to_parquet(tmp, index=False))
        err.print(f"{len(rows)} runs written to {escape(str(out_file))}", highlight=False)
        return
    if format in ("json", "csv"):
        if format == "json":
            # a run per line: as readable as indent=1 and several times faster (the C encoder)
            plain = [json.dumps({c: row.get(c) for c in COLUMNS}) for row in rows]
            text = "[\n" + ",\n".join(plain) + "\n]\n" if plain else "[]\n"
        else:
            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\r\n")  # csv.DictWriter's line ending, at a list's speed
            w.writerow(COLUMNS)
            w.writerows([row.get(c) for c in COLUMNS] for row in rows)
            text = buf.getvalue()
        if out_file is None:
            sys.stdout.write(text)
        else:
            _write_output(out_file, lambda tmp: tmp.write_text(text))
            err.print(f"{len(rows)} runs written to {escape(str(out_file))}", highlight=False)
        return
    shown = len(rows) if len(rows) == len(snapshot.rows) else f"{len(rows)} of {len(snapshot.rows)}"
    title = f"{shown} runs in {st.root}"
    # rows of LoadGen scenario runs only: their own key columns (LoadGen's verdict and percentiles)
    # an axis beyond precision and compile, or oversubscription, is a default column only where some
    # shown run has a value
    default = tuple(c for c in tables.RESULTS_COLUMNS
                    if c not in tables.SOMETIMES_COLUMNS or any(row.get(c) is not None for row in rows))
    if rows and all(row.get("scenario") for row in rows):
        # generation's server only: LoadGen's TTFT and TPOT percentiles instead of per-sample latency
        default = (tables.LOADGEN_GENERATION_RESULTS_COLUMNS if all(row.get("mode") == "generate" for row in rows)
                   else tables.LOADGEN_RESULTS_COLUMNS)
    shown_columns = COLUMNS if wide else chosen or default
    if wide or len(rows) > RICH_TABLE_MAX_ROWS:
        sys.stdout.write(tables.plain_table(title, rows, shown_columns))
    else:
        # the default columns fit WIDTH; chosen ones get the terminal
        width = min(out.width, tables.WIDTH) if chosen is None else None
        out.print(tables.rich_table(rows, shown_columns, title), width=width)
        for note in tables.footnotes(rows, shown_columns):
            out.print(escape(note), highlight=False, width=width)
    generated = [row for row in rows if row.get("mode") == "generate" and not row.get("scenario")]
    served = [row for row in rows if row.get("mode") == "generate" and row.get("scenario")]
    if generated and chosen is None and not wide:  # mode generate: its own figures under the table
        out.print(tables.rich_table(generated, tables.GENERATION_COLUMNS, "generation (per request: median and 99th "
                                    "percentile)"), width=min(out.width, tables.WIDTH))
    if served and chosen is None and not wide:  # generation's LoadGen server: LoadGen's token latencies
        out.print(tables.rich_table(served, tables.GENERATION_COLUMNS, "generation under LoadGen's server (LoadGen's "
                                    "TTFT and TPOT: median and 99th percentile, at the rate reported)"),
                  width=min(out.width, tables.WIDTH))
    if any(row.get("workers") is not None for row in rows):
        from .distributed import print_distributed_details

        print_distributed_details(st, rows)
    if any(row.get("mode") == "convergence" for row in rows):
        from .convergence import print_convergence_details

        print_convergence_details(st, rows)


def _plain_table(title: str, rows: list[dict]) -> str:
    """The default columns as plain columns (what the table turns into over RICH_TABLE_MAX_ROWS rows)."""
    return tables.plain_table(title, rows, RESULTS_TABLE_COLUMNS)


def _write_output(path: Path, write) -> None:
    """Into a temporary file beside `path`, then renamed over it: never a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
