"""A temporary copy of the tree for the walkthroughs of docs/extending.md that change code (a CLI
command, a record field, an axis): the copy is edited by small literal insertions at named places,
each of which must exist exactly once (so a walkthrough whose code moved fails loudly here, not
silently on a stale anchor), and dlbench is then run from the copy in a child process, with the
copy's `src` and its root (for `runners`) first on the import path.

`changed()` compares the copy with the repository file by file: the set of files a walkthrough
touched, which its test holds equal to the recipe's list in docs/extending.md."""

from __future__ import annotations

import filecmp
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from dlbench.store.record import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[2]
EXTENDING = ROOT / "docs" / "extending.md"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
# what the copies hold: the controller, the runners (the axes live in runners/common/contract.py),
# the committed schemas, and pyproject.toml for import-linter's contracts
COPIED = ("src/dlbench", "runners", "schemas", "pyproject.toml")
# data the copies read as they are, linked: the repository's own tests run on a copy find them there
LINKED = ("suites", "reports")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")


class TreeCopy:
    def __init__(self, root: Path, extra: tuple[str, ...] = ()):
        """The copy of COPIED and of `extra` (more of the repository a walkthrough changes or runs)."""
        self.root = root
        self.copied = (*COPIED, *extra)
        for rel in self.copied:
            source = ROOT / rel
            if source.is_dir():
                shutil.copytree(source, root / rel, ignore=IGNORED, symlinks=True)
            else:
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, root / rel)
        for rel in LINKED:
            (root / rel).symlink_to(ROOT / rel)

    def path(self, rel: str) -> Path:
        return self.root / rel

    def insert(self, rel: str, anchor: str, text: str, *, before: bool = False) -> None:
        """`text` right after (or before) `anchor`, which must occur exactly once in the file."""
        path = self.path(rel)
        source = path.read_text()
        found = source.count(anchor)
        assert found == 1, f"{rel}: the walkthrough's insertion point {anchor!r} occurs {found} times, not once"
        at = source.index(anchor) + (0 if before else len(anchor))
        path.write_text(source[:at] + text + source[at:])

    def replace(self, rel: str, old: str, new: str) -> None:
        """`old`, which must occur exactly once, replaced by `new`."""
        path = self.path(rel)
        source = path.read_text()
        found = source.count(old)
        assert found == 1, f"{rel}: the walkthrough's text {old!r} occurs {found} times, not once"
        path.write_text(source.replace(old, new))

    def add(self, rel: str, text: str) -> None:
        path = self.path(rel)
        assert not path.exists(), f"{rel} already exists in the tree"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def changed(self) -> set[str]:
        """The files of the copy that differ from the repository's or are new, relative paths."""
        out = set()
        for rel in self.copied:
            top = self.root / rel
            files = [top] if top.is_file() else (p for p in top.rglob("*") if p.is_file())
            for path in files:
                if "__pycache__" in path.parts:
                    continue
                name = path.relative_to(self.root).as_posix()
                original = ROOT / name
                if not original.is_file() or not filecmp.cmp(path, original, shallow=False):
                    out.add(name)
        return out

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a child process that imports dlbench and runners from the copy; data
        (suites, runner folders) from DLBENCH_ROOT, the repository's unless a test says otherwise."""
        return {**os.environ, "PYTHONPATH": os.pathsep.join([str(self.root / "src"), str(self.root)]),
                "DLBENCH_ROOT": str(ROOT), "COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb", **extra}

    def python(self, code: str, *args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
        """`python -c code ARGS` against the copy."""
        return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd or self.root, env=self.env(**env),
                              capture_output=True, text=True, timeout=120)

    def pytest(self, *args: str) -> subprocess.CompletedProcess:
        """The repository's own tests, as copied (`extra`, with the conftest files they need), run
        against the copy."""
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "--rootdir", str(self.root), *args], cwd=self.root, env=self.env(),
                              capture_output=True, text=True, timeout=120)

    def dlbench(self, *args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
        """`python -m dlbench.cli ARGS` against the copy, as a user would run the command."""
        return subprocess.run([sys.executable, "-m", "dlbench.cli", *args], cwd=cwd or self.root,
                              env=self.env(**env), capture_output=True, text=True, timeout=120)

    def lint_imports(self) -> subprocess.CompletedProcess:
        """import-linter's contracts (the copy's pyproject.toml) over the copy, as test_layers.lint."""
        assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS} is missing: import-linter is in the test extra"
        return subprocess.run([str(LINT_IMPORTS), "--config", str(self.root / "pyproject.toml"), "--no-cache"],
                              cwd=self.root, env=self.env(), capture_output=True, text=True, timeout=120)


def one_line(text: str) -> str:
    """Output with its line breaks and runs of spaces folded (rich wraps long messages)."""
    return " ".join(text.split())


def recipe_files(title: str) -> set[str]:
    """The **Files touched (N)** list of docs/extending.md's section `title`, with `<N+1>` as the next
    schema version; checked against its own N and against the count in the page's table, so that
    what the test changes, the recipe's list and the table cannot drift apart."""
    text = EXTENDING.read_text()
    assert f"\n## {title}\n" in text, f"docs/extending.md has no section {title!r}"
    section = text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    listed = re.search(r"\*\*Files touched \((\d+)\)\*\*:(.*?)\n\n", section, re.S)
    assert listed, f"docs/extending.md, {title!r}: no **Files touched (N)** list"
    files = [f.replace("<N+1>", str(SCHEMA_VERSION + 1)) for f in re.findall(r"`([^`]+)`", listed[2])]
    assert len(set(files)) == len(files) == int(listed[1]), f"{title!r}: the list's count is not its files"
    row = re.search(rf"^\| \[{re.escape(title)}\]\(#[^)]+\) \| (\d+)", text, re.M)
    assert row and int(row[1]) == len(files), f"docs/extending.md's table does not count {title!r} as {len(files)}"
    return set(files)
