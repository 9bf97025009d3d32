"""Build the documentation site (mkdocs.yml) into a folder, as the docs tests need it.

`mkdocs build --strict` in a fresh process, with the venv's interpreter: the hook that writes the
CLI reference and the record schema (docs/hooks/generated_pages.py) imports dlbench as the build
would anywhere. Strict turns every warning (a broken link, a missing page) into a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_docs(out: Path) -> Path:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                           "--site-dir", str(out)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=600)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out
