"""Change points on the history page, found by `dlbench history`'s module (dlbench.history)."""

from __future__ import annotations

from .model import SiteModel


def attach_change_points(model: SiteModel) -> None:
    try:
        from .. import history  # noqa: F401
    except ImportError:
        model.history_note = ("Change points are not marked: this dlbench has no change-point detection "
                              "(dlbench.history).")
        return
