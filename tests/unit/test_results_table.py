"""`dlbench results`' table: the key columns in 120 characters by default (run ids whole, the
interval as ±%), --columns to choose, --wide for every column."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlbench.cli import app
from dlbench.cli import tables
from dlbench.store.rows import COLUMNS
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
import site_store  # noqa: E402

T0 = datetime(2026, 11, 2, 8, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """Realistic rows: four frameworks on two suites' benchmarks, a one-repeat run, a failed one."""
    benches = site_store._benchmarks()
    root = tmp_path_factory.mktemp("results") / "store"
    st = Store(root)
    seed = 1
    for bench in ("fcn5-train", "resnet56-train"):
        for fw in site_store.FRAMEWORKS:
            st.write(site_store.make_record(benches[bench], fw, 64, False, T0 + timedelta(minutes=seed), seed))
            seed += 1
    st.write(site_store.make_record(benches["fcn8-train"], "torch", 64, False, T0, 99, repeats=1))
    st.write(site_store.make_record(benches["resnet56-train"], "tensorflow", 256, True, T0, 98, status="failed",
                                    reason="CUDA out of memory"))
    return root


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*args])
    return result.exit_code, result.stdout


def test_the_default_table_fits_120_columns_with_run_ids_whole(store):
    code, out = invoke("results", "--store", str(store))
    assert code == 0
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= tables.WIDTH
    for path in (store / "runs").glob("*.json"):
        assert sum(path.stem in line for line in lines) == 1  # whole, on one line
    header = next(line for line in lines if "run_id" in line)
    assert header.split() == ["run_id", "benchmark", "framework", "batch", "prec.", "compile", "status", "ms/iter", "95%", "CI",
                              "samples/s", "stability"]
    assert any("±" in line and "%" in line for line in lines)
    # the one-repeat run's interval is marked, and the mark explained
    assert any(line.rstrip().endswith("%*") or "%* " in line for line in lines) and tables.ONE_PROCESS in out


def test_columns_choose_and_wide_shows_every_column(store):
    code, out = invoke("results", "--store", str(store), "--columns", "run_id,mfu", "--columns", "joules_per_sample")
    assert code == 0
    header = next(line for line in out.splitlines() if "run_id" in line)
    assert header.split() == ["run_id", "mfu", "joules_per_sample"]
    code, out = invoke("results", "--store", str(store), "--wide")
    assert code == 0
    lines = out.splitlines()
    assert lines[1].split() == list(COLUMNS)
    assert len(lines) == 2 + 1 + 10 + 1  # title, header, rule, a line per run, the footnote
    code, _ = invoke("results", "--store", str(store), "--columns", "nope")
    assert code == 2
    code, _ = invoke("results", "--store", str(store), "--wide", "--format", "csv")
    assert code == 2


def test_the_run_summary_fits_120_columns(store):
    import io

    from rich.console import Console

    from dlbench.cli import run as run_cli

    records = list(Store(store).records())
    console = Console(file=io.StringIO(), width=160)
    console.print(run_cli._summary_table(records), width=min(console.width, tables.WIDTH))
    lines = console.file.getvalue().splitlines()
    assert max(len(line) for line in lines) <= tables.WIDTH
    assert any("resnet56-train" in line and "±" in line for line in lines)
    assert sum("…" in line for line in lines) == 0  # nothing had to be cut
