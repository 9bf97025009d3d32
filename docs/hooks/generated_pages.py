"""MkDocs hook: the pages that are written from the code at build time, never committed.

The CLI reference is read from the typer app (`dlbench.cli:app`) and the record schema from the
pydantic models (`dlbench.store.record`), so neither can drift from the program: a renamed option
or a new record field shows up in the next build, and a build that cannot import them fails
(tests/unit/test_docs.py builds with --strict). The changelog page is CHANGELOG.md at the
repository root, the file towncrier writes, with the fragments of the coming release drafted
beneath its heading.
"""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
import typing
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[2]

CLI_PAGE = "reference/cli.md"
RECORD_PAGE = "reference/record.md"
CHANGELOG_PAGE = "changelog.md"


def on_files(files, config):
    for uri, content in ((CLI_PAGE, cli_reference()), (RECORD_PAGE, record_reference()),
                         (CHANGELOG_PAGE, changelog())):
        files.append(File.generated(config, uri, content=content))
    return files


def on_post_build(config):
    # Opened from disk (file://), Material's pages ask for search/search_index.js, which only its
    # `offline` plugin writes, and that plugin also loads a shim from a CDN (mkdocs.yml says why it
    # is off). The index as a script keeps those pages free of a failed load; search needs a server.
    index = Path(config.site_dir) / "search" / "search_index.json"
    if index.is_file():
        index.with_suffix(".js").write_text("var __index = " + index.read_text())


# ---- the CLI ----------------------------------------------------------------------------------

def cli_reference() -> str:
    import typer

    from dlbench.cli import app

    root = typer.main.get_command(app)
    lines = ["# CLI reference", "",
             "Generated from the program (`dlbench.cli:app`) each time the site is built: every command, "
             "its arguments and options, as `dlbench COMMAND --help` gives them.", ""]
    commands = list(_walk(root, ["dlbench"]))
    lines += ["| command | what it does |", "|---|---|"]
    for path, command in commands[1:]:
        if not _is_group(command):
            lines.append(f"| [`{' '.join(path)}`](#{_anchor(path)}) | {_first_sentence(command)} |")
    lines.append("")
    for path, command in commands[1:]:
        lines += _command_section(path, command)
    return "\n".join(lines) + "\n"


# Typer builds its commands on click, a copy of it of its own in recent versions (typer._click), so
# commands and parameters are recognised by what they have, not by click's classes.

def _is_group(command) -> bool:
    return hasattr(command, "list_commands")


def _context(command, name: str):
    return command.context_class(command, info_name=name)


def _walk(command, path: list[str]):
    yield path, command
    if _is_group(command):
        context = _context(command, path[-1])
        for name in command.list_commands(context):
            sub = command.get_command(context, name)
            if sub is not None and not sub.hidden:
                yield from _walk(sub, [*path, name])


def _anchor(path: list[str]) -> str:
    return "-".join(path)


def _first_sentence(command) -> str:
    text = _help_text(command).split("\n\n")[0].replace("\n", " ").strip()
    return text.replace("|", "\\|")


def _help_text(command) -> str:
    return inspect.cleandoc(command.help or command.short_help or "")


def _command_section(path: list[str], command) -> list[str]:
    name = " ".join(path)
    heading = "##" if len(path) == 2 else "###"
    out = [f"{heading} `{name}` {{#{_anchor(path)}}}", ""]
    help_text = _help_text(command)
    if help_text:
        out += [_escape_markdown(help_text), ""]
    if _is_group(command):
        context = _context(command, path[-1])
        out += ["Subcommands: " + ", ".join(f"[`{sub}`](#{_anchor([*path, sub])})"
                                               for sub in command.list_commands(context)), ""]
        return out
    context = _context(command, name)
    usage = " ".join(command.collect_usage_pieces(context))
    usage = re.sub(r"\{(\w+)\}", lambda m: m.group(1).upper(), usage)  # typer writes arguments as {name}
    out += ["```", f"{name} {usage}", "```", ""]
    for kind, title in (("argument", "Arguments"), ("option", "Options")):
        # each parameter as its --help line gives it: the flags with their value, the help with its default
        records = [p.get_help_record(context) for p in command.params
                   if p.param_type_name == kind and not getattr(p, "hidden", False)]
        records = [r for r in records if r]
        if records:
            out += [f"**{title}**", ""]
            for flags, help_text in records:
                out += [f"`{flags}`", f":   {_escape_markdown(help_text) or '&nbsp;'}", ""]
    return out


def _escape_markdown(text: str) -> str:
    # help texts are plain text written for a terminal; keep `<...>` and `*` from being read as HTML or emphasis
    return text.replace("<", "&lt;").replace("*", "\\*")


# ---- the record schema --------------------------------------------------------------------------

def record_reference() -> str:
    from pydantic import BaseModel

    from dlbench.store import record as record_module

    models = [m for m in vars(record_module).values()
              if isinstance(m, type) and issubclass(m, BaseModel) and m.__module__ == record_module.__name__
              and not m.__name__.startswith("_")]
    comments = _field_comments(Path(record_module.__file__).read_text())
    ordered = [record_module.Record] + sorted((m for m in models if m is not record_module.Record),
                                              key=lambda m: m.__name__)
    names = {m.__name__ for m in ordered}
    lines = ["# The run record", "",
             f"Generated from `dlbench.store.record` each time the site is built. A record is one JSON file "
             f"`STORE/runs/<run_id>.json`; this page describes schema version "
             f"**{record_module.SCHEMA_VERSION}**, the one dlbench writes now. Older records are read as this "
             "version (`dlbench store upgrade` rewrites them). The file also carries `checksum` and, after an "
             "upgrade, `upgraded_from`, which belong to the file rather than to the record.", ""]
    for model in ordered:
        lines += [f"## {model.__name__}", ""]
        doc = inspect.getdoc(model) if model.__doc__ else ""
        if doc:
            lines += [doc, ""]
        for field_name, info in model.model_fields.items():
            shown = info.alias or field_name
            kind = _annotation_text(info.annotation, names)
            default = "required" if info.is_required() else f"default `{_short_repr(info.get_default(call_default_factory=True))}`"
            description = info.description or comments.get((model.__name__, field_name), "")
            lines.append(f"- `{shown}` ({kind}, {default})" + (f": {_escape_markdown(description)}" if description else ""))
        lines.append("")
    lines += ["## Schema versions", "", "As `store/record.py` keeps the history:", "",
              "```text", inspect.getdoc(record_module).split("SCHEMA_VERSION history", 1)[-1].strip(), "```", ""]
    return "\n".join(lines)


def _field_comments(source: str) -> dict[tuple[str, str], str]:
    """The comments beside or above each field in the module, which is where record.py explains them."""
    lines = source.splitlines()
    found: dict[tuple[str, str], str] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                parts = []
                above = item.lineno - 2
                block = []
                while above >= 0 and lines[above].strip().startswith("#"):
                    block.insert(0, lines[above].strip().lstrip("#").strip())
                    above -= 1
                parts += block
                trailing = re.search(r"#\s*(.*)$", lines[item.end_lineno - 1])
                if trailing and "noqa" not in trailing.group(1):
                    parts.append(trailing.group(1))
                if parts:
                    found[(node.name, item.target.id)] = " ".join(parts)
    return found


def _annotation_text(annotation, model_names: set[str]) -> str:
    text = _type_repr(annotation)
    for name in sorted(model_names, key=len, reverse=True):
        text = re.sub(rf"\b{name}\b", f"[{name}](#{name.lower()})", text)
    return text


def _type_repr(annotation) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_repr(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return " | ".join(f"`{a}`" for a in typing.get_args(annotation))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " | ".join(_type_repr(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_repr(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


def _short_repr(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---- the changelog ------------------------------------------------------------------------------

def changelog() -> str:
    text = (REPO / "CHANGELOG.md").read_text()
    draft = _towncrier_draft()
    if draft:
        marker = "<!-- towncrier release notes start -->"
        text = text.replace(marker, marker + "\n\n" + draft, 1)
    return text


def _towncrier_draft() -> str:
    """The coming release, from the fragments in changelog.d/ (towncrier's draft, which writes nothing)."""
    from dlbench.version import __version__

    if not any(p.name != ".gitignore" for p in (REPO / "changelog.d").glob("*.md")):
        return ""
    done = subprocess.run([sys.executable, "-m", "towncrier", "build", "--draft", "--version", __version__],
                          cwd=REPO, capture_output=True, text=True, check=True)
    body = done.stdout.split("What is seen below is what would be written.", 1)[-1].strip()
    return re.sub(r"^## (\S+) \(.*\)$", r"## \1 (unreleased)", body, count=1, flags=re.M)
