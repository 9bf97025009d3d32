"""An append-only directory of run records.

Layout: STORE/runs/<run_id>.json, one file per run. A record is written to STORE/.incoming/ first,
flushed to disk, then hard-linked into runs/ under its final name and the temporary name removed.
A link never replaces an existing file, so a record is never overwritten, and a reader can only
ever see a complete record: a process killed mid-write leaves at most a file in .incoming/, which
readers never look at. Several dlbench processes can write to one store at once (run ids are
unique and each write is a single link).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from pydantic import ValidationError

from .migrations import upgrade
from .record import SCHEMA_VERSION, Record


class StoreError(Exception):
    pass


@dataclass
class Unreadable:
    path: Path
    reason: str


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.runs = self.root / "runs"
        self.incoming = self.root / ".incoming"

    def write(self, record: Record) -> Path:
        self.runs.mkdir(parents=True, exist_ok=True)
        self.incoming.mkdir(parents=True, exist_ok=True)
        final = self.runs / f"{record.run_id}.json"
        tmp = self.incoming / f"{record.run_id}.{os.getpid()}.tmp"
        data = record.model_dump_json(indent=1)
        with open(tmp, "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, final)
        except FileExistsError:
            raise StoreError(f"{final}: a record with run id {record.run_id} already exists; not overwritten") from None
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(self.runs)
        return final

    def paths(self) -> list[Path]:
        return sorted(self.runs.glob("*.json")) if self.runs.is_dir() else []

    def read(self, path: Path) -> Record:
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise StoreError(f"{path}: unreadable record: {e}") from None
        version = data.get("schema_version") if isinstance(data, dict) else None
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise StoreError(f"{path}: schema_version: missing or invalid ({version!r})")
        if version > SCHEMA_VERSION:
            raise StoreError(f"{path}: schema version {version} is newer than this dlbench understands "
                             f"({SCHEMA_VERSION}); upgrade dlbench to read it")
        try:
            return Record.model_validate(upgrade(data, SCHEMA_VERSION))
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            raise StoreError(f"{path}: {field}: {err['msg']}") from None

    def records(self, problems: list[Unreadable] | None = None) -> Iterator[Record]:
        """Every readable record, oldest first; unreadable ones are reported into `problems`."""
        for path in self.paths():
            try:
                yield self.read(path)
            except StoreError as e:
                if problems is not None:
                    problems.append(Unreadable(path, str(e)))
