"""The documentation site builds with --strict, and its generated pages say what the code says.

The CLI reference and the record schema are written at build time from the typer app and the
pydantic models (docs/hooks/generated_pages.py); if that generation broke or lost a command or a
field, these tests fail. Every `bin/dlbench` line in a bash block of the README or the docs must
parse as the CLI would parse it (an unknown command or option fails). Also: the measurements keep
their form (commands first), the pages keep table cells short, and the README stays a front page.
"""

from __future__ import annotations

import html
import shlex
import re
import sys
from pathlib import Path

import pytest
import typer

from dlbench.cli import app
from dlbench.store.record import Record

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from docs_site import build_docs  # noqa: E402

DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return build_docs(tmp_path_factory.mktemp("docs") / "site")


def page_text(path: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text()))


def test_the_site_builds_strictly_with_every_page(site):
    for page in ("index.html", "guide/install.html", "reference/cli.html", "reference/record.html",
                 "extending.html", "architecture.html", "measurements/index.html", "changelog.html"):
        assert (site / page).is_file(), page


def test_the_cli_reference_lists_every_command_of_the_app(site):
    root = typer.main.get_command(app)
    text = page_text(site / "reference" / "cli.html")
    # typer builds on click (its own copy of it in recent versions): commands are known by their methods
    context = root.context_class(root, info_name="dlbench")
    names = root.list_commands(context)
    assert {"run", "report", "results", "compare", "check", "predict", "store"} <= set(names)
    for name in names:
        assert f"dlbench {name}" in text, f"dlbench {name} is missing from the CLI reference"
        command = root.get_command(context, name)
        if hasattr(command, "list_commands"):
            for sub in command.list_commands(command.context_class(command, info_name=name)):
                assert f"dlbench {name} {sub}" in text
        else:
            for option in (p for p in command.params if p.param_type_name == "option" and not p.hidden):
                assert option.opts[0] in text, f"{name} {option.opts[0]}"


def test_the_record_page_names_every_field_of_the_record(site):
    text = page_text(site / "reference" / "record.html")
    for field in Record.model_fields:
        assert re.search(rf"\b{re.escape(field)}\b", text), f"record field {field} is missing"
    assert f"schema version {Record.model_fields['schema_version'].default}" in text


def test_the_changelog_page_has_the_releases_and_the_coming_one(site):
    from dlbench.version import __version__

    text = page_text(site / "changelog.html")
    assert "0.1.0" in text
    if any((ROOT / "changelog.d").glob("*.md")):
        assert f"{__version__} (unreleased)" in text


def test_every_measurement_page_starts_with_its_commands_and_machine():
    pages = sorted((DOCS / "measurements").glob("2*.md"))
    index = (DOCS / "measurements" / "index.md").read_text()
    assert pages
    for page in pages:
        headings = re.findall(r"^## (.+)$", page.read_text(), re.M)
        assert headings[:2] == ["Commands", "Machine"], page.name
        assert "```bash" in page.read_text().split("## Machine")[0], page.name
        assert f"({page.name})" in index, f"{page.name} is not in measurements/index.md"


def test_no_table_cell_is_a_paragraph():
    for page in DOCS.rglob("*.md"):
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.startswith("|"):
                for cell in line.strip("|").split("|"):
                    assert len(cell.strip()) <= 200, f"{page.relative_to(ROOT)}:{number}: a cell of {len(cell)} characters"


def test_the_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert not re.search(r"\b2026-1[12]-\d\d\b", readme), "dated measurements belong in docs/measurements/"
    assert "docs/images/leaderboard.png" in readme and (DOCS / "images" / "leaderboard.png").is_file()


def documented_command_lines() -> list[tuple[str, list[str]]]:
    """Every `bin/dlbench ...` line of a bash block in the README and the docs, as arguments."""
    found = []
    for page in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]:
        for block in re.findall(r"^```bash\n(.*?)^```", page.read_text(), re.M | re.S):
            for line in block.splitlines():
                line = re.sub(r"\s+#.*$", "", line)
                for call in line.split("&&"):
                    call = re.sub(r"\[[^\]]*\]", "", call).strip()  # [--optional parts] as a synopsis writes them
                    if call.startswith("bin/dlbench "):
                        found.append((f"{page.relative_to(ROOT)}: {call}", shlex.split(call)[1:]))
    return found


@pytest.mark.parametrize("where, args", documented_command_lines(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_documented_command_exists_with_its_options(where, args):
    node, context, path = typer.main.get_command(app), None, ["dlbench"]
    while hasattr(node, "list_commands"):
        context = node.make_context(path[-1], [], parent=context, resilient_parsing=True)
        sub = node.get_command(context, args[0])
        assert sub is not None, f"{where}: no command {args[0]!r}"
        node, path, args = sub, [*path, args[0]], args[1:]
    node.make_context(path[-1], args, parent=context)  # raises on an unknown option or a bad value
