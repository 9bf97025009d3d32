"""docs/extending.md, "Add an axis": `Layout` (nchw | nhwc), a new axis of every single-process run,
added in a temporary copy of the tree (tree_copy.py) the way the recipe says: its Axis class and its
RequestAxis entry in the runner contract (REQUEST_AXES), the planned benchmark's field, the run
option (the request's field and the command's parameter), and the record's Workload field (a new
schema version, as "Add a record field"). Nothing else is edited: runner.toml's [capabilities]
field, the refusal, the worker's request, the crossing of the option with the benchmarks, the row
in the suite-kind table and the kinds that take it, the plan's keys, the pairing key of `dlbench
compare`, `dlbench history`'s series and the report's keys all come from the entry. Without a
framework, the test shows: the axis parses and refuses a value with the one message; the harness's
request typing types it; a runner.toml listing it loads, and a runner not listing a value refuses it
with the reason; the suite-kind table's test fails until the option is a parameter of `dlbench
run`, and every kind but benchmark then refuses it; a fake run at a layout its runner.toml does not
list is recorded skipped with that reason, one at a listed layout is recorded with it; compare,
history and the report key the record on it."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from tree_copy import ROOT, TreeCopy, one_line, recipe_files

from dlbench.store.record import SCHEMA_VERSION

NEW_VERSION = SCHEMA_VERSION + 1

# The recipe's files, as docs/extending.md lists them (the test reads that list too).
RECIPE_FILES = {
    "runners/common/contract.py", "src/dlbench/definitions/suite.py", "src/dlbench/workflows/requests.py",
    "src/dlbench/cli/run.py", "src/dlbench/store/record.py", "src/dlbench/store/migrations.py",
    "schemas/record.schema.json", f"tests/fixtures/records/v{NEW_VERSION}.json", "tests/fixtures/records/README.md",
}
# unchanged, but run from the copy: the fake runner (its worker imports `runners` from two levels
# above tests/, so from the copy), the fixtures, and the suite-kind table's test
EXTRA = ("tests/fixtures/runners/fake", "tests/fixtures/records", "tests/unit/test_run_options.py",
         "tests/unit/conftest.py", "tests/conftest.py")

LAYOUT = '''\
class Layout(Axis):
    """The memory layout of a network's image tensors in the framework: channels before the spatial
    dimensions (nchw) or after them (nhwc); the canonical weights and inputs stay as they are."""

    NCHW = "nchw"
    NHWC = "nhwc"


'''
# its entry: runner.toml's `layouts` lists what a runner runs; one that does not list it runs nchw,
# what every runner built before the axis existed (so no runner.toml changes)
ENTRY = '''\
    RequestAxis("layout", Layout, "the memory layout of a network's image tensors", capability="layouts",
                unlisted=("nchw",)),
'''
TABLE_TEST = "tests/unit/test_run_options.py::test_the_table_covers_every_option_and_every_kind"


def add_axis_but_not_its_option(tree: TreeCopy) -> None:
    contract = "runners/common/contract.py"
    tree.insert(contract, "class RequestAxis:", LAYOUT, before=True)
    tree.insert(contract, "                unlisted=(), optional=True, own_figures=True),\n", ENTRY)

    # the benchmark carries it (what a run without the option runs)
    tree.insert("src/dlbench/definitions/suite.py", '    generation: "Generation | None" = None  # mode generate only\n',
                '    layout: str = "nchw"  # the image tensors\' layout (REQUEST_AXES["layout"])\n')

    # the record's field: "Add a record field" (a version that only adds it)
    record = "src/dlbench/store/record.py"
    tree.insert(record, "    scenario: Literal[SCENARIOS] | None = None\n",
                f"    layout: str | None = None  # nchw | nhwc (schema {NEW_VERSION}); None: not recorded, the framework's own\n")
    tree.replace(record, f"SCHEMA_VERSION = {SCHEMA_VERSION}\n", f"SCHEMA_VERSION = {NEW_VERSION}\n")
    tree.insert(record, '    defaults: no migration).\n"""', (
        f"\n  {NEW_VERSION} (2026-12-07) `workload.layout` (nchw | nhwc): the image tensors' layout the run asked\n"
        "    for. Older records read with none (None: each framework's own then) (the model's defaults: no\n"
        "    migration)."), before=True)
    tree.replace("src/dlbench/store/migrations.py", "MODEL_DEFAULTS_SUFFICE = (5, ",
                 f"MODEL_DEFAULTS_SUFFICE = (5, {NEW_VERSION}, ")


def add_option(tree: TreeCopy) -> None:
    """The run option: the request's field and the command's parameter, last in both (the same order)."""
    tree.insert("src/dlbench/workflows/requests.py", "    data: Path | None = None\n",
                "    layout: list[str] | None = None\n")
    tree.insert("src/dlbench/cli/run.py", 'digits need none.")] = None,\n', (
        "    layout: Annotated[Optional[list[str]], run_axis_option(\n"
        "        REQUEST_AXES[\"layout\"], help=\"The image tensors' memory layout; a comma list or 'all', repeatable \"\n"
        "                                    \"(default: nchw).\")] = None,\n"))


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> TreeCopy:
    copy = TreeCopy(tmp_path_factory.mktemp("axis"), extra=EXTRA)
    add_axis_but_not_its_option(copy)
    return copy


@pytest.fixture(scope="module")
def table_before_the_option(tree):
    """The suite-kind table's test on the copy before `dlbench run` has the option, then the option added."""
    before = tree.pytest(TABLE_TEST)
    add_option(tree)
    return before


@pytest.fixture(scope="module")
def project(tree, tmp_path_factory):
    """A dlbench root whose only runner is the copy's fake one (runner.toml lists no layouts)."""
    root = tmp_path_factory.mktemp("project")
    (root / "runners").mkdir()
    (root / "runners" / "fake").symlink_to(tree.path("tests/fixtures/runners/fake"))
    (root / "runners" / "common").symlink_to(tree.path("runners/common"))
    for data in ("suites", "reports"):
        (root / data).symlink_to(ROOT / data)
    return root


def test_the_axis_parses_and_refuses_a_value_with_the_one_message(tree):
    done = tree.python(
        "from dlbench.axes import REQUEST_AXES\n"
        "from runners.common.contract import Layout, typed_request\n"
        "print(Layout.parse('nhwc', who='--layout') is Layout.NHWC, REQUEST_AXES['layout'].axis is Layout)\n"
        "typed = typed_request({'precision': 'fp32', 'layout': 'nhwc'})\n"
        "print(typed['layout'] is Layout.NHWC, typed['layout'] == 'nhwc', f\"{typed['layout']}\")\n"
        "for bad in (lambda: Layout.parse('nwhc', who='--layout'), lambda: typed_request({'layout': 'nwhc'})):\n"
        "    try:\n"
        "        bad()\n"
        "    except ValueError as e:\n"
        "        print(e)\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "True True",
        "True True nhwc",  # the harness hands a runner the member, which compares and prints as the string
        "--layout: layout 'nwhc' is not one it accepts (nchw, nhwc)",
        "the request's 'layout': layout 'nwhc' is not one it accepts (nchw, nhwc)",
    ]


def test_runner_toml_lists_the_axis_and_a_runner_refuses_what_it_does_not_list(tree, tmp_path):
    runners = tmp_path / "runners"
    shutil.copytree(tree.path("tests/fixtures/runners/fake"), runners / "fake")
    toml = runners / "fake" / "runner.toml"
    toml.write_text(toml.read_text().replace('scenarios = ["single_stream"', 'layouts = ["nchw", "nhwc"]\nscenarios = ["single_stream"'))
    shutil.copytree(runners / "fake", runners / "plain")
    plain = runners / "plain" / "runner.toml"
    plain.write_text(plain.read_text().replace('name = "fake"', 'name = "plain"').replace('layouts = ["nchw", "nhwc"]\n', ""))
    shutil.copytree(runners / "fake", runners / "bad")
    bad = runners / "bad" / "runner.toml"
    bad.write_text(bad.read_text().replace('name = "fake"', 'name = "bad"').replace('"nchw", "nhwc"', '"nchw", "nwhc"'))
    done = tree.python(
        "import sys\n"
        "from pathlib import Path\n"
        "from runners.common.contract import Layout\n"
        "from dlbench.definitions.loader import DefinitionError\n"
        "from dlbench.execution.registry import RunnerRegistry\n"
        "registry = RunnerRegistry(Path(sys.argv[1]))\n"
        "for name in ('fake', 'plain'):\n"
        "    caps = registry.get(name).capabilities\n"
        "    print(sorted(v.value for v in caps.listed(Layout)), caps.refusal(name, Layout.NHWC))\n"
        "try:\n"
        "    registry.get('bad')\n"
        "except DefinitionError as e:\n"
        "    print(e)\n", str(runners))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "['nchw', 'nhwc'] None",
        # a runner.toml that does not list the axis runs what every runner built before it: nchw
        "['nchw'] plain runner: layout nhwc is not one it runs (runner.toml [capabilities]: nchw)",
        f"{bad}: capabilities.layouts[1]: 'nwhc' is not one of nchw, nhwc",
    ]


def test_the_suite_kind_table_test_fails_until_run_has_the_option(tree, table_before_the_option):
    assert table_before_the_option.returncode == 1, table_before_the_option.stdout
    before = table_before_the_option.stdout
    assert "1 failed" in before
    # the table has the axis's row (from its entry), run's parameters do not: the one missing (pytest's diff)
    assert re.search(r"Extra items in the right set:\s+E\s+'layout'\n", before), before

    # with the option: the table holds again, and each kind that does not honour it refuses it
    done = tree.pytest("tests/unit/test_run_options.py", "-k",
                       "table_covers_every_option or (does_not_honour and layout)")
    assert done.returncode == 0, done.stdout + done.stderr
    # the table's test, and distributed, comm, kernels and convergence refusing --layout; benchmark takes it
    assert "5 passed" in done.stdout


def test_a_run_records_the_layout_and_skips_one_its_runner_does_not_list(tree, table_before_the_option, project,
                                                                         tmp_path):
    store = tmp_path / "store"
    done = tree.dlbench("run", "--suite", "fcn", "--framework", "fake", "--env", "current", "--profile", "smoke",
                        "--benchmark", "fcn5-train", "--device", "cpu", "--threads", "1", "--repeats", "1",
                        "--no-check", "--no-telemetry", "--store", str(store), "--layout", "nchw,nhwc",
                        cwd=tmp_path, DLBENCH_ROOT=str(project), DLBENCH_CACHE=str(tmp_path / "cache"),
                        DLBENCH_FAKE_STEP_S="0.0005", DLBENCH_STORE=str(tmp_path / "default-store"))
    assert done.returncode == 0, done.stderr
    records = {r["workload"]["layout"]: r for r in (json.loads(p.read_text()) for p in (store / "runs").glob("*.json"))}
    assert sorted(records) == ["nchw", "nhwc"]
    assert records["nchw"]["status"] == "ok" and records["nchw"]["schema_version"] == NEW_VERSION
    assert (records["nhwc"]["status"], records["nhwc"]["reason"]) == (
        "skipped", "fake runner: layout nhwc is not one it runs (runner.toml [capabilities]: nchw)")

    # what pairs runs knows the axis from its entry: compare's key, history's series, the report's
    # keys; and `dlbench results` has its column
    keyed = tree.python(
        "import sys\n"
        "from pathlib import Path\n"
        "from dlbench.analysis.comparison import KEY_FIELDS, record_identity\n"
        "from dlbench.analysis.history import SeriesKey\n"
        "from dlbench.reporting.model import run_view\n"
        "from dlbench.store.rows import run_row\n"
        "from dlbench.store.store import Store\n"
        "[r] = [r for r in Store(Path(sys.argv[1])).records() if r.status == 'ok']\n"
        "print(KEY_FIELDS)\n"
        "print(record_identity(r)['layout'], SeriesKey.of(r).layout, SeriesKey.of(r).fields()['layout'], "
        "run_row(r)['layout'])\n"
        "v = run_view(r)\n"
        "print(v.entry_key[-1], v.series_key[-1], v.variant)\n", str(store))  # compression unset: left out
    assert keyed.returncode == 0, keyed.stderr
    assert keyed.stdout.splitlines() == [
        "('suite', 'benchmark', 'batch_size', 'device', 'precision', 'compile', 'layout', 'framework', 'machine', "
        "'scenario', 'compression', 'parallelism')",
        "nchw nchw nchw nchw",
        "nchw nchw ('fp32', 'eager', 'nchw')",
    ]

    # the record's new version: its schema exported and its fixture added, as "Add a record field" says
    assert tree.dlbench("schema", "export", str(tree.path("schemas"))).returncode == 0
    ok = next(p for p in (store / "runs").glob("*.json") if json.loads(p.read_text())["workload"]["layout"] == "nchw")
    shutil.copy(ok, tree.path(f"tests/fixtures/records/v{NEW_VERSION}.json"))
    readme = tree.path("tests/fixtures/records/README.md")
    readme.write_text(readme.read_text() + f"| `v{NEW_VERSION}.json` | {NEW_VERSION} | a fake-runner run of "
                      "`fcn5-train` with `--layout nchw`: `workload.layout` |\n")
    assert tree.changed() == RECIPE_FILES == recipe_files("Add an axis")


def test_run_help_lists_the_option(tree, table_before_the_option):
    done = tree.dlbench("run", "--help")
    assert done.returncode == 0, done.stderr
    assert "--layout" in done.stdout and "nchw|nhwc|all" in one_line(done.stdout)
