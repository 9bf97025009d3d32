"""Which runs `dlbench results` shows: filters on the rows, AND across options, OR within one."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import get_args

from .record import Status

STATUSES: tuple[str, ...] = get_args(Status)


def parse_since(text: str) -> datetime:
    """A date (2026-11-29) or an ISO datetime (2026-11-29T14:00, ...+02:00, ...Z); without a zone it is
    UTC, the zone of run ids and of `started_at`. Raises ValueError with the accepted forms."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a date or datetime; use YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS][+HH:MM|Z]") \
            from None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def split_values(given: list[str] | None) -> frozenset[str]:
    """Repeatable options that also take comma lists, as `dlbench run --framework` does."""
    return frozenset(v.strip() for item in given or [] for v in item.split(",") if v.strip())


@dataclass(frozen=True)
class Selection:
    frameworks: frozenset[str] = frozenset()
    benchmarks: frozenset[str] = frozenset()  # a benchmark name (fcn5-train) or a network name (fcn5)
    machines: frozenset[str] = frozenset()  # a hostname or a machine id
    statuses: frozenset[str] = frozenset()
    since: datetime | None = None  # runs started at or after this moment

    def matches(self, row: dict) -> bool:
        if self.frameworks and row.get("framework") not in self.frameworks:
            return False
        if self.benchmarks and not {row.get("benchmark"), row.get("network")} & self.benchmarks:
            return False
        if self.machines and not {row.get("machine"), row.get("machine_id")} & self.machines:
            return False
        if self.statuses and row.get("status") not in self.statuses:
            return False
        if self.since is not None:
            started = datetime.fromisoformat(row["started_at"])
            if (started if started.tzinfo else started.replace(tzinfo=timezone.utc)) < self.since:
                return False
        return True

    def apply(self, rows: list[dict]) -> list[dict]:
        return [r for r in rows if self.matches(r)]
