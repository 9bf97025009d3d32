"""An append-only directory of run records that can prove it was not damaged.

Layout:
  STORE/runs/<run_id>.json     one file per run, the only place readers look
  STORE/checks/<...>.json      equivalence checks (equivalence.CheckStore)
  STORE/kernels/<run_id>.json  kernel records of the kernels suite (performance/kernel_suite.py)
  STORE/machines/<id>/profile-<revision>.json   machine profiles (performance/profile.py)
  STORE/.incoming/             temporary files of writes in progress
  STORE/.upgraded/             originals of records `dlbench store upgrade` rewrote

Writing: the record is written to a temporary file in .incoming/, fsynced, hard-linked into runs/
under its final name, the temporary name removed and runs/ fsynced. A link never replaces an
existing file, so a record is never overwritten and a reader only ever sees complete records; a
writer killed at any moment leaves at most a temporary file, which readers never look at. Any
number of processes (on any number of hosts sharing the directory) can write at once: run ids are
unique and each write ends in a single link. A temporary file is named
`<name>.<token>.<pid>.<host>.tmp`, so leftovers can be removed safely: one whose writer is a dead
process of this host, or one older than an hour (no write takes that long), whoever wrote it
(Store.clean_incoming, run before a Store's first write and by `store upgrade` and `store merge`).

Integrity (schema 4): the file carries `checksum`, "sha256:" + the SHA-256 of the canonical JSON
of everything else in the file (document.py, which reads every kind of file the store keeps).
Every read of a record that has a checksum verifies it; a record of schema 4 or later without one
is a problem, and an older record (which never had one) reads as "unverified". A damaged record
(truncated, a flipped digit, edited by hand) is reported by name and skipped, never read as if
it were right and never a crash of the reader.

Upgrading (`dlbench store upgrade`): records of older schemas are read at the current one on
every read (migrations.py) and never changed; Store.upgrade rewrites them at the current version,
with a fresh checksum and `upgraded_from` (the old version, the original file's SHA-256, when, by
which dlbench), replacing each file atomically (os.replace) after hard-linking the original into
.upgraded/<run_id>.v<old version>.json. The only time a record file is replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from .. import paths
# Re-exported: the store's readers and its tests know them from here.
from .document import (CHECKSUM_PREFIX, DocumentKind, StoreError, _canonical_fast, canonical_json,  # noqa: F401
                       checksum_of, read_regular)
from .migrations import upgrade
from .record import SCHEMA_VERSION, Record, valid_run_id

FIRST_CHECKSUMMED_VERSION = 4
RECORD_FILE = DocumentKind("record", StoreError, "schema_version", range(1, SCHEMA_VERSION + 1),
                           checksummed_from=FIRST_CHECKSUMMED_VERSION)
FILE_FIELDS = ("checksum", "upgraded_from")  # belong to the file, not to Record
STALE_TEMP_AGE_S = 3600.0
# What `dlbench run` asks of a store before its first benchmark: room for a record (most are
# 50-500 kB; one with long telemetry series a few MB) with some to spare.
MIN_FREE_BYTES = 64 * 2**20


class StoreWriteError(StoreError):
    """A record could not be written into the store; `kept` is where it was saved instead (a store
    of its own, for `dlbench store merge`), None if nowhere could take it."""

    def __init__(self, message: str, kept: Path | None):
        super().__init__(message)
        self.kept = kept


def file_digest(raw: bytes) -> str:
    """What the row index keeps of a record file's bytes: the same digest means the same bytes,
    so a file verified once and unchanged since needs no second verification."""
    return hashlib.sha256(raw).hexdigest()


# A lone surrogate ("\ud800") is valid JSON and a valid Python string, but no UTF-8 can encode it:
# the table, csv, SQLite and the report could not write it. Files can only hold one as an escape.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _without_lone_surrogates(value):
    """`value` with every lone surrogate in its strings (keys too) replaced by U+FFFD."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_without_lone_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_without_lone_surrogates(k): _without_lone_surrogates(v) for k, v in value.items()}
    return value


@dataclass
class Unreadable:
    path: Path
    reason: str


@dataclass
class StoredRecord:
    """A record as read from its file: the record at the current schema, and what the file said."""

    path: Path
    record: Record
    written_version: int  # the schema version in the file
    verified: bool  # the file's checksum matched (False: a record from before checksums)
    upgraded_from: dict | None
    raw: bytes


@dataclass
class UpgradeReport:
    upgraded: list[tuple[Path, int]] = field(default_factory=list)  # (path, old version)
    current: int = 0
    problems: list[Unreadable] = field(default_factory=list)


def _record_file(record: Record, **file_fields) -> bytes:
    """The file's bytes: the record as pydantic writes it (indented, fast), then the file's own
    fields and last the checksum of it all, appended inside the closing brace."""
    text = record.model_dump_json(indent=1)
    data = json.loads(text)
    data.update(file_fields)
    file_fields["checksum"] = checksum_of(data)
    tail = "".join(f',\n "{k}": {json.dumps(v, ensure_ascii=False)}' for k, v in file_fields.items())
    assert text.endswith("\n}")
    return (text[:-2] + tail + "\n}\n").encode()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_spare: dict[str, str] = {}


def _spare_name() -> str:
    """The spare store's folder name for this process: <UTC time of its first use>-<pid>."""
    key = str(os.getpid())
    if key not in _spare:
        _spare[key] = f"{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{os.getpid()}"
    return _spare[key]


def _host_tag() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "_", socket.gethostname()) or "unknown"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.runs = self.root / "runs"
        self.checks = self.root / "checks"
        self.incoming = self.root / ".incoming"
        self.upgraded = self.root / ".upgraded"
        self._cleaned = False

    # ------------------------------------------------------------------ writing

    def write(self, record: Record) -> Path:
        """Add a record (stamped with its checksum); refuses, untouched, a run id already stored or
        one that is not a run id (record.RUN_ID_PATTERN: never a path). A write the file system
        refuses (a full disk, a read-only mount) keeps the record elsewhere and raises
        StoreWriteError saying where (`keep_elsewhere`)."""
        if not valid_run_id(record.run_id):
            raise StoreError(f"{record.run_id!r} is not a run id (letters, digits, '_', '-' and '.', not first); "
                             "not written")
        final = self.runs / f"{record.run_id}.json"
        try:
            self.add(_record_file(record), final)
        except FileExistsError:
            raise StoreError(f"{final}: a record with run id {record.run_id} already exists; not overwritten") from None
        return final

    def add(self, content: bytes, final: Path, what: str = "record") -> None:
        """Make `final` appear with `content`, whole or not at all (`publish`): FileExistsError,
        leaving it alone, if it exists; a write the file system refuses (a full disk, a read-only
        mount) keeps the file elsewhere and raises StoreWriteError saying where (keep_file_elsewhere)."""
        try:
            self.publish(content, final)
        except FileExistsError:
            raise
        except OSError as e:
            raise self.keep_file_elsewhere(final, content, e, what) from None

    def keep_elsewhere(self, run_id: str, content: bytes, error: OSError) -> StoreWriteError:
        """After a failed write of a run record: see keep_file_elsewhere."""
        return self.keep_file_elsewhere(self.runs / f"{run_id}.json", content, error)

    def keep_file_elsewhere(self, final: Path, content: bytes, error: OSError, what: str = "record") -> StoreWriteError:
        """After a failed write of `final` (a run record, a kernel record, a check, a machine profile:
        any file under this store): its content put at the same place in a store of its own under
        the cache ($DLBENCH_CACHE/unsaved/<time>-<pid>/, else the temporary folder; one per process,
        so that one merge takes back all a command kept), whence `dlbench store merge` adds it to
        this store; the error to raise, saying where it is."""
        relative = Path(final).relative_to(self.root)
        why = f"cannot write {final}: {error.strerror or error}"
        for base in (paths.cache_dir() / "unsaved", Path(tempfile.gettempdir()) / f"dlbench-unsaved-{os.getuid()}"):
            spare = Store(base / _spare_name())
            if spare.root.resolve() == self.root.resolve():
                continue
            kept = spare.root / relative
            try:
                spare.publish(content, kept)
            except FileExistsError:
                pass  # the same file kept before
            except OSError:
                continue
            return StoreWriteError(f"{why}; the {what} is kept in {kept}: once the store can take it, "
                                   f"`dlbench store merge {spare.root} --store {self.root}` adds it", kept)
        lost = "this run is lost" if what == "record" else f"this {what} is lost"
        return StoreWriteError(f"{why}; nowhere else could take the {what} either (the cache and the temporary "
                               f"folder refused it too): {lost}", None)

    def check_writable(self, need_bytes: int = MIN_FREE_BYTES) -> None:
        """What `dlbench run` checks before its first benchmark, so that no measurement is made that
        cannot be kept: the store is a directory (made if missing), a record can be staged in
        .incoming/ and linked into runs/ (a probe, removed at once), and `need_bytes` are free.
        StoreError saying which, else nothing."""
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"store {self.root}: is not a directory")
        try:
            self.runs.mkdir(parents=True, exist_ok=True)
            probe = self._stage(b"{}\n", ".probe")
            try:
                target = self.runs / f".probe-{secrets.token_hex(4)}.tmp"  # not a *.json: readers never see it
                os.link(probe, target)
                target.unlink()
            finally:
                probe.unlink(missing_ok=True)
        except OSError as e:
            where = e.filename or self.root
            raise StoreError(f"store {self.root}: cannot write records ({where}: {e.strerror or e})") from None
        try:
            free = shutil.disk_usage(self.root).free
        except OSError as e:
            raise StoreError(f"store {self.root}: cannot tell the free space ({e.strerror or e})") from None
        if free < need_bytes:
            raise StoreError(f"store {self.root}: only {free / 2**20:.1f} MiB free; a run needs room for its record "
                             f"({need_bytes // 2**20} MiB asked); free some space or give another --store")

    def publish(self, content: bytes, final: Path) -> None:
        """Make `final` (in runs/ or checks/) appear with `content`, whole or not at all; raises
        FileExistsError, leaving the existing file alone, if it already exists."""
        if not self._cleaned:
            self._cleaned = True
            self.clean_incoming()
        self._move_in(content, final, os.link)

    def _stage(self, content: bytes, stem: str) -> Path:
        self.incoming.mkdir(parents=True, exist_ok=True)
        tmp = self.incoming / f"{stem}.{secrets.token_hex(4)}.{os.getpid()}.{_host_tag()}.tmp"
        try:
            with open(tmp, "xb") as f:
                f.write(content)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    def replace_file(self, content: bytes, final: Path) -> None:
        """Replace `final` (or make it) with `content`, whole or not at all: staged in .incoming/,
        then os.replace; OSError where the file system refuses it."""
        self._move_in(content, final, os.replace)

    def _move_in(self, content: bytes, final: Path, move) -> None:
        """`content` staged in .incoming/ (fsynced), then `move`d (os.link: never over an existing
        file; os.replace) to `final`; the staged name is gone afterwards whatever happened."""
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._stage(content, final.stem)
        try:
            move(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(final.parent)

    def clean_incoming(self, max_age_s: float = STALE_TEMP_AGE_S, dry_run: bool = False) -> list[Path]:
        """Remove temporary files no writer will finish: those of a dead process on this host, and
        any older than `max_age_s` (a writer on another host, or of an older naming). A live
        writer's file is never touched, so this is safe while others write."""
        if not self.incoming.is_dir():
            return []
        host, now, removed = _host_tag(), time.time(), []
        for tmp in self.incoming.glob("*.tmp"):
            parts = tmp.name[: -len(".tmp")].rsplit(".", 3)
            writer_dead = (len(parts) == 4 and parts[3] == host and parts[2].isdigit()
                           and not _pid_alive(int(parts[2])))
            try:
                old = now - tmp.stat().st_mtime > max_age_s
            except FileNotFoundError:
                continue  # its writer just finished
            if writer_dead or old:
                if not dry_run:
                    tmp.unlink(missing_ok=True)
                removed.append(tmp)
        return sorted(removed)

    # ------------------------------------------------------------------ reading

    def paths(self) -> list[Path]:
        """Every *.json in runs/, whatever kind of file it is: a FIFO or a directory is listed (and
        reported by `inspect`, never opened), not silently passed over."""
        return sorted(self.runs.glob("*.json")) if self.runs.is_dir() else []

    def inspect(self, path: Path) -> StoredRecord:
        """Read, verify and upgrade one record file; StoreError (naming the file) if it is damaged,
        invalid, of a newer schema, not a regular file (never opened), or, in this store's runs/,
        named other than its run id (a copy under another name: one run is one file)."""
        raw = read_regular(Path(path))
        return self._inspect_bytes(Path(path), raw)

    def _inspect_bytes(self, path: Path, raw: bytes) -> StoredRecord:
        document = RECORD_FILE.parse(path, raw)
        body = document.body(FILE_FIELDS)
        if _SURROGATE_ESCAPE.search(raw):  # verified as it is; read with U+FFFD for what UTF-8 cannot hold
            body = _without_lone_surrogates(body)
        try:
            current = upgrade(body, SCHEMA_VERSION)
        except (KeyError, TypeError, AttributeError, ValueError) as e:  # a migration step met odd data
            raise StoreError(f"{path}: cannot upgrade from schema {document.version}: "
                             f"{type(e).__name__}: {e}") from None
        record = RECORD_FILE.validate(Record, current, path)
        if path.parent == self.runs and record.run_id != path.stem:
            raise StoreError(f"{path}: run_id {record.run_id!r} does not match the file name")
        return StoredRecord(path, record, document.version, document.verified,
                            document.data.get("upgraded_from"), raw)

    def read(self, path: Path) -> Record:
        return self.inspect(path).record

    def records(self, problems: list[Unreadable] | None = None) -> Iterator[Record]:
        """Every readable record, oldest first; unreadable ones are reported into `problems`."""
        for path in self.paths():
            try:
                yield self.read(path)
            except StoreError as e:
                if problems is not None:
                    problems.append(Unreadable(path, str(e)))

    def stored_records(self, problems: list[Unreadable]) -> Iterator[StoredRecord]:
        """`records`, each as its file holds it (`inspect`); unreadable ones reported into `problems`."""
        for path in self.paths():
            try:
                yield self.inspect(path)
            except StoreError as e:
                problems.append(Unreadable(path, str(e)))

    # ------------------------------------------------------------------ maintenance


    def upgrade(self, report: UpgradeReport | None = None) -> UpgradeReport:
        """Rewrite every record of an older schema at the current one (see the module docstring);
        `report`, filled as it goes, says what was done even if this is interrupted."""
        from ..version import __version__

        self.clean_incoming()
        report = report if report is not None else UpgradeReport()
        for stored in self.stored_records(report.problems):
            path = stored.path
            if stored.written_version >= SCHEMA_VERSION:
                report.current += 1
                continue
            content = _record_file(stored.record, upgraded_from={
                "schema_version": stored.written_version,
                "file_sha256": hashlib.sha256(stored.raw).hexdigest(),
                "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "dlbench": __version__,
            })
            self.upgraded.mkdir(parents=True, exist_ok=True)
            original = self.upgraded / f"{path.stem}.v{stored.written_version}.json"
            try:
                os.link(path, original)
            except FileExistsError:
                if original.read_bytes() != stored.raw:  # an earlier upgrade was interrupted, or worse
                    report.problems.append(Unreadable(
                        path, f"{path}: not upgraded: {original} exists with other content"))
                    continue
            _fsync_dir(self.upgraded)
            self.replace_file(content, path)
            report.upgraded.append((path, stored.written_version))
        return report
