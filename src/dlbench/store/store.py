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
(keys sorted, no whitespace, UTF-8) of everything else in the file. Canonical, so it does not
depend on how the file was indented or ordered, and a record read and dumped again keeps it.
Every read of a record that has a checksum verifies it; a record of schema 4 or later without one
is a problem, and an older record (which never had one) reads as "unverified". A damaged record
(truncated, a flipped digit, edited by hand) is reported by name and skipped, never read as if
it were right and never a crash of the reader.

Verifying is exact and cheap (`_verified_fast`): orjson parses the file and writes it again with
sorted keys, several times faster than the json module; the floats it writes in another notation
than json does (1e-9 for 1e-09, 0.00001 for 1e-05; always the same shortest digits) are rewritten
as json writes them, outside strings only. Those bytes hash to the stored checksum only if they
are the canonical JSON the writer hashed, and parsing them gives back what orjson read, so a match
proves the content. Anything else (no match, a file orjson refuses) is read and checked again the
defining way, with the json module, before it is called damaged: the fast way can only save time,
never accept a file the defining way would refuse.

Upgrading (`dlbench store upgrade`): records of older schemas are read at the current one on
every read (migrations.py) and never changed; Store.upgrade rewrites them at the current version,
with a fresh checksum and `upgraded_from` (the old version, the original file's SHA-256, when, by
which dlbench), replacing each file atomically (os.replace) after hard-linking the original into
.upgraded/<run_id>.v<old version>.json. The only time a record file is replaced.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import stat
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import orjson
from pydantic import ValidationError

from .. import paths
from .migrations import upgrade
from .record import SCHEMA_VERSION, Record, valid_run_id

CHECKSUM_PREFIX = "sha256:"
FIRST_CHECKSUMMED_VERSION = 4
FILE_FIELDS = ("checksum", "upgraded_from")  # belong to the file, not to Record
STALE_TEMP_AGE_S = 3600.0
# What `dlbench run` asks of a store before its first benchmark: room for a record (most are
# 50-500 kB; one with long telemetry series a few MB) with some to spare.
MIN_FREE_BYTES = 64 * 2**20


class StoreError(Exception):
    pass


class StoreWriteError(StoreError):
    """A record could not be written into the store; `kept` is where it was saved instead (a store
    of its own, for `dlbench store merge`), None if nowhere could take it."""

    def __init__(self, message: str, kept: Path | None):
        super().__init__(message)
        self.kept = kept


def read_regular(path: Path) -> bytes:
    """The bytes of a regular file; StoreError for anything else (a FIFO, a device, a directory),
    which is never read: opening a FIFO for reading blocks until a writer comes, which may be never.
    The check is made on the open descriptor too (O_NONBLOCK: opening a FIFO so returns at once),
    so a file swapped for a FIFO after the first look is refused as well."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{path}: not a regular file ({_file_kind(st.st_mode)}); ignored, never opened")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise StoreError(f"{path}: unreadable: {type(e).__name__}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{path}: not a regular file ({_file_kind(st.st_mode)}); ignored")
        chunks = []
        while chunk := os.read(fd, max(st.st_size + 1, 65536)):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise StoreError(f"{path}: unreadable: {type(e).__name__}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a plain file"


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


def canonical_json(data) -> bytes:
    # surrogatepass: a lone surrogate escaped in a file ("\ud800") must hash, not crash the reader
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def checksum_of(data: dict) -> str:
    """The checksum a record file's data should carry (its own `checksum` field left out)."""
    body = {k: v for k, v in data.items() if k != "checksum"}
    return CHECKSUM_PREFIX + hashlib.sha256(canonical_json(body)).hexdigest()


# where a number orjson writes otherwise than json may be: an exponent (json: 1e-09, 1e+16; orjson:
# 1e-9, 1e16) or a small number written out (json: 1e-05; orjson: 0.00001). Found by their literal
# part, which the re module and bytes.find scan for quickly; the whole number is then matched.
_EXPONENT = re.compile(rb"e[-+]?[0-9]")
_SMALL = b"0.0000"
_NUMBER = re.compile(rb"-?[0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?(?=[,\]}])")
_NUMBER_BYTES = frozenset(b"0123456789.-")


def _number_starts(out: bytes) -> list[int]:
    starts = set()
    anchors = [m.start() for m in _EXPONENT.finditer(out) if m.start() and out[m.start() - 1] in b"0123456789"]
    at = out.find(_SMALL)
    while at != -1:
        anchors.append(at)
        at = out.find(_SMALL, at + len(_SMALL))
    for at in anchors:
        while at and out[at - 1] in _NUMBER_BYTES:
            at -= 1
        starts.add(at)
    return sorted(starts)


def _canonical_fast(body: dict) -> bytes | None:
    """canonical_json(body) by way of orjson (None where orjson cannot write it): orjson's sorted
    output with each float in the notation json uses. A number-like text inside a string is left
    alone: strings are told apart by counting the quotes before it, once escaped quotes and
    backslashes are blanked out (same length, so positions still line up)."""
    try:
        out = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):  # an int beyond 64 bits, a lone surrogate, deep nesting
        return None
    quotes = out.replace(b"\\\\", b"\0\0").replace(b'\\"', b"\0\0") if b"\\" in out else out
    parts, copied, counted, inside = [], 0, 0, False
    for start in _number_starts(out):
        inside ^= quotes.count(b'"', counted, start) % 2 == 1
        counted = start
        number = None if inside or out[start - 1:start] not in (b":", b",", b"[") else _NUMBER.match(out, start)
        if number is not None:  # outside strings every number follows one of those and ends before , ] }
            parts += (out[copied:start], repr(float(number[0])).encode())
            copied = number.end()
    if not parts:
        return out
    parts.append(out[copied:])
    return b"".join(parts)


def _verified_fast(raw: bytes) -> dict | None:
    """The file's data if orjson can show it matches its own checksum; None: decide the slow way."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    stored = data.get("checksum") if isinstance(data, dict) else None
    if not isinstance(stored, str) or not stored.startswith(CHECKSUM_PREFIX):
        return None
    canonical = _canonical_fast({k: v for k, v in data.items() if k != "checksum"})
    if canonical is None or CHECKSUM_PREFIX + hashlib.sha256(canonical).hexdigest() != stored:
        return None
    return data


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


def _field_path(err: dict) -> str:
    return ".".join(str(p) for p in err["loc"])


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
        content = _record_file(record)
        try:
            self.publish(content, final)
        except FileExistsError:
            raise StoreError(f"{final}: a record with run id {record.run_id} already exists; not overwritten") from None
        except OSError as e:
            raise self.keep_elsewhere(record.run_id, content, e) from None
        return final

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
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._stage(content, final.stem)
        try:
            os.link(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(final.parent)

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

    def _replace(self, content: bytes, final: Path) -> None:
        tmp = self._stage(content, final.stem)
        try:
            os.replace(tmp, final)
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
        data = _verified_fast(raw)
        verified = data is not None
        if data is None:
            try:
                data = json.loads(raw)
            except (ValueError, RecursionError) as e:  # ValueError: not UTF-8, not JSON
                raise StoreError(f"{path}: unreadable record: {type(e).__name__}: {e}") from None
        version = data.get("schema_version") if isinstance(data, dict) else None
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise StoreError(f"{path}: schema_version: missing or invalid ({version!r})")
        if version > SCHEMA_VERSION:
            raise StoreError(f"{path}: schema version {version} is newer than this dlbench understands "
                             f"({SCHEMA_VERSION}); upgrade dlbench to read it")
        stored = data.get("checksum")
        if stored is None and version >= FIRST_CHECKSUMMED_VERSION:
            raise StoreError(f"{path}: checksum: missing (every record of schema {FIRST_CHECKSUMMED_VERSION} "
                             "or later has one); the file was edited or damaged")
        if stored is not None and not verified:  # whatever the version: a damaged version number must not hide it
            if not isinstance(stored, str) or not stored.startswith(CHECKSUM_PREFIX):
                raise StoreError(f"{path}: checksum: not a {CHECKSUM_PREFIX}<hex> value ({str(stored)[:40]!r})")
            actual = checksum_of(data)
            if actual != stored:
                raise StoreError(f"{path}: checksum mismatch: the file changed after it was written "
                                 f"(it says {stored[:19]}..., its content hashes to {actual[:19]}...)")
        upgraded_from = data.get("upgraded_from")
        body = {k: v for k, v in data.items() if k not in FILE_FIELDS}
        if _SURROGATE_ESCAPE.search(raw):  # verified as it is; read with U+FFFD for what UTF-8 cannot hold
            body = _without_lone_surrogates(body)
        try:
            record = Record.model_validate(upgrade(body, SCHEMA_VERSION))
        except ValidationError as e:
            err = e.errors()[0]
            raise StoreError(f"{path}: {_field_path(err)}: {err['msg']}") from None
        except (KeyError, TypeError, AttributeError, ValueError) as e:  # a migration step met odd data
            raise StoreError(f"{path}: cannot upgrade from schema {version}: {type(e).__name__}: {e}") from None
        if path.parent == self.runs and record.run_id != path.stem:
            raise StoreError(f"{path}: run_id {record.run_id!r} does not match the file name")
        return StoredRecord(path, record, version, stored is not None, upgraded_from, raw)

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

    # ------------------------------------------------------------------ maintenance


    def upgrade(self, report: UpgradeReport | None = None) -> UpgradeReport:
        """Rewrite every record of an older schema at the current one (see the module docstring);
        `report`, filled as it goes, says what was done even if this is interrupted."""
        from ..version import __version__

        self.clean_incoming()
        report = report if report is not None else UpgradeReport()
        for path in self.paths():
            try:
                stored = self.inspect(path)
            except StoreError as e:
                report.problems.append(Unreadable(path, str(e)))
                continue
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
            self._replace(content, path)
            report.upgraded.append((path, stored.written_version))
        return report
