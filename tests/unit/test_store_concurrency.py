"""The store under concurrent writers and sudden death: real processes writing at once lose nothing;
a writer killed with SIGKILL at a random moment leaves no partial record and loses nothing it had
reported written; leftover temporary files are removed only when no live writer can own them."""

from __future__ import annotations

import multiprocessing
import os
import random
import time
from pathlib import Path

import pytest
from test_store import make_record

from dlbench.store.record import Repeat, new_run_id
from dlbench.store.store import STALE_TEMP_AGE_S, Store, StoreError, _host_tag
from dlbench.store.verify import verify

SPAWN = multiprocessing.get_context("spawn")  # fresh interpreters, like two `dlbench run`s


def _writer(root: str, n: int, tag: str) -> None:
    store = Store(Path(root))
    for i in range(n):
        store.write(make_record(new_run_id(), benchmark=f"{tag}-{i}"))


def _cleaner(root: str, stop_file: str) -> None:
    store = Store(Path(root))
    while not os.path.exists(stop_file):
        store.clean_incoming()


def test_two_writing_processes_and_a_cleaner_at_once(tmp_path):
    writers = [SPAWN.Process(target=_writer, args=(str(tmp_path), 50, tag)) for tag in ("a", "b")]
    cleaner = SPAWN.Process(target=_cleaner, args=(str(tmp_path), str(tmp_path / "stop")))
    cleaner.start()
    for p in writers:
        p.start()
    for p in writers:
        p.join(120)
    (tmp_path / "stop").touch()
    cleaner.join(30)
    assert [p.exitcode for p in writers] == [0, 0] and cleaner.exitcode == 0
    store = Store(tmp_path)
    report = verify(store)
    assert report.problems == [] and report.unverified == []
    assert len(report.verified) == 100
    assert sorted(r.benchmark for r in store.records()) == sorted(f"{t}-{i}" for t in "ab" for i in range(50))
    assert list(store.incoming.iterdir()) == []


# --------------------------------------------------------------------------- kill -9


ITERATIONS_PER_REPEAT = 25_000  # about 1.5 MB of JSON per record: a write takes a while to kill inside
CHUNK = 1 << 16


class _SlowDiskFile:
    """A file that takes its data 64 KiB at a time with a pause between, as a slow disk would, so
    that more kills land while a temporary file is half written."""

    def __init__(self, f):
        self._f = f

    def write(self, data: bytes) -> int:
        for i in range(0, len(data), CHUNK):
            self._f.write(data[i:i + CHUNK])
            self._f.flush()
            time.sleep(0.004)
        return len(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)


def _endless_writer(root: str, log: str, slow_disk: bool) -> None:
    """Writes large records until killed; appends "<run_id>\\n" to `log` after each write returns."""
    import builtins

    from dlbench.store import store as store_module

    if slow_disk:  # the store's own code, writing through a slow file
        store_module.open = lambda *a, **k: _SlowDiskFile(builtins.open(*a, **k))
    repeats = [Repeat(index=r, status="ok", first_iter_s=0.5,
                      iter_s=[0.1 + 1e-9 * (k * 7919 % 100_003) for k in range(ITERATIONS_PER_REPEAT)])
               for r in range(3)]
    template = make_record(repeats=repeats)
    store = Store(Path(root))
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, b"started\n")
    i = 0
    while True:
        record = template.model_copy(update={"run_id": new_run_id(), "benchmark": f"big-{i}"})
        store.write(record)
        os.write(fd, f"{record.run_id}\n".encode())  # a single write(2): whole in the file or absent
        i += 1


def test_kill_9_mid_write_leaves_only_whole_records_and_loses_none(tmp_path):
    rng = random.Random()
    store = Store(tmp_path / "store")
    reported: list[str] = []
    partial = 0
    for round_ in range(4):
        log = tmp_path / f"log{round_}"
        proc = SPAWN.Process(target=_endless_writer, args=(str(store.root), str(log), round_ % 2 == 1))
        proc.start()
        deadline = time.monotonic() + 60
        while not (log.exists() and log.read_text().startswith("started")):
            assert time.monotonic() < deadline and proc.is_alive(), "the writer did not start"
            time.sleep(0.02)
        time.sleep(rng.uniform(0.05, 0.8))
        proc.kill()  # SIGKILL: no handler, no cleanup, no flush
        proc.join(30)
        assert proc.exitcode == -9
        reported += log.read_text().split()[1:]

        report = verify(store)
        assert report.problems == [], [p.reason for p in report.problems]  # nothing partial or damaged
        on_disk = {p.stem for p in report.verified}
        assert set(reported) <= on_disk  # nothing reported written is lost
        assert len(on_disk - set(reported)) <= round_ + 1  # at most the one in flight per kill
        # the dead writer's temporary file is fair game, and removing it touches nothing else
        leftovers = sorted(store.incoming.glob("*.tmp"))
        full = max(p.stat().st_size for p in store.paths()) if store.paths() else 0
        partial += sum(p.stat().st_size < full for p in leftovers)
        assert store.clean_incoming() == leftovers
        assert list(store.incoming.glob("*.tmp")) == []
        assert verify(store).verified == report.verified
    assert reported, "no record was written before the kills"
    print(f"{len(reported)} records reported written over 4 kills; {partial} kills left a half-written file")


# --------------------------------------------------------------------------- leftovers


def _dead_pid() -> int:
    proc = SPAWN.Process(target=int)
    proc.start()
    proc.join()
    return proc.pid


def temp(store: Store, name: str, age_s: float = 0.0) -> Path:
    store.incoming.mkdir(parents=True, exist_ok=True)
    path = store.incoming / name
    path.write_text('{"schema_version": 4, "run_id": "trunc')
    if age_s:
        t = time.time() - age_s
        os.utime(path, (t, t))
    return path


def test_clean_incoming_removes_only_what_no_live_writer_owns(tmp_path):
    store = Store(tmp_path)
    host, old = _host_tag(), STALE_TEMP_AGE_S + 60
    dead = temp(store, f"20260101T000000Z-aaaaaaaaaaaa.00aa11bb.{_dead_pid()}.{host}.tmp")
    alive = temp(store, f"20260101T000000Z-bbbbbbbbbbbb.00aa11bb.{os.getpid()}.{host}.tmp")
    alive_but_old = temp(store, f"20260101T000000Z-cccccccccccc.00aa11bb.{os.getpid()}.{host}.tmp", age_s=old)
    elsewhere = temp(store, f"20260101T000000Z-dddddddddddd.00aa11bb.{_dead_pid()}.another-host.tmp")
    elsewhere_old = temp(store, "20260101T000000Z-eeeeeeeeeeee.00aa11bb.1.another-host.tmp", age_s=old)
    unknown = temp(store, "20260101T000000Z-ffffffffffff.4242.tmp")
    unknown_old = temp(store, "20260101T000000Z-000000000000.4242.tmp", age_s=old)
    not_temp = store.incoming / "notes.txt"
    not_temp.write_text("not ours")

    expected = sorted([dead, alive_but_old, elsewhere_old, unknown_old])
    assert store.clean_incoming(dry_run=True) == expected
    assert all(p.exists() for p in expected)  # a dry run removes nothing
    assert store.clean_incoming() == expected
    assert sorted(store.incoming.iterdir()) == sorted([alive, elsewhere, unknown, not_temp])


def test_the_first_write_of_a_store_clears_a_dead_writers_leftover(tmp_path):
    store = Store(tmp_path)
    leftover = temp(store, f"20260101T000000Z-aaaaaaaaaaaa.00aa11bb.{_dead_pid()}.{_host_tag()}.tmp")
    store.write(make_record())
    assert not leftover.exists()
    assert list(store.incoming.iterdir()) == []


def test_an_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    store = Store(tmp_path)
    kept = store.write(make_record("20260101T000000Z-000000000001"))

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.write(make_record("20260101T000000Z-000000000002"))
    monkeypatch.undo()
    assert store.paths() == [kept]
    assert list(store.incoming.iterdir()) == []


def test_a_refused_duplicate_leaves_nothing_behind(tmp_path):
    store = Store(tmp_path)
    path = store.write(make_record("20260101T000000Z-000000000001", benchmark="first"))
    with pytest.raises(StoreError, match="already exists"):
        store.write(make_record("20260101T000000Z-000000000001", benchmark="second"))
    assert store.read(path).benchmark == "first"
    assert list(store.incoming.iterdir()) == []
