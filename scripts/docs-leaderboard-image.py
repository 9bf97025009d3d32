"""Render docs/images/leaderboard.png: the report's index page over the test fixture store.

The picture in the README and on the docs' home page is of the synthetic store the browser tests
use (tests/fixtures/site_store.py), so anyone can make it again, byte for byte the same layout,
without measurements of their own:

    .venv/bin/python scripts/docs-leaderboard-image.py

It needs Chromium (Debian's `chromium`, as bin/test installs it) and Playwright (the test extra).
"""

from __future__ import annotations

import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
sys.path.insert(0, str(ROOT / "tests" / "browser"))

import site_store  # noqa: E402
from conftest import chromium_executable  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

from dlbench.reporting import site  # noqa: E402

OUT = ROOT / "docs" / "images" / "leaderboard.png"
NOW = datetime(2026, 11, 20, 12, 0, tzinfo=timezone.utc)  # the fixture's own clock, so the page never changes


def main() -> None:
    executable = chromium_executable()
    if executable is None:
        sys.exit("no Chromium found: apt-get install chromium (or set DLBENCH_CHROMIUM)")
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        site_store.build(work / "store")
        site.build_site(work / "store", work / "site", workers=1, now=NOW)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=executable, headless=True, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1200, "height": 800}, device_scale_factor=1)
            page.goto((work / "site" / "index.html").as_uri())
            page.wait_for_load_state("load")
            OUT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(OUT), full_page=False)
            browser.close()
    print(OUT.relative_to(ROOT))


if __name__ == "__main__":
    main()
