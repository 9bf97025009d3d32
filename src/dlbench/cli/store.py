"""`dlbench store verify|upgrade|merge`: the results store's records and checks, verified,
rewritten at the current schema, or gathered from other stores."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from . import lookup
from .console import err, fail, out
from .options import StoreOption

store_app = typer.Typer(help="The results store: verify its records, upgrade old ones, merge other stores in.",
                        no_args_is_help=True)


@store_app.command("verify")
def store_verify(store: StoreOption = None) -> None:
    """Check every record (schema, checksum, name) and check file; exit 1 if any is damaged."""
    from ..store.verify import verify

    st = lookup.existing_store(store)
    report = verify(st)
    _print_problems("problem", [(p.path, p.reason) for p in report.problems])
    by_version: dict[int, int] = {}
    for _, version in report.unverified:
        by_version[version] = by_version.get(version, 0) + 1
    old = ", ".join(f"schema {v}: {n}" for v, n in sorted(by_version.items()))
    total = len(report.verified) + len(report.unverified) + sum(p.path.parent == st.runs for p in report.problems)
    out.print(f"{st.root}: {total} records: {len(report.verified)} verified by checksum, "
              f"{len(report.unverified)} unverified (written before checksums{': ' + old if old else ''}), "
              f"{len(report.problems)} problems; {report.checks} equivalence checks, {report.kernels} kernel records, "
              f"{report.profiles} machine profiles", highlight=False, soft_wrap=True)
    if report.leftovers:
        out.print(f"{len(report.leftovers)} temporary files in {st.incoming} ({len(report.stale)} left by writers "
                  "that died or are over an hour old: the next write removes them)", highlight=False, soft_wrap=True)
    if report.unlisted:
        folders = sorted({p.relative_to(st.root).parts[:2] for p in report.unlisted})
        out.print(f"{len(report.unlisted)} files beside the records that no record lists (a run that died before "
                  f"its record was written leaves its logs; nothing depends on them): "
                  f"{', '.join('/'.join(f) for f in folders)}", highlight=False, soft_wrap=True)
    if report.problems:
        raise fail(f"{len(report.problems)} damaged or invalid files in {st.root} (listed above)", 1)


@store_app.command("upgrade")
def store_upgrade(store: StoreOption = None) -> None:
    """Rewrite older records at the current schema, atomically; originals kept in STORE/.upgraded/."""
    from ..store.record import SCHEMA_VERSION
    from ..store.store import UpgradeReport

    st = lookup.existing_store(store)
    report = UpgradeReport()
    try:
        st.upgrade(report)
    except KeyboardInterrupt:
        err.print(f"interrupted: {len(report.upgraded)} records upgraded, each whole; run it again to finish")
        raise typer.Exit(130) from None
    _print_problems("not upgraded", [(p.path, p.reason) for p in report.problems])
    by_version: dict[int, int] = {}
    for _, version in report.upgraded:
        by_version[version] = by_version.get(version, 0) + 1
    old = ", ".join(f"from {v}: {n}" for v, n in sorted(by_version.items()))
    out.print(f"{st.root}: {len(report.upgraded)} records upgraded to schema {SCHEMA_VERSION}"
              f"{' (' + old + '), originals in ' + str(st.upgraded) if old else ''}; {report.current} already current",
              highlight=False, soft_wrap=True)
    if report.problems:
        raise fail(f"{len(report.problems)} records could not be read and were left as they are (listed above)", 1)


@store_app.command("merge")
def store_merge(
    sources: Annotated[list[Path], typer.Argument(help="Stores to merge in (directories with runs/ and checks/).")],
    store: StoreOption = None,
) -> None:
    """Copy other stores' records and checks in; duplicates skipped, conflicts and damage reported."""
    from ..store.merge import MergeError, MergeReport, check_sources, merge

    st = lookup.open_store(store)
    try:
        check_sources(st, sources)
    except MergeError as e:
        raise fail(str(e)) from None
    report = MergeReport()
    try:
        merge(st, sources, report)
    except KeyboardInterrupt:
        err.print(f"interrupted: {len(report.added)} files copied, each whole; run the merge again to finish")
        raise typer.Exit(130) from None
    lookup.refresh_index(st)
    _print_problems("conflict", report.conflicts)
    _print_problems("unreadable", report.unreadable)
    t = Table(title=f"merge into {st.root} from {len(sources)} store{'s' if len(sources) != 1 else ''}")
    for col in ("added", "duplicates", "conflicts", "unreadable"):
        t.add_column(col, justify="right")
    t.add_row(*(str(len(x)) for x in (report.added, report.duplicates, report.conflicts, report.unreadable)))
    out.print(t)
    if not report.clean:
        raise fail(f"{len(report.conflicts)} conflicts and {len(report.unreadable)} unreadable files were not "
                   "merged (listed above)", 1)


def _print_problems(label: str, problems) -> None:
    for path, reason in problems:
        out.print(f"[red]{label}[/] {escape(reason)}", highlight=False, soft_wrap=True)

