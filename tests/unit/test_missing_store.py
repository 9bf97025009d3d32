"""A command that only reads the store, pointed at a store that is not there (a mistyped --store, a
machine that has run nothing yet), says so, how to make one, and exits 2; an existing store without
records is an empty store, not a missing one."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from dlbench.cli import app

ANSI = re.compile(r"\x1b\[[0-9;]*m")

READ_ONLY = {
    "results": ["results"],
    "report": ["report", "--out", "site"],
    "compare": ["compare", "--baseline", "framework=torch", "--candidate", "framework=jax"],
    "history": ["history"],
    "kernels": ["kernels"],
    "predict --accuracy": ["predict", "--accuracy"],
    "store verify": ["store", "verify"],
    "store upgrade": ["store", "upgrade"],
}


def invoke(args: list[str]):
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    return result.exit_code, result.stdout, " ".join(ANSI.sub("", result.stderr).split())


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    monkeypatch.delenv("DLBENCH_STORE", raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("command", list(READ_ONLY))
def test_a_store_that_is_not_there_is_named_with_how_to_make_one_exit_2(command, tmp_path):
    missing = tmp_path / "no-such-store"
    code, out, err = invoke([*READ_ONLY[command], "--store", str(missing)])
    assert code == 2 and out == ""
    assert err.startswith(f"error: no store at {missing} (--store: nothing there); make one with `dlbench run --suite ")
    assert f"--store {missing}`" in err
    assert not missing.exists(), "reading a store created it"


@pytest.mark.parametrize("command", list(READ_ONLY))
def test_an_existing_store_without_records_is_not_called_missing(command, tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = invoke([*READ_ONLY[command], "--store", str(tmp_path / "empty")])
    assert "no store at" not in err
    assert code in (0, 1)  # each command's own answer to no records: an empty table, or "no records" (exit 1)


def test_results_on_an_existing_empty_store_is_an_empty_table_exit_0(tmp_path):
    (tmp_path / "empty").mkdir()
    code, out, err = invoke(["results", "--store", str(tmp_path / "empty")])
    assert code == 0 and "0 runs in" in out and err == ""


def test_the_message_says_where_the_path_came_from(tmp_path, monkeypatch):
    code, _, err = invoke(["results"])
    assert code == 2
    assert err == (f"error: no store at {tmp_path / 'results'} (the default, ./results: nothing there); make one "
                   "with `dlbench run --suite fcn --profile smoke`, or point --store or $DLBENCH_STORE at an "
                   "existing store")
    monkeypatch.setenv("DLBENCH_STORE", str(tmp_path / "elsewhere"))
    code, _, err = invoke(["history"])
    assert code == 2 and f"no store at {tmp_path / 'elsewhere'} ($DLBENCH_STORE: nothing there)" in err
    (tmp_path / "a-file").write_text("")
    code, _, err = invoke(["results", "--store", str(tmp_path / "a-file")])
    assert code == 2 and f"no store at {tmp_path / 'a-file'} (--store: a file, not a folder)" in err


def test_the_kernels_command_says_how_to_make_kernel_records(tmp_path):
    code, _, err = invoke(["kernels", "--store", str(tmp_path / "none")])
    assert code == 2 and f"make one with `dlbench run --suite kernels --store {tmp_path / 'none'}`" in err
