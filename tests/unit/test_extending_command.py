"""docs/extending.md, "Add a CLI command": a workflow function that takes a typed request and returns
data, a CLI module that parses, calls and renders, and the command's line in cli/__init__.py. Done in
a temporary copy of the tree (tree_copy.py): `dlbench count --suite fcn` then counts the suite's
benchmarks through the workflow layer, `--help` lists it, a bad value is one message and exit 2, and
import-linter's contracts still hold on the copy."""

from __future__ import annotations

import pytest
from tree_copy import ROOT, TreeCopy, one_line, recipe_files

from dlbench.definitions.catalog import SuiteCatalog

# The recipe's files, as docs/extending.md lists them: the test holds the copy's changes to these.
RECIPE_FILES = {"src/dlbench/workflows/count.py", "src/dlbench/cli/count.py", "src/dlbench/cli/__init__.py"}

WORKFLOW = '''\
"""`count`: how many benchmarks a suite has under a profile, per suite; printing nothing."""

from __future__ import annotations

from dataclasses import dataclass

from ..definitions.suite import PROFILES
from . import lookup


@dataclass(frozen=True)
class CountRequest:
    """`dlbench count`'s options: a suite (a name, a path, or 'all'), a profile and a device."""

    suite: str
    profile: str = "default"
    device: str = "cpu"


@dataclass(frozen=True)
class SuiteCount:
    suite: str
    benchmarks: int


def count_benchmarks(request: CountRequest) -> list[SuiteCount]:
    """Each suite's benchmarks under the request's profile; RequestError for an unknown name."""
    lookup.check_choice("profile", request.profile, list(PROFILES))
    suites = lookup.load_suites(lookup.catalog(), request.suite, request.profile, request.device)
    return [SuiteCount(s.name, len(s.benchmarks)) for s in suites]
'''

COMMAND = '''\
"""`dlbench count`: parses its options, asks the workflow, prints the counts."""

from __future__ import annotations

from typing import Annotated

import typer

from ..workflows.count import CountRequest, count_benchmarks
from .console import out
from .lookup import refused
from .options import ProfileOption


def count(
    suite: Annotated[str, typer.Option(help="A suite's name or path, or 'all'.")],
    profile: ProfileOption = "default",
) -> None:
    """How many benchmarks a suite has under a profile."""
    for counted in refused(count_benchmarks, CountRequest(suite=suite, profile=profile)):
        out.print(f"{counted.suite}: {counted.benchmarks} benchmarks")
'''


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> TreeCopy:
    copy = TreeCopy(tmp_path_factory.mktemp("command"))
    copy.add("src/dlbench/workflows/count.py", WORKFLOW)
    copy.add("src/dlbench/cli/count.py", COMMAND)
    init = "src/dlbench/cli/__init__.py"
    # the import joins the others, and the command is registered beside `info`
    copy.replace(init, "from . import check, compare, env,", "from . import check, compare, count, env,")
    copy.insert(init, 'app.command("info")(info.info)\n', 'app.command("count")(count.count)\n')
    copy.insert(init, "    info.py         info\n", "    count.py        count\n")  # the docstring's list of modules
    return copy


def test_the_recipe_names_every_file_the_command_touches(tree):
    assert tree.changed() == RECIPE_FILES == recipe_files("Add a CLI command")


def test_the_new_command_counts_a_suites_benchmarks_through_the_workflow(tree):
    done = tree.dlbench("count", "--suite", "fcn", "--profile", "smoke")
    assert done.returncode == 0, done.stderr
    # the catalog's own count, computed here without the new code
    catalog = SuiteCatalog(ROOT / "suites")
    expected = len(catalog.load_suite(catalog.suite_path("fcn"), "smoke", "cpu").benchmarks)
    assert expected > 0
    assert done.stdout.strip() == f"fcn: {expected} benchmarks"

    # the workflow is a Python API too: a request in, data out, nothing printed
    api = tree.python("from dlbench.workflows.count import CountRequest, count_benchmarks\n"
                      "print(count_benchmarks(CountRequest(suite='fcn', profile='smoke')))")
    assert api.returncode == 0, api.stderr
    assert api.stdout.strip() == f"[SuiteCount(suite='fcn', benchmarks={expected})]"


def test_help_lists_the_new_command(tree):
    done = tree.dlbench("--help")
    assert done.returncode == 0, done.stderr
    assert "count" in done.stdout.split() and "How many benchmarks a suite has" in one_line(done.stdout)
    # and the repository's own command line has no such command: the copy is what changed
    from typer.testing import CliRunner

    from dlbench.cli import app

    assert "count" not in CliRunner().invoke(app, ["--help"]).stdout.split()


def test_a_bad_value_is_one_message_and_exit_2(tree):
    done = tree.dlbench("count", "--suite", "nope")
    assert done.returncode == 2 and done.stdout == ""
    message = one_line(done.stderr)
    assert message.startswith("error: unknown suite 'nope'; valid suites:") and "fcn" in message
    assert "Traceback" not in done.stderr

    done = tree.dlbench("count", "--suite", "fcn", "--profile", "huge")
    assert done.returncode == 2 and one_line(done.stderr) == (
        "error: unknown profile 'huge'; valid profiles: smoke, default, paper")


def test_the_import_contracts_still_hold_on_the_copy(tree):
    done = tree.lint_imports()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "dlbench imports only downward KEPT" in done.stdout
    assert "no import cycles between the modules of a package KEPT" in done.stdout
