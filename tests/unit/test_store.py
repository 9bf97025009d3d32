"""The append-only store, summary statistics and result rows."""

from __future__ import annotations

import json
import multiprocessing
import statistics as st
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from dlbench.analysis.timing import summarise
from dlbench.store.record import SCHEMA_VERSION, NetworkInfo, Record, Repeat, Settings, Workload, new_run_id
from dlbench.store.rows import COLUMNS, run_row
from dlbench.store.store import Store, StoreError, checksum_of


def make_record(run_id: str | None = None, *, benchmark: str = "fcn5-train", status: str = "ok",
                repeats: list[Repeat] | None = None, batch_size: int = 16) -> Record:
    started = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    repeats = repeats if repeats is not None else [
        Repeat(index=i, status="ok", first_iter_s=0.5, warmup_iter_s=[0.2, 0.1], warmup_settled=True,
               iter_s=[0.1, 0.11, 0.09, 0.1, 0.12], window_monotonic_ns=[i * 10, i * 10 + 5], wall_s=1.0)
        for i in range(3)]
    return Record(
        run_id=run_id or new_run_id(started), started_at=started, ended_at=started + timedelta(seconds=3),
        dlbench={"version": "0.1.0", "commit": None, "dirty": None}, suite="fcn", benchmark=benchmark,
        network=NetworkInfo(name="fcn5", file="suites/networks/fcn5.yaml", hash="ab" * 32,
                            params_described=1000, flops_per_sample=2000, definition={"name": "fcn5"}),
        workload=Workload(mode="train", batch_size=batch_size, precision="float32", learning_rate=0.05,
                          momentum=0.9, device="cpu"),
        framework={"name": "fake", "version": "0.0"}, environment={"backend": "current"},
        machine={"hostname": "testhost", "cpu_model": "cpu"},
        settings=Settings(profile="smoke", repeats=3, threads_requested=2, timeout_s=60.0, policy={}),
        repeats=repeats, summary=summarise(repeats, batch_size) if status == "ok" else None, params=1000,
        status=status, reason=None if status == "ok" else "it broke",
    )


# ---------------------------------------------------------------- Store


def test_write_then_read_round_trip(tmp_path):
    store = Store(tmp_path)
    rec = make_record()
    path = store.write(rec)
    assert path == tmp_path / "runs" / f"{rec.run_id}.json"
    problems = []
    got = list(store.records(problems))
    assert problems == []
    assert got == [rec]


def test_write_leaves_nothing_in_incoming(tmp_path):
    store = Store(tmp_path)
    for _ in range(3):
        store.write(make_record())
    assert list(store.incoming.iterdir()) == []
    assert len(store.paths()) == 3


def test_write_never_overwrites(tmp_path):
    store = Store(tmp_path)
    first = make_record("20260101T000000Z-aaaaaaaaaaaa", benchmark="first")
    path = store.write(first)
    before = path.read_bytes()
    second = make_record("20260101T000000Z-aaaaaaaaaaaa", benchmark="second")
    with pytest.raises(StoreError, match="already exists"):
        store.write(second)
    assert path.read_bytes() == before
    assert store.read(path).benchmark == "first"
    assert list(store.incoming.iterdir()) == []  # the refused write cleaned up after itself
    assert len(store.paths()) == 1


def test_half_written_temp_file_is_invisible(tmp_path):
    store = Store(tmp_path)
    good = make_record()
    store.write(good)
    # a writer killed between writing its temporary file and linking it
    (store.incoming / "20260101T000000Z-deadbeef0000.4242.tmp").write_text('{"schema_version": 1, "run_id": "trunc')
    (store.incoming / "20260101T000000Z-deadbeef0001.4242.tmp").write_text(make_record().model_dump_json())
    problems = []
    assert [r.run_id for r in store.records(problems)] == [good.run_id]
    assert problems == []
    assert store.paths() == [store.runs / f"{good.run_id}.json"]


def test_corrupt_and_newer_records_are_reported_and_skipped(tmp_path):
    store = Store(tmp_path)
    good = [make_record(f"20260101T00000{i}Z-00000000000{i}") for i in range(3)]
    for r in good:
        store.write(r)
    truncated = store.runs / "20260101T000001Z-truncated000.json"
    truncated.write_text(good[0].model_dump_json()[:200])
    garbage = store.runs / "20260101T000002Z-garbage00000.json"
    garbage.write_bytes(b"\xff\xfe\x00not json at all")
    newer = store.runs / "20260101T000003Z-newer0000000.json"
    data = json.loads(good[1].model_dump_json())
    data["schema_version"] = SCHEMA_VERSION + 1
    newer.write_text(json.dumps(data))
    invalid = store.runs / "20260101T000004Z-invalid00000.json"
    data = json.loads(good[2].model_dump_json())
    data["status"] = "exploded"
    data["checksum"] = checksum_of(data)  # intact, but not a valid record
    invalid.write_text(json.dumps(data))
    problems = []
    got = list(store.records(problems))
    assert sorted(r.run_id for r in got) == sorted(r.run_id for r in good)
    by_path = {p.path: p.reason for p in problems}
    assert set(by_path) == {truncated, garbage, newer, invalid}
    for path, reason in by_path.items():
        assert str(path) in reason  # reported by name
    assert "newer" in by_path[newer] and str(SCHEMA_VERSION + 1) in by_path[newer]
    assert "status" in by_path[invalid]
    # without a problems list the good records are still read
    assert len(list(store.records())) == 3


def test_empty_store_has_no_records(tmp_path):
    store = Store(tmp_path / "nowhere")
    assert store.paths() == []
    assert list(store.records()) == []


def _writer(root: str, n: int, tag: str) -> None:
    store = Store(Path(root))
    for i in range(n):
        store.write(make_record(benchmark=f"{tag}-{i}"))


def test_two_processes_writing_at_once_lose_nothing(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), 50, tag)) for tag in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    problems = []
    records = list(Store(tmp_path).records(problems))
    assert problems == []
    assert sorted(r.benchmark for r in records) == sorted(f"{t}-{i}" for t in "ab" for i in range(50))
    assert len({r.run_id for r in records}) == 100
    assert list((tmp_path / ".incoming").iterdir()) == []


# ---------------------------------------------------------------- timing.summarise


def test_summarise_by_hand():
    reps = [Repeat(index=0, status="ok", first_iter_s=0.9, iter_s=[0.1, 0.2, 0.3]),
            Repeat(index=1, status="ok", first_iter_s=0.7, iter_s=[0.4, 0.5, 0.6, 1.0])]
    s = summarise(reps, batch_size=32)
    times = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 1.0]
    assert s.repeats == 2 and s.iterations == 7
    assert s.median_s == pytest.approx(0.4)
    assert s.mean_s == pytest.approx(3.1 / 7)
    assert s.min_s == pytest.approx(0.1) and s.max_s == pytest.approx(1.0)
    # inclusive quartiles of 7 points: positions 1.5 and 4.5 (0-based) -> 0.25 and 0.55
    assert s.q1_s == pytest.approx(0.25) and s.q3_s == pytest.approx(0.55)
    assert s.iqr_s == pytest.approx(0.30)
    mean = 3.1 / 7
    stdev = (sum((t - mean) ** 2 for t in times) / 6) ** 0.5
    assert s.stdev_s == pytest.approx(stdev)
    assert s.cv == pytest.approx(stdev / mean)
    assert s.repeat_medians_s == pytest.approx([0.2, 0.55])
    assert s.first_iter_s == pytest.approx(0.8)
    assert s.ms_per_iter == pytest.approx(400.0)
    assert s.samples_per_s == pytest.approx(80.0)


def test_summarise_excludes_failed_repeats():
    reps = [Repeat(index=0, status="ok", first_iter_s=1.0, iter_s=[0.1, 0.2, 0.3, 0.4]),
            Repeat(index=1, status="failed", first_iter_s=50.0, iter_s=[9.0, 9.0, 9.0, 9.0, 9.0]),
            Repeat(index=2, status="timeout", iter_s=[7.0]),
            Repeat(index=3, status="ok", iter_s=[])]
    s = summarise(reps, batch_size=10)
    assert s.repeats == 1 and s.iterations == 4
    assert s.median_s == pytest.approx(0.25)
    assert s.max_s == pytest.approx(0.4)
    assert s.first_iter_s == pytest.approx(1.0)
    assert s.samples_per_s == pytest.approx(40.0)
    assert s.q1_s == pytest.approx(0.175) and s.q3_s == pytest.approx(0.325)


def test_summarise_single_iteration():
    s = summarise([Repeat(index=0, status="ok", iter_s=[0.5])], batch_size=2)
    assert s.iterations == 1 and s.stdev_s == 0.0 and s.iqr_s == 0.0 and s.samples_per_s == pytest.approx(4.0)
    assert s.first_iter_s is None


def test_summarise_none_without_ok_repeats():
    assert summarise([], 8) is None
    assert summarise([Repeat(index=0, status="failed", iter_s=[0.1, 0.2]),
                      Repeat(index=1, status="skipped")], 8) is None


def test_summarise_matches_statistics_module_on_pooled_times():
    reps = make_record().repeats
    pooled = [t for r in reps for t in r.iter_s]
    s = summarise(reps, 16)
    assert s.median_s == pytest.approx(st.median(pooled))
    assert s.samples_per_s == pytest.approx(16 / st.median(pooled))


# ---------------------------------------------------------------- rows


def test_run_row_has_every_column():
    ok = run_row(make_record())
    assert list(ok) == list(COLUMNS)
    assert ok["status"] == "ok" and ok["samples_per_s"] == pytest.approx(16 / 0.1)
    assert ok["iqr_ms"] == pytest.approx(make_record().summary.iqr_s * 1e3)
    assert ok["first_iter_ms"] == pytest.approx(500.0)
    assert ok["machine"] == "testhost" and ok["framework"] == "fake"
    failed = run_row(make_record(status="failed", repeats=[Repeat(index=0, status="failed")]))
    assert set(failed) == set(COLUMNS)
    assert failed["ms_per_iter"] is None and failed["iterations"] == 0 and failed["repeats"] == 1
    assert failed["reason"] == "it broke"
    json.dumps([ok, failed])
