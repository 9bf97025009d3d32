"""`dlbench store merge`: the stores of several machines into one, with no duplicates and no loss:
duplicates skipped, conflicts and damaged files reported and left alone, old schemas copied as
they are, checks merged the same way, an interrupted merge finished by running it again."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from test_store import make_record
from test_store_integrity import flip_a_digit, invoke

from dlbench.store.merge import MergeError, merge
from dlbench.store.record import SCHEMA_VERSION
from dlbench.store.store import Store, checksum_of
from dlbench.store.verify import verify

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "records"


def machine_store(root: Path, host: str, n: int, first: int = 0) -> Store:
    store = Store(root)
    for i in range(first, first + n):
        rec = make_record(f"20260101T0000{i:02d}Z-{host[:1] * 12}", benchmark=f"{host}-{i}")
        rec.machine = {"hostname": host, "machine_id": f"id-{host}"}
        store.write(rec)
    return store


def save_check(store: Store, name: str, **content) -> Path:
    store.checks.mkdir(parents=True, exist_ok=True)
    path = store.checks / f"{name}.json"
    path.write_text(json.dumps({"status": "equivalent", "network": name.split("--")[0], **content}, indent=1))
    return path


def contents(store: Store) -> dict[str, bytes]:
    files = [*store.paths(), *sorted(store.checks.glob("*.json"))]
    return {f"{p.parent.name}/{p.name}": p.read_bytes() for p in files}


def test_merging_two_machines_copies_everything_once(tmp_path):
    a = machine_store(tmp_path / "a", "alpha", 3)
    b = machine_store(tmp_path / "b", "beta", 2)
    save_check(a, "fcn5--torch--2.13.0", checked_at="2026-01-01")
    save_check(b, "fcn8--jax--0.5.0", checked_at="2026-01-02")
    dest = Store(tmp_path / "merged")
    report = merge(dest, [a.root, b.root])
    assert report.clean and len(report.added) == 3 + 2 + 2 and report.duplicates == []
    # byte for byte what the machines wrote, still verified
    assert contents(dest) == {**contents(a), **contents(b)}
    verified = verify(dest)
    assert verified.problems == [] and len(verified.verified) == 5 and verified.checks == 2
    assert sorted(r.machine["hostname"] for r in dest.records()) == ["alpha"] * 3 + ["beta"] * 2
    assert list(dest.incoming.iterdir()) == []

    again = merge(dest, [a.root, b.root])  # tonight's merge again: nothing new
    assert again.added == [] and len(again.duplicates) == 7 and again.clean
    assert contents(dest) == {**contents(a), **contents(b)}


def test_same_run_with_other_content_is_a_conflict_and_is_not_overwritten(tmp_path):
    a = machine_store(tmp_path / "a", "alpha", 2)
    dest = Store(tmp_path / "dest")
    merge(dest, [a.root])
    other = Store(tmp_path / "other")
    rec = dest.read(dest.paths()[0])
    rec.status, rec.reason, rec.summary = "failed", "a different story", None
    other.write(rec)  # intact (its checksum is right), but not the same run as the one we hold
    save_check(other, "fcn5--torch--2.13.0", checked_at="2026-01-03", status="mismatch")
    save_check(dest, "fcn5--torch--2.13.0", checked_at="2026-01-01")
    before = contents(dest)
    report = merge(dest, [other.root])
    assert [p for p, _ in report.conflicts] == [other.paths()[0], other.checks / "fcn5--torch--2.13.0.json"]
    assert "status" in report.conflicts[0][1] and "summary" in report.conflicts[0][1]
    assert report.added == [] and not report.clean
    assert contents(dest) == before


def test_damaged_and_misnamed_incoming_records_are_reported_and_skipped(tmp_path):
    src = machine_store(tmp_path / "src", "alpha", 4)
    paths = src.paths()
    flip_a_digit(paths[0])
    raw = paths[1].read_bytes()
    paths[1].write_bytes(raw[:300])
    misnamed = src.runs / "20260101T000099Z-zzzzzzzzzzzz.json"
    paths[2].rename(misnamed)
    save_check(src, "fcn5--torch--2.13.0")
    (src.checks / "bad--check--1.json").write_text("{not json")
    dest = Store(tmp_path / "dest")
    report = merge(dest, [src.root])
    assert sorted(p for p, _ in report.unreadable) == sorted([paths[0], paths[1], misnamed,
                                                             src.checks / "bad--check--1.json"])
    assert [p.name for p in dest.paths()] == [paths[3].name]
    assert [p.name for p in dest.checks.glob("*.json")] == ["fcn5--torch--2.13.0.json"]


def test_records_of_older_schemas_are_copied_as_they_are(tmp_path):
    src = Store(tmp_path / "src")
    src.runs.mkdir(parents=True)
    # every older version (each has a fixture)
    older = [v for v in range(1, SCHEMA_VERSION) if (FIXTURES / f"v{v}.json").exists()]
    for v in older:
        name = json.loads((FIXTURES / f"v{v}.json").read_text())["run_id"]
        shutil.copy(FIXTURES / f"v{v}.json", src.runs / f"{name}.json")
    shutil.copytree(FIXTURES / "mllog", src.root / "mllog")  # v11's MLLOG files travel with it
    shutil.copytree(FIXTURES / "loadgen", src.root / "loadgen")  # and v13's LoadGen logs
    dest = Store(tmp_path / "dest")
    report = merge(dest, [src.root])
    assert report.clean and len(report.added) == len(older)
    assert contents(dest) == contents(src)
    # checksums came with schema 4: the records before it are the unverified ones
    assert sorted(v for _, v in verify(dest).unverified) == [v for v in older if v < 4]


def test_a_record_and_its_upgraded_copy_are_duplicates(tmp_path):
    src = Store(tmp_path / "src")
    src.runs.mkdir(parents=True)
    name = json.loads((FIXTURES / "v1.json").read_text())["run_id"]
    shutil.copy(FIXTURES / "v1.json", src.runs / f"{name}.json")
    dest = Store(tmp_path / "dest")
    merge(dest, [src.root])
    dest.upgrade()
    report = merge(dest, [src.root])
    assert report.duplicates == [src.runs / f"{name}.json"] and report.clean


def test_a_record_of_a_newer_schema_is_not_merged(tmp_path):
    src = machine_store(tmp_path / "src", "alpha", 1)
    data = json.loads(src.paths()[0].read_text())
    data["schema_version"] = SCHEMA_VERSION + 1
    data["checksum"] = checksum_of(data)
    src.paths()[0].write_text(json.dumps(data))
    report = merge(Store(tmp_path / "dest"), [src.root])
    assert len(report.unreadable) == 1 and "newer" in report.unreadable[0][1]


def test_an_interrupted_merge_is_finished_by_running_it_again(tmp_path, monkeypatch):
    src = machine_store(tmp_path / "src", "alpha", 5)
    dest = Store(tmp_path / "dest")
    real_link, calls = os.link, []

    def link_then_interrupt(a, b):
        calls.append(b)
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C with the third copy staged but not yet in place
        return real_link(a, b)

    monkeypatch.setattr(os, "link", link_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        merge(dest, [src.root])
    monkeypatch.undo()
    assert len(dest.paths()) == 2 and verify(dest).problems == []  # only whole records
    assert list(dest.incoming.iterdir()) == []
    report = merge(dest, [src.root])
    assert len(report.added) == 3 and len(report.duplicates) == 2 and report.clean
    assert contents(dest) == contents(src)


def test_sources_that_are_not_stores_are_refused(tmp_path):
    dest = machine_store(tmp_path / "dest", "alpha", 1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(MergeError, match="no such store"):
        merge(dest, [tmp_path / "nowhere"])
    with pytest.raises(MergeError, match="not a dlbench store"):
        merge(dest, [tmp_path / "empty"])
    with pytest.raises(MergeError, match="destination store itself"):
        merge(dest, [tmp_path / "dest" / ".." / "dest"])


# --------------------------------------------------------------------------- the command


def test_store_merge_command_summary_and_exit_status(tmp_path):
    a = machine_store(tmp_path / "a", "alpha", 2)
    b = machine_store(tmp_path / "b", "beta", 2)
    dest = tmp_path / "dest"
    code, out, err = invoke("store", "merge", str(a.root), str(b.root), "--store", str(dest))
    assert code == 0, err
    flat = " ".join(out.split())
    assert "added" in flat and "duplicates" in flat and "conflicts" in flat and "unreadable" in flat
    assert "│ 4 │ 0 │ 0 │ 0 │" in flat
    flip_a_digit(b.paths()[0])
    c = machine_store(tmp_path / "c", "gamma", 1)
    code, out, err = invoke("store", "merge", str(b.root), str(c.root), "--store", str(dest))
    assert code == 1
    flat = " ".join(out.split())
    assert "│ 1 │ 1 │ 0 │ 1 │" in flat and b.paths()[0].name in flat and "checksum mismatch" in flat
    assert "1 unreadable" in err


def test_store_merge_command_refuses_a_missing_source(tmp_path):
    code, _, err = invoke("store", "merge", str(tmp_path / "nowhere"), "--store", str(tmp_path / "dest"))
    assert code == 2 and "no such store" in err
    assert not (tmp_path / "dest").exists()


def test_checks_with_the_same_verdict_at_other_times_are_duplicates(tmp_path):
    """Nightly runners re-check every night: the same status for the same network hash is the same
    evidence, whatever the time and the last digits of the errors; the destination keeps its own."""
    dest, other = Store(tmp_path / "dest"), Store(tmp_path / "other")
    kept = save_check(dest, "fcn5--torch--2.13.0", checked_at="2026-01-01", network_hash="h1", errors={"loss": 1e-7})
    save_check(other, "fcn5--torch--2.13.0", checked_at="2026-01-02", network_hash="h1", errors={"loss": 2e-7})
    before = kept.read_bytes()
    report = merge(dest, [other.root])
    assert report.conflicts == [] and len(report.duplicates) == 1 and report.clean
    assert kept.read_bytes() == before
    save_check(other, "fcn5--torch--2.13.0", checked_at="2026-01-03", network_hash="h2")  # another network version
    assert len(merge(dest, [other.root]).conflicts) == 1
