"""`dlbench report`: the static site of the store's runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from . import lookup
from .console import err, fail, out
from .options import StoreOption


def report(
    store: StoreOption = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write the site into (replaced when it is a site dlbench wrote).")] = Path("site"),
    open_: Annotated[bool, typer.Option("--open", help="Open the leaderboard in a web browser afterwards.")] = False,
    compare: Annotated[Optional[tuple[str, str]], typer.Option(
        "--compare", metavar="BASELINE CANDIDATE",
        help="Also write compare.html: the `dlbench compare` table of two selectors.")] = None,
) -> None:
    """Write the static site: leaderboards, benchmark, run, history (and comparison) pages."""
    from ..reporting.site import SiteError, build_site, open_in_browser

    st = lookup.existing_store(store)
    try:
        result = build_site(st.root, out_dir, compare)
    except SiteError as e:
        raise fail(str(e), e.code) from None
    for path, reason in result.problems:
        err.print(f"[yellow]skipped[/] {escape(reason)}", highlight=False, soft_wrap=True)
    out.print(f"report: {result.index} ({result.runs} runs, {result.pages} pages)")
    if open_ and not open_in_browser(result.index):
        err.print("no web browser to open; the site is at the path above", highlight=False)
