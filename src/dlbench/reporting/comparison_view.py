"""The compare page: `dlbench compare`'s analysis (dlbench.analysis.comparison) of two selectors, as a table
with significance marks and a chart of the ratios."""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis.comparison import NothingToCompare, Selector, SelectorError, compare, parse_selector
from ..store.store import Store


class ComparisonRequestError(Exception):
    """A `--compare` that cannot be drawn; site.py reports it as a SiteError with `code`."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


@dataclass
class ComparisonRequest:
    baseline: Selector
    candidate: Selector


def parse_request(baseline: str, candidate: str) -> ComparisonRequest:
    """Checked before anything is built: a bad selector is a ComparisonRequestError naming the option."""

    try:
        return ComparisonRequest(parse_selector(baseline, "--compare BASELINE"),
                                 parse_selector(candidate, "--compare CANDIDATE"))
    except SelectorError as e:
        raise ComparisonRequestError(str(e)) from None


def run_comparison(store: Store, request: ComparisonRequest):
    """The ComparisonReport over the store's readable records (unreadable ones are left out, as the
    site leaves them out)."""

    try:
        return compare(store.records([]), request.baseline, request.candidate)
    except SelectorError as e:
        raise ComparisonRequestError(str(e)) from None
    except NothingToCompare as e:
        raise ComparisonRequestError(f"--compare: {e} (store {store.root})", 1) from None
