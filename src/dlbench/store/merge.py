"""Merge stores from several machines into one, with no duplicates and no loss.

For every run record of every source store (runs/<run_id>.json) and every equivalence check
(checks/<network>--<framework>--<version>.json):

- not in the destination yet: copied as it is (the same bytes: a record of an older schema stays
  at its schema and is upgraded on read like any other), atomically (Store.publish: a temporary
  file, then a link that never replaces anything), so an interrupted merge leaves only whole files
  and can simply be run again;
- present with the same content: a duplicate, skipped. Records are compared by what they say at
  the current schema, so a record and the same record rewritten by `store upgrade` are duplicates;
- present with other content: a conflict, reported and left alone (the destination keeps its
  file); someone has to decide. Check files of one (network, framework, version) that agree on
  the network hash and the status are duplicates (the destination's is kept: nightly runners
  re-check at different times); a different verdict is a conflict;
- damaged (truncated, checksum mismatch, invalid, named other than its run id, of a newer schema
  than this dlbench reads): reported as unreadable and skipped.

The files a record keeps beside it (attachments.py: a LoadGen run's logs under loadgen/<run_id>/, a
convergence run's MLLOG files under mllog/<run_id>/) travel with it: each is checked against the
SHA-256 (and size) the record lists and copied before the record, so a merged record never lacks
them (one the destination already holds as listed is not needed from the source: a record kept in
a spare store after a failed write comes back to its files); a file neither side holds as listed
keeps its record out (unreadable), another file under a listed name is a conflict.

Kernel records (kernels/<run_id>.json) and machine profiles (machines/<id>/profile-<revision>.json)
are merged the same way, compared byte for byte: the same file is a duplicate, another one under
the same name a conflict.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .checks import check_file_problem
from .attachments import merge_attachments
from .store import Store, StoreError, read_regular
from .verify import performance_file_problems


@dataclass
class MergeReport:
    added: list[Path] = field(default_factory=list)  # destination paths
    duplicates: list[Path] = field(default_factory=list)  # source paths
    conflicts: list[tuple[Path, str]] = field(default_factory=list)  # (source path, why)
    unreadable: list[tuple[Path, str]] = field(default_factory=list)  # (source path, why)

    @property
    def clean(self) -> bool:
        return not self.conflicts and not self.unreadable


class MergeError(Exception):
    """A source cannot be merged at all (not a store, or the destination itself)."""


def check_sources(destination: Store, sources: list[Path]) -> None:
    dest = destination.root.resolve()
    for src in sources:
        if not src.is_dir():
            raise MergeError(f"{src}: no such store (not a directory)")
        if not any((src / d).is_dir() for d in ("runs", "checks", "kernels", "machines")):
            raise MergeError(f"{src}: not a dlbench store (it has none of runs/, checks/, kernels/, machines/)")
        if src.resolve() == dest:
            raise MergeError(f"{src}: is the destination store itself")


def merge(destination: Store, sources: list[Path], report: MergeReport | None = None) -> MergeReport:
    """Merge `sources` into `destination`; `report` (filled as it goes) says what happened even
    when the merge is interrupted."""
    check_sources(destination, sources)
    report = report if report is not None else MergeReport()
    destination.clean_incoming()
    for src in sources:
        source = Store(src)
        for path in source.paths():
            _merge_record(destination, source, path, report)
        for path in sorted(source.checks.glob("*.json")) if source.checks.is_dir() else []:
            _merge_check(destination, path, report)
        for path, problem in performance_file_problems(source.root):
            _merge_performance_file(destination, source, path, problem, report)
    return report


def _merge_performance_file(destination: Store, source: Store, path: Path, problem: str | None,
                            report: MergeReport) -> None:
    """A kernel record or machine profile: copied when new, a duplicate when the same bytes, else a
    conflict (one machine calibrated in two stores under the same revision number): kept as it is."""
    if problem:
        report.unreadable.append((path, problem))
        return
    raw = read_regular(path)
    target = destination.root / path.relative_to(source.root)
    if _added(destination, raw, target, report):
        return
    if _bytes_of(target) == raw:
        report.duplicates.append(path)
        return
    report.conflicts.append((path, f"{path}: {target} exists with other content; kept it"))


def _merge_record(destination: Store, source: Store, path: Path, report: MergeReport) -> None:
    try:
        incoming = source.inspect(path)
    except StoreError as e:
        report.unreadable.append((path, str(e)))
        return
    target = destination.runs / path.name
    damaged, clashes = merge_attachments(destination, source.root, incoming.record)
    if damaged:
        report.unreadable.append((path, f"{path}: its {damaged[0][2]} {damaged[0][1]}"))
        return
    if clashes:
        report.conflicts.append((path, clashes[0][1]))
        return
    if _added(destination, incoming.raw, target, report):
        return
    if _bytes_of(target) == incoming.raw:
        report.duplicates.append(path)
        return
    try:
        existing = destination.inspect(target)
    except StoreError as e:
        report.conflicts.append((path, f"{path}: {target} has the same run id but is itself unreadable ({e})"))
        return
    if existing.record == incoming.record:
        report.duplicates.append(path)
        return
    mine, theirs = existing.record.model_dump(), incoming.record.model_dump()
    differ = [k for k in mine if mine[k] != theirs.get(k)]
    report.conflicts.append((path, f"{path}: run {incoming.record.run_id} is already in the store with other "
                                   f"content (differs in: {', '.join(differ)}); kept {target}"))


def _added(destination: Store, raw: bytes, target: Path, report: MergeReport) -> bool:
    """`raw` copied to `target` (whole or not at all) and reported as added; False, copying nothing,
    where `target` exists already."""
    try:
        destination.publish(raw, target)
    except FileExistsError:
        return False
    report.added.append(target)
    return True


def _bytes_of(path: Path) -> bytes | None:
    """A destination file's bytes; None when it is not a regular file or cannot be read (never blocks on a FIFO)."""
    try:
        return read_regular(path)
    except StoreError:
        return None


def _same_verdict(existing: dict, incoming: dict) -> bool:
    """Two checks of one (network, framework, version) that agree on the network's hash and the
    status are the same evidence (nightly runners re-check every night, at different times, with
    errors that differ in the last digits): the destination's is kept. A different verdict is a
    conflict someone has to look at."""
    keys = ("network", "framework", "framework_version", "network_hash", "status")
    return all(existing.get(k) == incoming.get(k) for k in keys)


def _merge_check(destination: Store, path: Path, report: MergeReport) -> None:
    problem = check_file_problem(path)
    if problem:
        report.unreadable.append((path, problem))
        return
    raw = read_regular(path)
    target = destination.checks / path.name
    if _added(destination, raw, target, report):
        return
    existing = _bytes_of(target)
    if existing == raw or (existing is not None and check_file_problem(target) is None
                           and _same_verdict(json.loads(existing), json.loads(raw))):
        report.duplicates.append(path)
        return
    report.conflicts.append((path, f"{path}: {target} holds another result for this network, framework and "
                                   "version; kept it"))
