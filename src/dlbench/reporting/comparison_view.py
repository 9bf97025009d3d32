"""The compare page: `dlbench compare`'s analysis (dlbench.comparison) of two selectors, as a table
with significance marks and a chart of the ratios."""

from __future__ import annotations

from dataclasses import dataclass

from ..comparison import NothingToCompare, Selector, SelectorError, compare, parse_selector
from ..store.store import Store


@dataclass
class ComparisonRequest:
    baseline: Selector
    candidate: Selector


def parse_request(baseline: str, candidate: str) -> ComparisonRequest:
    """Checked before anything is built: a bad selector is a SiteError naming the option."""
    from .site import SiteError

    try:
        return ComparisonRequest(parse_selector(baseline, "--compare BASELINE"),
                                 parse_selector(candidate, "--compare CANDIDATE"))
    except SelectorError as e:
        raise SiteError(str(e)) from None


def run_comparison(store: Store, request: ComparisonRequest):
    """The ComparisonReport over the store's readable records (unreadable ones are left out, as the
    site leaves them out)."""
    from .site import SiteError

    try:
        return compare(store.records([]), request.baseline, request.candidate)
    except SelectorError as e:
        raise SiteError(str(e)) from None
    except NothingToCompare as e:
        raise SiteError(f"--compare: {e} (store {store.root})", 1) from None
