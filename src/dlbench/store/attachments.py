"""The files a record keeps beside it in the store, listed in the record with their SHA-256: a
LoadGen run's logs (STORE/loadgen/<run_id>/..., schema 9: with their sizes too) and a convergence
run's MLLOG files (STORE/mllog/<run_id>/seed-<s>.log, schema 11). The record's own checksum covers
that list, so `store verify` proves each file by hashing it again (`attachment_problems`), and
`store merge` copies the files with their record, each checked against it (`merge_attachments`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from .record import Record
from .store import Store, StoreError, read_regular


@dataclass(frozen=True)
class Attachment:
    path: str  # relative to the store's root
    sha256: str
    size: int | None  # None where the record lists no size (MLLOG files)
    what: str  # for people: "LoadGen log", "MLLOG file"


def attachments(record: Record) -> list[Attachment]:
    """Every file `record` lists beside it."""
    out = [Attachment(log.path, log.sha256, log.bytes, "LoadGen log")
           for log in (record.loadgen.logs if record.loadgen else [])]
    out += [Attachment(run.mllog, run.mllog_sha256, None, "MLLOG file")
            for run in (record.convergence.runs if record.convergence else [])
            if run.mllog and run.mllog_sha256]
    return out


def attachment_problem(root: Path, a: Attachment) -> str | None:
    """Why a listed file is not what its record says (missing, not a regular file, other bytes), or None."""
    path = Path(root) / a.path
    try:
        raw = read_regular(path)
    except StoreError as e:
        return str(e)
    digest = hashlib.sha256(raw).hexdigest()
    if digest != a.sha256 or (a.size is not None and len(raw) != a.size):
        said = f"{a.size} bytes, " if a.size is not None else ""
        return (f"{path}: checksum mismatch with its record ({len(raw)} bytes hashing to {digest[:12]}..., "
                f"the record says {said}{a.sha256[:12]}...)")
    return None


def attachment_problems(root: Path, record: Record) -> list[tuple[Path, str]]:
    """(path, why) for every file of `record` that is not as the record lists it."""
    return [(Path(root) / a.path, why) for a in attachments(record) if (why := attachment_problem(root, a))]


def merge_attachments(destination: Store, source_root: Path, record: Record) -> tuple[list[tuple[Path, str, str]],
                                                                                     list[tuple[Path, str]]]:
    """Copy a record's files from `source_root` into `destination` (before the record), each checked
    against the record. A file the destination already holds as listed needs no source (a record kept
    in a spare store after a failed write comes back to files written before it).
    (damaged: (path, why, what), conflicts: (path, why)): a file neither side holds as listed; another
    file under a listed name. With either, the record must not be merged."""
    damaged, conflicts = [], []
    for a in attachments(record):
        if attachment_problem(destination.root, a) is None:
            continue
        why = attachment_problem(source_root, a)
        if why is not None:
            damaged.append((Path(source_root) / a.path, why, a.what))
            continue
        target = destination.root / a.path
        try:
            destination.publish(read_regular(Path(source_root) / a.path), target)
        except FileExistsError:
            conflicts.append((target, f"{target} exists with other content than run {record.run_id} lists; kept it"))
    return damaged, conflicts


ATTACHMENT_DIRS = ("loadgen", "mllog")  # where records keep their files, STORE/<dir>/<run_id>/...


def unlisted_files(root: Path, listed: set[str]) -> list[Path]:
    """Files under the attachment folders that no record lists (`listed`: every record's attachment
    paths, relative to `root`): what a run that died between writing its logs and its record left,
    or what was copied in by hand. Not damage: no record depends on them."""
    out = []
    for name in ATTACHMENT_DIRS:
        folder = Path(root) / name
        if folder.is_dir():
            out += [p for p in sorted(folder.rglob("*"))
                    if p.is_file() and p.relative_to(root).as_posix() not in listed]
    return out

