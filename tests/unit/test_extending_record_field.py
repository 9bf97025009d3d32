"""docs/extending.md, "Add a record field": one optional field with a default on the Record model, a
new schema version that only adds it (no migration of its own: the model's default reads older
records), its column in `dlbench results`, the exported JSON Schema and the new version's fixture.
Done in a temporary copy of the tree (tree_copy.py): a record written with the field through the
Store, and the fixtures of versions 14 and 1, which read with the default, make a store that
`dlbench store verify` passes and `dlbench results --columns label` shows; the schema check of
tests/unit/test_schemas.py fails on the copy until `dlbench schema export` has run."""

from __future__ import annotations

import json
import shutil

import pytest
from tree_copy import ROOT, TreeCopy, one_line, recipe_files
from typer.testing import CliRunner

from dlbench.cli import app
from dlbench.store.record import SCHEMA_VERSION

FIXTURES = ROOT / "tests" / "fixtures" / "records"
NEW_VERSION = SCHEMA_VERSION + 1
NEW_RUN_ID = "20261207T150000Z-0123456789ab"
LABEL = "walkthrough run"

# The recipe's files, as docs/extending.md lists them (the test reads that list too).
RECIPE_FILES = {"src/dlbench/store/record.py", "src/dlbench/store/migrations.py", "src/dlbench/store/rows.py",
                "schemas/record.schema.json", f"tests/fixtures/records/v{NEW_VERSION}.json",
                "tests/fixtures/records/README.md"}
# what the copy also holds, unchanged: the fixtures, and the schema test to run on the copy
EXTRA = ("tests/fixtures/records", "tests/unit/test_schemas.py", "tests/unit/conftest.py", "tests/conftest.py")

# A record of the new version, written by the copy's Store: the v14 fixture read at the new version
# (so through the version-only step), given the field and a run id of its own.
WRITE_RECORD = f"""
import json, sys
from pathlib import Path
from dlbench.store import migrations
from dlbench.store.record import SCHEMA_VERSION, Record
from dlbench.store.store import Store

data = json.loads(Path({str(FIXTURES / f"v{SCHEMA_VERSION}.json")!r}).read_text())
data.pop("checksum")
record = Record.model_validate(migrations.upgrade(data, SCHEMA_VERSION))
assert record.label is None, record.label  # the older record reads with the default
print(Store(Path(sys.argv[1])).write(record.model_copy(update={{"run_id": {NEW_RUN_ID!r}, "label": {LABEL!r}}})))
"""
SCHEMA_TEST = "tests/unit/test_schemas.py::test_the_committed_schema_is_the_models[record]"


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> TreeCopy:
    copy = TreeCopy(tmp_path_factory.mktemp("record-field"), extra=EXTRA)
    record = "src/dlbench/store/record.py"
    copy.insert(record, "    convergence: ConvergenceInfo | None = None  # time to accuracy (schema 11)\n",
                f"    label: str | None = None  # a free-text label the run was given (schema {NEW_VERSION})\n")
    copy.replace(record, f"SCHEMA_VERSION = {SCHEMA_VERSION}\n", f"SCHEMA_VERSION = {NEW_VERSION}\n")
    copy.insert(record, '    defaults: no migration).\n"""', (
        f"\n  {NEW_VERSION} (2026-12-07) `label`: a free-text label the run was given. Older records read with\n"
        "    none (None) (the model's defaults: no migration)."), before=True)
    # the new version only adds a field with a default: a version-only step
    copy.replace("src/dlbench/store/migrations.py", "MODEL_DEFAULTS_SUFFICE = (5, ",
                 f"MODEL_DEFAULTS_SUFFICE = (5, {NEW_VERSION}, ")
    rows = "src/dlbench/store/rows.py"
    copy.insert(rows, '"machine", "equivalence", "reason", "stability_reason",', ' "label",')
    copy.insert(rows, '        "stability_reason": s.stability.reason if s and s.stability else None,\n',
                '        "label": r.label,\n')
    return copy


@pytest.fixture(scope="module")
def store(tree, tmp_path_factory):
    """A store of the copy: the new record, and the fixtures of versions 14 and 1 as they are."""
    root = tmp_path_factory.mktemp("store")
    done = tree.python(WRITE_RECORD, str(root))
    assert done.returncode == 0, done.stderr
    for version in (SCHEMA_VERSION, 1):
        data = json.loads((FIXTURES / f"v{version}.json").read_text())
        shutil.copy(FIXTURES / f"v{version}.json", root / "runs" / f"{data['run_id']}.json")
    return root


def schema_check(tree):
    return tree.pytest(SCHEMA_TEST)


def test_the_schema_check_fails_until_the_schema_is_exported_and_the_recipe_is_every_file(tree, store):
    # the model changed and schemas/ did not: the repository's own schema test says so, on the copy
    done = schema_check(tree)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "schemas/record.schema.json differs from dlbench's models" in one_line(done.stdout)

    done = tree.dlbench("schema", "export", str(tree.path("schemas")))
    assert done.returncode == 0, done.stderr
    assert schema_check(tree).returncode == 0
    exported = json.loads(tree.path("schemas/record.schema.json").read_text())
    assert exported["properties"]["label"]["default"] is None

    # the new version's fixture: the record the copy's Store wrote, and its line in the README
    written = store / "runs" / f"{NEW_RUN_ID}.json"
    shutil.copy(written, tree.path(f"tests/fixtures/records/v{NEW_VERSION}.json"))
    readme = tree.path("tests/fixtures/records/README.md")
    readme.write_text(readme.read_text() + f"| `v{NEW_VERSION}.json` | {NEW_VERSION} | a record written by schema "
                      f"{NEW_VERSION}'s `Store.write`: the v{SCHEMA_VERSION} record with `label` set |\n")
    assert tree.changed() == RECIPE_FILES == recipe_files("Add a record field")


def test_the_record_keeps_the_field_and_old_records_read_with_the_default(tree, store):
    written = json.loads((store / "runs" / f"{NEW_RUN_ID}.json").read_text())
    assert (written["schema_version"], written["label"]) == (NEW_VERSION, LABEL)
    assert written["checksum"].startswith("sha256:")

    done = tree.dlbench("results", "--store", str(store), "--format", "json")
    assert done.returncode == 0, done.stderr
    labels = {row["run_id"]: row["label"] for row in json.loads(done.stdout)}
    v14, v1 = (json.loads((FIXTURES / f"v{v}.json").read_text())["run_id"] for v in (SCHEMA_VERSION, 1))
    assert labels == {NEW_RUN_ID: LABEL, v14: None, v1: None}


def test_store_verify_passes_on_old_and_new_records(tree, store):
    done = tree.dlbench("store", "verify", "--store", str(store))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (f"{store}: 3 records: 2 verified by checksum, 1 unverified (written before checksums: schema 1: 1), "
            "0 problems") in one_line(done.stdout)
    # why the version moved: the repository's dlbench, which does not know the field, reads the new
    # record as newer than it (upgrade dlbench), not as a damaged one
    result = CliRunner().invoke(app, ["store", "verify", "--store", str(store)])
    assert result.exit_code == 1
    assert (f"schema_version {NEW_VERSION}; this dlbench reads schema_versions" in one_line(result.stdout)
            and "(a newer dlbench wrote it: upgrade dlbench to read it)" in one_line(result.stdout))


def test_results_shows_the_new_column(tree, store):
    done = tree.dlbench("results", "--store", str(store), "--columns", "run_id,label")
    assert done.returncode == 0, done.stderr
    (row,) = [line for line in done.stdout.splitlines() if NEW_RUN_ID in line]
    assert LABEL in row
    assert "label" in done.stdout.split()
