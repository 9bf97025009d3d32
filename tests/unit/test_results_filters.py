"""`dlbench results`: filters (AND across options, OR within one), parquet and --out, the plain
table for many rows, and bad input (exit 2, one message, nothing written)."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import timedelta

import pandas as pd
import pytest
from store_records import T0, make_record
from typer.testing import CliRunner

import dlbench
from dlbench.cli import app
from dlbench.cli import results as results_cli
from dlbench.cli import tables
from dlbench.store.rows import COLUMNS
from dlbench.store.store import Store

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, ANSI.sub("", result.stdout), " ".join(ANSI.sub("", result.stderr).split())


# (framework, network, machine, days after T0, status)
RUNS = [
    ("torch", "fcn5", "hostA", 0, "ok"),
    ("torch", "fcn8", "hostB", 1, "ok"),
    ("jax", "fcn5", "hostA", 2, "failed"),
    ("jax", "fcn8", "hostB", 3, "ok"),
    ("mxnet", "fcn5", "hostA", 4, "timeout"),
    ("mxnet", "fcn8", "hostB", 5, "ok"),
]


@pytest.fixture
def store(tmp_path):
    st = Store(tmp_path / "store")
    for fw, net, host, days, status in RUNS:
        st.write(make_record(framework=fw, network=net, machine=host, started=T0 + timedelta(days=days),
                             status=status, machine_id=f"id-{host}"))
    return st


def selected(store, *args: str) -> list[tuple]:
    code, out, err = invoke("results", "--store", str(store.root), "--format", "json", *args)
    assert code == 0, err
    return [(r["framework"], r["network"], r["machine"], r["status"]) for r in json.loads(out)]


def expect(predicate) -> list[tuple]:
    return [(fw, net, host, status) for fw, net, host, days, status in RUNS if predicate(fw, net, host, days, status)]


def test_no_filter_shows_every_run(store):
    assert selected(store) == expect(lambda *_: True)


@pytest.mark.parametrize("args, predicate", [
    (("--framework", "torch"), lambda fw, net, host, days, st: fw == "torch"),
    (("--framework", "torch", "--framework", "jax"), lambda fw, net, host, days, st: fw in ("torch", "jax")),
    (("--framework", "torch,mxnet"), lambda fw, net, host, days, st: fw in ("torch", "mxnet")),
    (("--benchmark", "fcn8-train"), lambda fw, net, host, days, st: net == "fcn8"),
    (("--benchmark", "fcn5"), lambda fw, net, host, days, st: net == "fcn5"),  # a network name
    (("--machine", "hostB"), lambda fw, net, host, days, st: host == "hostB"),
    (("--machine", "id-hostA"), lambda fw, net, host, days, st: host == "hostA"),  # a machine id
    (("--status", "failed", "--status", "timeout"), lambda fw, net, host, days, st: st in ("failed", "timeout")),
    (("--since", "2026-03-04"), lambda fw, net, host, days, st: days >= 3),
    (("--since", "2026-03-03T12:00:00"), lambda fw, net, host, days, st: days >= 2),  # naive = UTC; inclusive
    (("--since", "2026-03-03T14:00+02:00"), lambda fw, net, host, days, st: days >= 2),
    (("--since", "2026-03-03T12:00:01Z"), lambda fw, net, host, days, st: days >= 3),
    (("--framework", "jax", "--framework", "mxnet", "--status", "ok", "--machine", "hostB"),
     lambda fw, net, host, days, st: fw in ("jax", "mxnet") and st == "ok" and host == "hostB"),
    (("--benchmark", "fcn5", "--since", "2026-03-02"), lambda fw, net, host, days, st: net == "fcn5" and days >= 1),
    (("--framework", "tensorflow"), lambda *_: False),
])
def test_filters(store, args, predicate):
    want = expect(predicate)
    assert selected(store, *args) == want
    code, out, _ = invoke("results", "--store", str(store.root), "--format", "csv", *args)
    assert code == 0 and len(list(csv.DictReader(io.StringIO(out)))) == len(want)
    code, out, _ = invoke("results", "--store", str(store.root), *args)
    assert code == 0 and f"{len(want)} of {len(RUNS)} runs" in out


@pytest.mark.parametrize("args, message", [
    (("--since", "last tuesday"), "--since: 'last tuesday' is not a date"),
    (("--since", "2026-02-30"), "--since: '2026-02-30' is not a date"),
    (("--status", "exploded"), "unknown status 'exploded'; valid statuses: ok, failed, timeout, skipped"),
    (("--format", "parquet"), "--format parquet writes a binary file"),
    (("--format", "xml"), "unknown format 'xml'"),
])
def test_bad_input_is_one_clear_error(store, args, message):
    code, out, err = invoke("results", "--store", str(store.root), *args)
    assert code == 2 and message in err and out == ""


def test_out_refuses_the_table_a_missing_directory_and_a_directory(store, tmp_path):
    code, _, err = invoke("results", "--store", str(store.root), "--out", str(tmp_path / "t.txt"))
    assert code == 2 and "--out takes csv, json or parquet" in err
    code, _, err = invoke("results", "--store", str(store.root), "--format", "parquet",
                          "--out", str(tmp_path / "nosuch" / "r.parquet"))
    assert code == 2 and "does not exist" in err
    code, _, err = invoke("results", "--store", str(store.root), "--format", "csv", "--out", str(tmp_path))
    assert code == 2 and "is a directory" in err
    assert not (tmp_path / "t.txt").exists() and not (tmp_path / "nosuch").exists()


def test_parquet_round_trip(store, tmp_path):
    path = tmp_path / "runs.parquet"
    code, _, err = invoke("results", "--store", str(store.root), "--format", "parquet", "--out", str(path))
    assert code == 0 and f"6 runs written to {path}" in err
    back = pd.read_parquet(path)
    pd.testing.assert_frame_equal(back, dlbench.load(store.root), check_like=False)
    assert str(back["started_at"].dtype) == "datetime64[ns, UTC]" and str(back["params"].dtype) == "Int64"
    # filtered, and written over the previous file
    code, _, _ = invoke("results", "--store", str(store.root), "--format", "parquet", "--out", str(path),
                        "--framework", "jax")
    assert code == 0
    back = pd.read_parquet(path)
    assert back["framework"].tolist() == ["jax", "jax"] and back["status"].tolist() == ["failed", "ok"]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_csv_and_json_to_a_file(store, tmp_path):
    code, out, _ = invoke("results", "--store", str(store.root), "--format", "csv", "--out", str(tmp_path / "r.csv"),
                          "--status", "ok")
    assert code == 0 and out == ""
    rows = list(csv.DictReader(io.StringIO((tmp_path / "r.csv").read_text())))
    assert list(rows[0]) == list(COLUMNS) and len(rows) == 4
    code, _, _ = invoke("results", "--store", str(store.root), "--format", "json", "--out", str(tmp_path / "r.json"))
    assert code == 0 and len(json.loads((tmp_path / "r.json").read_text())) == 6


def test_many_rows_are_listed_as_plain_columns(store, monkeypatch):
    monkeypatch.setattr(results_cli, "RICH_TABLE_MAX_ROWS", 3)
    code, out, _ = invoke("results", "--store", str(store.root))
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"6 runs in {store.root}"
    # the default columns, less those shown only where a run has a value (compression, parallelism,
    # oversubscription), which no run in the fixture store has
    assert lines[1].split() == [c for c in results_cli.RESULTS_TABLE_COLUMNS if c not in tables.SOMETIMES_COLUMNS]
    for path in store.paths():
        assert sum(line.startswith(path.stem) for line in lines) == 1
    assert "ms/iter" not in out  # the plain columns keep the row's names
    code, out, _ = invoke("results", "--store", str(store.root), "--framework", "torch")
    assert code == 0 and "ms/iter" in out  # few enough rows for the rich table, with its short headers


def test_unreadable_records_are_reported_on_stderr(store):
    bad = store.runs / "20260301T000000Z-000000000bad.json"
    bad.write_text("{not json")
    code, out, err = invoke("results", "--store", str(store.root), "--format", "json")
    assert code == 0 and len(json.loads(out)) == 6
    assert "skipped" in err and str(bad) in err
