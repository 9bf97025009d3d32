"""`dlbench store verify`: every file the store owns read the way its reader reads it (run records,
equivalence checks, kernel records, machine profiles), nothing changed; and the same checks for
`store merge`, which refuses to copy a damaged file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .checks import check_file_problem
from .kernels import KernelStore
from .attachments import attachment_problems, attachments, unlisted_files
from .profiles import ProfileError, read_profile
from .store import Store, Unreadable


@dataclass
class VerifyReport:
    verified: list[Path] = field(default_factory=list)
    unverified: list[tuple[Path, int]] = field(default_factory=list)  # (path, schema version)
    problems: list[Unreadable] = field(default_factory=list)
    checks: int = 0  # readable check files
    kernels: int = 0  # readable kernel records (STORE/kernels/)
    profiles: int = 0  # readable machine profiles (STORE/machines/)
    leftovers: list[Path] = field(default_factory=list)  # temporary files in .incoming/
    stale: list[Path] = field(default_factory=list)  # of those, the ones clean_incoming would remove
    unlisted: list[Path] = field(default_factory=list)  # files in loadgen/ and mllog/ that no record lists


def performance_files(root: Path) -> list[Path]:
    """The performance model's files in a store: kernel records and machine profiles."""
    kernels = sorted((root / "kernels").glob("*.json")) if (root / "kernels").is_dir() else []
    machines = sorted((root / "machines").glob("*/profile-*.json")) if (root / "machines").is_dir() else []
    return kernels + machines


def performance_file_problems(root: Path) -> list[tuple[Path, str | None]]:
    """(path, why it cannot be used, or None) for every kernel record and machine profile."""
    out: list[tuple[Path, str | None]] = []
    for path in performance_files(root):
        try:
            KernelStore.read(path) if path.parent.name == "kernels" else read_profile(path)
            out.append((path, None))
        except (ValueError, ProfileError) as e:
            out.append((path, str(e)))
    return out


def verify(store: Store) -> VerifyReport:
    """Check every record (readable, valid, checksum, named after its run id), check file, kernel
    record, machine profile and file a record keeps beside it (LoadGen logs, MLLOG files) of `store`,
    and find the files beside records that no record lists; changes nothing."""
    report = VerifyReport()
    listed: set[str] = set()
    for stored in store.stored_records(report.problems):
        path = stored.path
        # the files a record keeps beside it (LoadGen logs, MLLOG files): each as its record lists it
        report.problems += [Unreadable(p, why) for p, why in attachment_problems(store.root, stored.record)]
        listed.update(a.path for a in attachments(stored.record))
        if stored.verified:  # (a record named other than its run id is a StoreError of inspect)
            report.verified.append(path)
        else:
            report.unverified.append((path, stored.written_version))
    for path in sorted(store.checks.glob("*.json")) if store.checks.is_dir() else []:
        reason = check_file_problem(path)
        if reason:
            report.problems.append(Unreadable(path, reason))
        else:
            report.checks += 1
    for path, reason in performance_file_problems(store.root):
        if reason:
            report.problems.append(Unreadable(path, reason))
        elif path.parent.name == "kernels":
            report.kernels += 1
        else:
            report.profiles += 1
    report.unlisted = unlisted_files(store.root, listed)
    if store.incoming.is_dir():
        report.leftovers = sorted(store.incoming.glob("*.tmp"))
        report.stale = store.clean_incoming(dry_run=True)
    return report
