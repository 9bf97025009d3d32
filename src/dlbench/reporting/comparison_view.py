"""The compare page: `dlbench compare`'s table (dlbench.comparison) for two selectors."""

from __future__ import annotations

from ..store.store import Store


def comparison_for_site(store: Store, baseline: str, candidate: str):
    from .site import SiteError

    try:
        from .. import comparison  # noqa: F401
    except ImportError:
        raise SiteError("--compare: this dlbench has no comparison module (dlbench.comparison)") from None
    raise SiteError("--compare: not wired yet")
