"""dlbench.load: the store as a typed DataFrame, per run and per iteration, and what it does with
records it cannot read."""

from __future__ import annotations

import json
import warnings
from datetime import timedelta

import pandas as pd
import pytest
from store_records import T0, make_record

import dlbench
from dlbench.store.frame import ITERATION_KEYS, UnreadableRecordWarning
from dlbench.store.index import KEY_COLUMNS
from dlbench.store.rows import COLUMNS, run_row
from dlbench.store.store import Store


@pytest.fixture
def store(tmp_path):
    st = Store(tmp_path / "store")
    st.write(make_record(framework="torch", started=T0, iterations=(5, 7, 6)))
    st.write(make_record(framework="jax", started=T0 + timedelta(hours=1), iterations=(3, 4)))
    st.write(make_record(framework="mxnet", started=T0 + timedelta(hours=2), status="failed", iterations=(4, 2)))
    return st


def test_one_typed_row_per_run_with_the_results_columns_then_the_key_fields(store):
    df = dlbench.load(store.root)
    assert list(df.columns) == [*COLUMNS, *KEY_COLUMNS]
    assert len(df) == 3
    assert df["framework"].tolist() == ["torch", "jax", "mxnet"]  # oldest first
    dtypes = df.dtypes.astype(str)
    assert dtypes["started_at"] == dtypes["ended_at"] == "datetime64[ns, UTC]"
    for col in ("ms_per_iter", "samples_per_s", "iqr_ms", "cv", "avg_power_w", "learning_rate"):
        assert dtypes[col] == "float64", col
    for col in ("batch_size", "threads", "repeats", "iterations", "params", "flops_per_sample"):
        assert dtypes[col] == "Int64", col
    for col in ("run_id", "framework", "benchmark", "status", "machine", "machine_id", "profile", "device"):
        assert dtypes[col] == "string", col
    assert df["started_at"].iloc[1] - df["started_at"].iloc[0] == pd.Timedelta(hours=1)
    # values are run_row's, typed
    first = run_row(next(store.records()))
    assert df["samples_per_s"].iloc[0] == pytest.approx(first["samples_per_s"])
    assert df["started_at"].iloc[0] == pd.Timestamp(first["started_at"])
    # a failed run has no measurements: missing values, not zeros and not a crash
    failed = df[df["status"] == "failed"].iloc[0]
    assert pd.isna(failed["ms_per_iter"]) and pd.isna(failed["params"]) and failed["reason"] == "it broke"
    assert (df["profile"] == "smoke").all() and (df["machine"] == "hostA").all()
    assert df["machine_id"].notna().all() and df["network_hash"].iloc[0] == "ab" * 32
    assert df.attrs["unreadable"] == []


def test_iterations_one_row_per_measured_iteration(store):
    records = list(store.records())
    df = dlbench.load(store.root, iterations=True)
    assert len(df) == sum(len(rep.iter_s) for r in records for rep in r.repeats) == 5 + 7 + 6 + 3 + 4 + 4
    assert list(df.columns[:5]) == ["run_id", "repeat", "repeat_status", "iteration", "seconds"]
    assert set(ITERATION_KEYS) <= set(df.columns)
    assert str(df["seconds"].dtype) == "float64" and str(df["started_at"].dtype) == "datetime64[ns, UTC]"
    for r in records:
        mine = df[df["run_id"] == r.run_id]
        assert (mine["framework"] == r.framework["name"]).all() and (mine["status"] == r.status).all()
        for rep in r.repeats:
            rows = mine[mine["repeat"] == rep.index]
            assert rows["iteration"].tolist() == list(range(len(rep.iter_s)))  # restarts at each repeat
            assert rows["seconds"].tolist() == pytest.approx(rep.iter_s)
    # for runs that completed, the rows are exactly what the summary pooled
    runs = dlbench.load(store.root)
    ok = runs[runs["status"] == "ok"]
    assert len(df[df["run_id"].isin(ok["run_id"])]) == ok["iterations"].sum()
    assert str(df["repeat_status"].dtype) == "category" and set(df["repeat_status"]) == {"ok"}


def test_iterations_of_a_repeat_that_did_not_finish_are_kept_and_marked(store):
    rec = make_record(framework="tensorflow", started=T0 + timedelta(hours=3), status="timeout", iterations=(3, 2))
    rec.repeats[1] = rec.repeats[1].model_copy(update={"status": "timeout", "iter_s": [0.5, 0.6]})
    store.write(rec)
    df = dlbench.load(store.root, iterations=True)
    mine = df[df["run_id"] == rec.run_id]
    assert mine["repeat_status"].tolist() == ["ok"] * 3 + ["timeout"] * 2
    assert mine["seconds"].tolist()[-2:] == [0.5, 0.6] and mine["iteration"].tolist() == [0, 1, 2, 0, 1]


def test_empty_and_missing_store(tmp_path):
    (tmp_path / "empty").mkdir()
    df = dlbench.load(tmp_path / "empty")
    assert df.empty and list(df.columns) == [*COLUMNS, *KEY_COLUMNS]
    assert dlbench.load(tmp_path / "empty", iterations=True).empty
    with pytest.raises(FileNotFoundError, match="nowhere"):
        dlbench.load(tmp_path / "nowhere")


def test_an_unreadable_record_is_reported_never_a_crash(store):
    bad = store.runs / "20260301T130000Z-000000000bad.json"
    bad.write_text('{"schema_version": 1, "run_id": "trunc')
    invalid = store.runs / "20260301T130001Z-0000000000bd.json"
    data = json.loads(next(store.records()).model_dump_json())
    data["status"] = "exploded"
    data["schema_version"] = 3  # before checksums: invalid for its content, not for a missing checksum
    invalid.write_text(json.dumps(data))
    for _ in range(2):  # the second time from the index, which remembers why they were unreadable
        with pytest.warns(UnreadableRecordWarning, match="2 unreadable records") as caught:
            df = dlbench.load(store.root)
        assert str(bad) in str(caught[0].message)
        assert len(df) == 3
        listed = {u["path"]: u["reason"] for u in df.attrs["unreadable"]}
        assert set(listed) == {str(bad), str(invalid)}
        assert "status" in listed[str(invalid)] and listed[str(bad)].startswith(str(bad))
        with pytest.warns(UnreadableRecordWarning):
            assert len(dlbench.load(store.root, iterations=True)) == 18 + 7 + 4


def test_load_accepts_a_store_object_and_a_string(store):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean store warns about nothing
        a = dlbench.load(store)
        b = dlbench.load(str(store.root))
    pd.testing.assert_frame_equal(a, b)
