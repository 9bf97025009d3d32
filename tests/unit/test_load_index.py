"""The row index under STORE/.index/: parses each record once, notices added, removed and changed
files, and is never needed: deleted, corrupted, stale or unusable, the answer stays the records'."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest
from store_records import T0, make_record

from dlbench.store import index as index_module
from dlbench.store.index import INDEX_DIR, INDEX_FILE, key_fields, read_rows
from dlbench.store.rows import run_row
from dlbench.store.store import Store
from dlbench.store.utilisation import Peaks


@pytest.fixture
def store(tmp_path):
    st = Store(tmp_path / "store")
    for i in range(4):
        st.write(make_record(framework=["torch", "jax"][i % 2], started=T0 + timedelta(minutes=i)))
    return st


@pytest.fixture
def parsed(monkeypatch):
    """The record files Store.inspect was asked for (every parse of a record goes through it), in this process."""
    calls: list[str] = []
    original = Store.inspect

    def counting(self, path):
        calls.append(Path(path).name)
        return original(self, path)

    monkeypatch.setattr(Store, "inspect", counting)
    return calls


def expected_rows(store: Store) -> list[dict]:
    # the MFU columns come from the store's machine profiles as rows are read, not from the index
    peaks = Peaks(store)
    return [peaks.attach({**key_fields(r), **run_row(r)}) for r in store.records()]


def assert_rows_are_the_records(snapshot, store: Store) -> None:
    assert [{k: row[k] for k in expected} for row, expected in zip(snapshot.rows, expected_rows(store))] \
        == expected_rows(store)
    assert len(snapshot.rows) == len(store.paths())


def test_each_record_is_parsed_once_then_served_from_the_index(store, parsed):
    first = read_rows(store)
    assert sorted(parsed) == sorted(p.name for p in store.paths())
    assert (store.root / INDEX_DIR / INDEX_FILE).is_file()
    parsed.clear()
    second = read_rows(store)
    assert parsed == []
    assert second.rows == first.rows and second.notes == []
    assert_rows_are_the_records(second, store)


def test_added_removed_and_changed_records_are_noticed(store, parsed, tmp_path):
    read_rows(store)
    parsed.clear()
    new = store.write(make_record(framework="mxnet", started=T0 + timedelta(hours=5)))
    gone = store.paths()[0]
    gone.unlink()
    # a file replaced under its name by another store's version of it (as a merge might)
    changed = store.paths()[0]
    other = Store(tmp_path / "other")
    replacement = make_record(network="fcn8", started=T0).model_copy(update={"run_id": changed.stem})
    shutil.copyfile(other.write(replacement), changed)
    os.utime(changed, ns=(1, 1))  # even with an old mtime
    snap = read_rows(store)
    assert sorted(parsed) == sorted([new.name, changed.name])
    by_file = {r["run_id"]: r for r in snap.rows}
    assert gone.stem not in by_file and new.stem in by_file
    assert len(snap.rows) == 4
    assert by_file[changed.stem]["network"] == "fcn8"
    assert [r["framework"] for r in snap.rows][-1] == "mxnet"  # still oldest first


def test_iterations_come_from_the_index_too(store, parsed):
    read_rows(store)
    parsed.clear()
    snap = read_rows(store, iterations=True)
    assert parsed == []
    for record in store.records():
        it = snap.iterations[record.run_id]
        assert [(i, s, n) for i, s, n in it.repeats] == [(r.index, r.status, len(r.iter_s)) for r in record.repeats]
        assert it.seconds.tolist() == pytest.approx([t for r in record.repeats for t in r.iter_s])


def test_a_deleted_index_is_rebuilt(store, parsed):
    first = read_rows(store)
    (store.root / INDEX_DIR / INDEX_FILE).unlink()
    parsed.clear()
    again = read_rows(store)
    assert len(parsed) == 4 and again.rows == first.rows
    assert (store.root / INDEX_DIR / INDEX_FILE).is_file()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "a table missing", "foreign iteration data"])
def test_a_corrupt_index_is_removed_and_rebuilt(store, parsed, damage):
    first = read_rows(store, iterations=True)
    path = store.root / INDEX_DIR / INDEX_FILE
    if damage == "garbage":
        path.write_bytes(b"not an sqlite database at all " * 200)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:3000])
    else:
        with sqlite3.connect(path) as db:
            db.execute("DROP TABLE iterations" if damage == "a table missing"
                       else "UPDATE iterations SET repeats = 'not json {'")
    parsed.clear()
    again = read_rows(store, iterations=True)
    assert again.rows == first.rows and again.notes == []
    assert {k: v.seconds.tolist() for k, v in again.iterations.items()} == \
        {k: v.seconds.tolist() for k, v in first.iterations.items()}
    assert len(parsed) >= 4
    parsed.clear()
    assert read_rows(store, iterations=True).rows == first.rows and parsed == []  # and it is whole again


def test_an_index_built_by_other_code_is_rebuilt(store, parsed, monkeypatch):
    read_rows(store)
    parsed.clear()
    monkeypatch.setattr(index_module, "fingerprint", lambda: "another version of dlbench")
    assert len(read_rows(store).rows) == 4
    assert len(parsed) == 4


def test_an_unusable_index_falls_back_to_the_records_with_a_note(store, parsed):
    (store.root / INDEX_DIR).write_text("a file where the index folder should be")
    snap = read_rows(store)
    assert_rows_are_the_records(snap, store)
    assert len(snap.notes) == 1 and "cannot be used" in snap.notes[0] and INDEX_DIR in snap.notes[0]
    assert (store.root / INDEX_DIR).read_text().startswith("a file")  # left alone


def test_an_unreadable_record_is_cached_and_reported_with_its_current_path(store, parsed, tmp_path):
    bad = store.runs / "20260301T130000Z-000000000bad.json"
    bad.write_text("{broken")
    read_rows(store)
    moved = tmp_path / "moved"
    store.root.rename(moved)
    store = Store(moved)
    parsed.clear()
    snap = read_rows(store)
    assert parsed == []  # not parsed again: the index remembers why it failed
    assert [u.path for u in snap.unreadable] == [store.runs / bad.name]
    assert snap.unreadable[0].reason.startswith(f"{store.runs / bad.name}: ")
    assert len(snap.rows) == 4


def test_an_empty_or_missing_store_gets_no_index(tmp_path):
    assert read_rows(Store(tmp_path / "nowhere")).rows == []
    assert not (tmp_path / "nowhere").exists()


def test_many_records_are_parsed_in_worker_processes_with_the_same_result(store, monkeypatch):
    serial = read_rows(store, iterations=True)
    (store.root / INDEX_DIR / INDEX_FILE).unlink()
    monkeypatch.setattr(index_module, "PARALLEL_FROM", 2)
    parallel = read_rows(store, iterations=True)
    assert parallel.rows == serial.rows
    assert {k: v.seconds.tolist() for k, v in parallel.iterations.items()} == \
        {k: v.seconds.tolist() for k, v in serial.iterations.items()}


def _read_and_add(root: str, tag: int, queue) -> None:
    store = Store(Path(root))
    for i in range(5):
        store.write(make_record(framework=f"fw{tag}", started=T0 + timedelta(days=tag, minutes=i)))
        read_rows(store)
    queue.put(len(read_rows(store).rows))


def test_two_processes_updating_at_once(store):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_read_and_add, args=(str(store.root), tag, queue)) for tag in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert all(n >= 9 for n in (queue.get(), queue.get()))  # each saw its own 5 and the first 4
    snap = read_rows(store)
    assert snap.notes == [] and len(snap.rows) == 14
    assert_rows_are_the_records(snap, store)


def test_a_long_parse_is_announced(store, monkeypatch):
    told: list[int] = []
    monkeypatch.setattr(index_module, "PARALLEL_FROM", 3)
    read_rows(store, on_parse=told.append)
    assert told == [4]
    store.write(make_record(started=T0 + timedelta(hours=9)))
    read_rows(store, on_parse=told.append)  # one new file: quick, nothing to announce
    assert told == [4]
