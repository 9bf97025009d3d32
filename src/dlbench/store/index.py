"""The store's rows, cached in STORE/.index/rows.sqlite so that a large store answers quickly.

The record files in runs/ are the only source of truth; the index holds what was derived from each
one (the row of `dlbench results` plus the run's key fields, its iteration times, or why it could
not be read), keyed by the file's name (its run id: a record named otherwise is unreadable, so a
copy under another name is never a second run), size, mtime_ns and the SHA-256 of its bytes. Every
read lists runs/ and compares: a file that is new or whose size or mtime changed is parsed again,
and every other file is read and hashed: bytes that differ from those verified when the row was
made (a byte flipped, with size and mtime put back) are parsed, verified and reported like any
damaged record, so each read checks every record's checksum, the cheap way for the unchanged ones.
An entry whose file is gone is dropped. So records written by `dlbench run`, copied in from another
store or deleted by hand are all noticed, and deleting STORE/.index/ loses nothing but time.
Whatever a record holds, its row is storable: an integer beyond int64 (a derived product) is
kept as a float, any other value that is not a number or a string as its JSON text.

The index is rebuilt from the records when it is missing, corrupt (the file is removed first) or
was built by other code: its fingerprint covers this layout, the record schema version, the row
columns and the source of the code that derives rows, so a changed formula never serves stale
numbers. SQLite makes each update one atomic transaction and serialises two processes updating at
once; files are parsed before the write transaction begins, so a long parse never holds the lock.
When the index cannot be used at all (a read-only store, a lock held too long), the rows come
from the records directly and the reason is returned as a note.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import sqlite3
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

from .record import SCHEMA_VERSION, Record
from .rows import COLUMNS, run_row
from .store import Store, StoreError, Unreadable, file_digest, read_regular
from .utilisation import Peaks

INDEX_LAYOUT = 2
INDEX_DIR = ".index"
INDEX_FILE = "rows.sqlite"
# Below this many files to parse, starting worker processes costs more than it saves.
PARALLEL_FROM = 200
LOCK_WAIT_S = 30.0


# Added to each run's row (after rows.COLUMNS, and never replacing one of them).
KEY_COLUMNS = ("ended_at", "profile", "machine_id", "cpu_model", "gpu_model", "os", "dlbench_version",
               "dlbench_commit", "network_hash", "env_backend", "learning_rate", "momentum", "repeats_requested")
ROW_COLUMNS = tuple(dict.fromkeys([*COLUMNS, *KEY_COLUMNS]))


def key_fields(r: Record) -> dict[str, Any]:
    """What identifies a run beyond the results columns: where, with what, under which profile."""
    m = r.machine
    gpu_names = sorted({g.get("name") for g in m.get("gpus", []) if g.get("name")})
    return {
        "ended_at": r.ended_at.isoformat(timespec="seconds"),
        "profile": r.settings.profile,
        "machine_id": machine_id(m),
        "cpu_model": m.get("cpu_model"),
        "gpu_model": ", ".join(gpu_names) or None,
        "os": m.get("os"),
        "dlbench_version": r.dlbench.get("version"),
        "dlbench_commit": r.dlbench.get("commit"),
        "network_hash": r.network.hash,
        "env_backend": r.environment.get("backend"),
        "learning_rate": r.workload.learning_rate,
        "momentum": r.workload.momentum,
        "repeats_requested": r.settings.repeats,
    }


def machine_id(machine: dict) -> str:
    """The record's machine id (schema 4 on, and older records through their migration); for a
    fingerprint without one, a short hash of the hardware it names, so hosts are still told apart."""
    given = machine.get("machine_id")
    if given:
        return str(given)
    facts = [machine.get(k) for k in ("hostname", "cpu_model", "cpu_logical", "memory_bytes", "arch")]
    facts.append(sorted(str(g.get("uuid") or g.get("name")) for g in machine.get("gpus", [])))
    return hashlib.sha256(json.dumps(facts, default=str).encode()).hexdigest()[:16]


class Derived(NamedTuple):
    """What one record file yields, serialised for the index (and for the trip back from a worker)."""

    file: str
    size: int
    mtime_ns: int
    digest: str | None  # file_digest of the bytes the row was made from (None: the file could not be read)
    row: tuple | None  # the row's values in ROW_COLUMNS order; None when the file is unreadable
    error: str | None  # why it is unreadable, without the path (the store may move)
    repeats: str | None  # JSON [[repeat index, repeat status, measured iterations], ...]
    seconds: bytes | None  # every measured iteration time, float64, repeat after repeat


@dataclass
class Iterations:
    """The measured iteration times of one run: repeats[i] = (index, status, count) in order."""

    repeats: list[tuple[int, str, int]]
    seconds: np.ndarray


@dataclass
class Snapshot:
    rows: list[dict]  # one per readable record, oldest first (by file name, as Store.paths)
    unreadable: list[Unreadable] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # why the index could not be used, if it could not
    iterations: dict[str, Iterations] | None = None  # by run_id, when asked for


INT64 = (-(2**63), 2**63 - 1)


def _plain(value):
    """A row value as SQLite can hold it: numpy scalars (e.g. from scipy) as the Python numbers they
    are, an integer beyond int64 (a product of bounded fields can be) as a float, a string with a
    lone surrogate with U+FFFD, anything else that is not a number or a string as its JSON text."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, float)):
        return value
    if isinstance(value, int):
        if INT64[0] <= value <= INT64[1]:
            return value
        try:
            return float(value)
        except OverflowError:
            return str(value)
    if isinstance(value, str):
        return value if value.isascii() else value.encode("utf-8", "replace").decode("utf-8")
    return _plain(json.dumps(value, ensure_ascii=False, sort_keys=True, default=str))


def _strip_path(reason: str, path: Path) -> str:
    prefix = f"{path}: "
    return reason[len(prefix):] if reason.startswith(prefix) else reason


def derive(root: Path, file: str, size: int, mtime_ns: int) -> Derived:
    """Read one record file and derive its row and iterations; a bad file gives its reason instead."""
    store = Store(root)
    path = store.runs / file
    try:
        stored = store.inspect(path)
    except StoreError as e:  # its digest too: a damaged file is not parsed again until its bytes change
        return Derived(file, size, mtime_ns, _digest_of(path), None, _strip_path(str(e), path), None, None)
    record, digest = stored.record, file_digest(stored.raw)
    try:
        row = {**key_fields(record), **run_row(record)}
        values = tuple(_plain(row.get(c)) for c in ROW_COLUMNS)
        repeats = [[rep.index, rep.status, len(rep.iter_s)] for rep in record.repeats]
        seconds = np.array([t for rep in record.repeats for t in rep.iter_s], dtype=np.float64).tobytes()
        return Derived(file, size, mtime_ns, digest, values, None, json.dumps(repeats), seconds)
    except Exception as e:  # a record the row code cannot handle is reported like an unreadable one
        return Derived(file, size, mtime_ns, digest, None, f"cannot make its row: {type(e).__name__}: {e}", None, None)


def _digest_of(path: Path) -> str | None:
    try:
        return file_digest(read_regular(path))
    except StoreError:
        return None


def _digests(store: Store, files: list[str]) -> dict[str, str | None]:
    """file -> the digest of its bytes now. Threads: reading and hashing release the GIL."""
    paths = [store.runs / f for f in files]
    if len(paths) < PARALLEL_FROM or _workers() < 2:
        return dict(zip(files, map(_digest_of, paths)))
    with ThreadPoolExecutor(min(_workers(), 8)) as pool:
        return dict(zip(files, pool.map(_digest_of, paths, chunksize=64)))


def _deriving_sources() -> list[Path]:
    """The code a cached row depends on: this package (reading, upgrading, rows) and what it calls."""
    package = Path(__file__).parent
    return sorted(p for p in package.glob("*.py") if p.name != "frame.py") + [
        package.parent / "statistics.py", package.parent / "machine.py"]


def fingerprint() -> str:
    """Changes whenever cached rows could differ from freshly derived ones: another layout, record
    schema or set of columns, or any edit to the code that reads records and makes rows (hashed
    rather than versioned by hand, so that nobody has to remember to bump a number)."""
    h = hashlib.sha256()
    h.update(json.dumps([INDEX_LAYOUT, SCHEMA_VERSION, list(ROW_COLUMNS)]).encode())
    for source in _deriving_sources():
        h.update(source.name.encode())
        h.update(source.read_bytes() if source.exists() else b"")
    return h.hexdigest()


def _listing(store: Store) -> dict[str, tuple[int, int]]:
    out = {}
    for path in store.paths():
        try:
            st = path.stat()
        except FileNotFoundError:  # removed since it was listed
            continue
        out[path.name] = (st.st_size, st.st_mtime_ns)
    return out


def _workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _derive_many(root: Path, wanted: list[tuple[str, int, int]]) -> list[Derived]:
    workers = min(_workers(), 8)
    if len(wanted) < PARALLEL_FROM or workers < 2:
        return [derive(root, *w) for w in wanted]
    # fork: the children need nothing but this module, and spawning would re-import everything
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork") if "fork" in methods else None
    files, sizes, mtimes = zip(*wanted)
    try:
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            return list(pool.map(partial(derive, root), files, sizes, mtimes, chunksize=32))
    except (BrokenProcessPool, OSError):  # e.g. no processes left: slower, but the same answer
        return [derive(root, *w) for w in wanted]


class _Corrupt(Exception):
    """The index holds something this code did not write: remove it and build again."""


# One SQL column per row column: SQLite keeps each value's type (integer, real, text, null), so
# rows come back as Python values with no parsing. The fingerprint covers the column list.
_ROW_SQL = ", ".join(f'"{c}"' for c in ROW_COLUMNS)
_TABLES = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    f"CREATE TABLE runs (file TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, digest TEXT, "
    f"error TEXT, {_ROW_SQL})",
    "CREATE TABLE iterations (file TEXT PRIMARY KEY, repeats TEXT NOT NULL, seconds BLOB NOT NULL)",
)


def _damaged(e: Exception) -> bool:
    """A damaged index file (as opposed to one that is locked, read-only or on a full disk)."""
    return isinstance(e, _Corrupt) or getattr(e, "sqlite_errorname", "") in ("SQLITE_NOTADB", "SQLITE_CORRUPT")


class RowIndex:
    def __init__(self, store: Store, on_parse: Callable[[int], None] | None = None):
        self.store = store
        self.path = store.root / INDEX_DIR / INDEX_FILE
        self.on_parse = on_parse  # told how many files are about to be parsed, when that takes a while

    def _connect(self) -> sqlite3.Connection:
        # autocommit mode: transactions are begun explicitly, IMMEDIATE for the one that writes
        return sqlite3.connect(self.path, timeout=LOCK_WAIT_S, isolation_level=None)

    @staticmethod
    def _current(db: sqlite3.Connection, expected: str) -> bool:
        names = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if names != {"meta", "runs", "iterations"}:
            return False
        found = db.execute("SELECT value FROM meta WHERE key = 'fingerprint'").fetchone()
        return found is not None and found[0] == expected

    def cached(self, expected: str) -> dict[str, tuple]:
        """file -> (size, mtime_ns, digest, error, *row values) as indexed; empty when the index is absent or stale."""
        if not self.path.exists():
            return {}
        db = self._connect()
        try:
            db.execute("BEGIN")
            if not self._current(db, expected):
                return {}
            query = f"SELECT file, size, mtime_ns, digest, error, {_ROW_SQL} FROM runs"
            return {file: rest for file, *rest in db.execute(query)}
        finally:
            db.close()

    def write(self, expected: str, derived: list[Derived], removed: list[str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            if not self._current(db, expected):
                # New, or built by other code: start over. Entries this process reused from the old
                # index are not carried over; the next read finds them missing and parses them.
                for table in ("meta", "runs", "iterations"):
                    db.execute(f"DROP TABLE IF EXISTS {table}")
                for statement in _TABLES:
                    db.execute(statement)
                db.execute("INSERT INTO meta VALUES ('fingerprint', ?)", (expected,))
            gone = [(f,) for f in removed] + [(d.file,) for d in derived]
            db.executemany("DELETE FROM runs WHERE file = ?", gone)
            db.executemany("DELETE FROM iterations WHERE file = ?", gone)
            blank = (None,) * len(ROW_COLUMNS)
            db.executemany(f"INSERT INTO runs VALUES (?, ?, ?, ?, ?, {', '.join('?' * len(ROW_COLUMNS))})",
                           [(d.file, d.size, d.mtime_ns, d.digest, d.error, *(d.row or blank)) for d in derived])
            db.executemany("INSERT INTO iterations VALUES (?, ?, ?)",
                           [(d.file, d.repeats, d.seconds) for d in derived if d.row is not None])
            db.execute("COMMIT")
        finally:
            db.close()

    def iterations(self, files: list[str]) -> dict[str, tuple[str, bytes]]:
        wanted = set(files)
        db = self._connect()
        try:
            db.execute("BEGIN")
            return {f: (reps, secs) for f, reps, secs in db.execute("SELECT file, repeats, seconds FROM iterations")
                    if f in wanted}
        finally:
            db.close()

    def remove(self) -> None:
        """Delete a damaged index; what cannot be deleted fails again on the retry, which then
        falls back to the records."""
        for suffix in ("", "-journal", "-wal", "-shm"):
            try:
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            except OSError:
                pass

    def snapshot(self, iterations: bool = False) -> Snapshot:
        try:
            return self._snapshot(iterations, use_index=True)
        except (_Corrupt, sqlite3.DatabaseError) as e:
            if not _damaged(e):
                raise
            self.remove()  # then build it again, once; if that fails too, read the records alone
            try:
                return self._snapshot(iterations, use_index=True)
            except (_Corrupt, sqlite3.DatabaseError) as again:
                snap = self._snapshot(iterations, use_index=False)
                snap.notes.insert(0, f"the row index {self.path} is still unusable after a rebuild ({again}); "
                                     "read every record instead")
                return snap

    def _snapshot(self, iterations: bool, use_index: bool) -> Snapshot:
        listing = _listing(self.store)
        notes: list[str] = []
        expected = fingerprint()
        cached: dict[str, tuple] = {}
        if use_index:
            try:
                cached = self.cached(expected)
            except (sqlite3.Error, OSError) as e:
                if _damaged(e):
                    raise
                notes.append(self._unusable(e))
                use_index = False
        stale = {f for f, (size, mtime, *_rest) in cached.items() if listing.get(f) != (size, mtime)}
        # the files that look unchanged are read and hashed: bytes other than those the row was made
        # from are parsed (and verified) again, whatever their size and mtime say
        unchanged = [f for f in cached if f in listing and f not in stale]
        now = _digests(self.store, unchanged)
        stale.update(f for f in unchanged if now[f] != cached[f][2])
        wanted = [(f, *key) for f, key in listing.items() if f not in cached or f in stale]
        if self.on_parse is not None and len(wanted) >= PARALLEL_FROM:
            self.on_parse(len(wanted))
        fresh = _derive_many(self.store.root, wanted)
        if use_index and (fresh or stale):  # nothing to record: leave the store untouched
            try:
                self.write(expected, fresh, sorted(stale - listing.keys()))
            except (sqlite3.Error, OSError, ValueError, OverflowError) as e:  # ValueError: a file name not UTF-8
                if _damaged(e):
                    raise
                notes.append(self._unusable(e))
                use_index = False
        known = {f: Derived(f, size, mtime, digest, None if error is not None else tuple(row), error, None, None)
                 for f, (size, mtime, digest, error, *row) in cached.items() if f in listing and f not in stale}
        known.update((d.file, d) for d in fresh)
        snap = _assemble(self.store, listing, known, iterations, self.iterations if use_index else None)
        snap.notes[:0] = notes
        return snap

    def _unusable(self, e: Exception) -> str:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return f"the row index {self.path} cannot be used ({reason}); read every record instead"


def _assemble(store: Store, listing: dict, known: dict[str, Derived], iterations: bool, stored_iterations) -> Snapshot:
    snap = Snapshot(rows=[])
    readable = []
    for file in sorted(listing):
        d = known[file]
        if d.row is None:
            snap.unreadable.append(Unreadable(store.runs / file, f"{store.runs / file}: {d.error}"))
            continue
        snap.rows.append(dict(zip(ROW_COLUMNS, d.row)))
        readable.append(d)
    if not iterations:
        return snap
    missing = [d.file for d in readable if d.seconds is None]
    found: dict[str, tuple[str, bytes]] = {}
    if missing and stored_iterations is not None:
        try:
            found = stored_iterations(missing)
        except (sqlite3.Error, OSError) as e:
            if _damaged(e):
                raise
    # whatever the index could not give (another process may have rebuilt it meanwhile) comes from the file
    for d in _derive_many(store.root, [(f, *listing[f]) for f in missing if f not in found]):
        found[d.file] = (d.repeats, d.seconds)
    snap.iterations = {}
    for d, row in zip(readable, snap.rows):
        reps, secs = (d.repeats, d.seconds) if d.seconds is not None else found[d.file]
        if reps is None:  # the file turned unreadable since it was indexed
            reps, secs = "[]", b""
        try:
            snap.iterations[row["run_id"]] = Iterations([tuple(r) for r in json.loads(reps)],
                                                        np.frombuffer(secs, dtype=np.float64))
        except (TypeError, ValueError) as e:
            raise _Corrupt(f"{d.file}: {e}") from None
    return snap


def read_rows(store: Store, iterations: bool = False, on_parse: Callable[[int], None] | None = None) -> Snapshot:
    """Every record's row (and, if asked, its iteration times), through the index where it can be used.
    `on_parse(n)` is called before n >= PARALLEL_FROM files are parsed (a first read, a big merge).
    Each row's MFU is derived here, after the index, from the store's machine profiles as they are
    now: a profile calibrated after the run still applies to it."""
    snap = RowIndex(store, on_parse).snapshot(iterations)
    peaks = Peaks(store)
    for row in snap.rows:
        peaks.attach(row)
    return snap
