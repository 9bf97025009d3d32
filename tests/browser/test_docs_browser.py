"""The documentation site in a real browser (headless Chromium), opened from disk as a reader
without a server would: the home page loads without a console error, its leaderboard picture is
drawn, its navigation reaches the generated CLI reference. A screenshot of the home page goes to
test-artifacts/docs/home.png (beside the report's, see conftest.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .conftest import artifacts_dir

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from docs_site import build_docs  # noqa: E402


@pytest.fixture(scope="module")
def docs_site(tmp_path_factory) -> Path:
    return build_docs(tmp_path_factory.mktemp("docs-browser") / "site")


@pytest.fixture(scope="module")
def docs_artifacts() -> Path:
    out = artifacts_dir().parent / "docs"
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_the_docs_home_page_opens_from_disk(browser, docs_site, docs_artifacts):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
    try:
        page.goto((docs_site / "index.html").as_uri())
        page.wait_for_load_state("load")
        assert "dlbench" in page.title()
        picture = page.locator("img[src$='leaderboard.png']")
        assert picture.count() == 1
        assert picture.evaluate("img => img.complete && img.naturalWidth > 0"), "the leaderboard picture did not load"
        page.screenshot(path=str(docs_artifacts / "home.png"), full_page=True)
        assert problems == [], problems
        page.get_by_role("link", name="CLI").first.click()
        page.wait_for_load_state("load")
        assert page.url.endswith("reference/cli.html")
        assert page.locator("h2#dlbench-run").count() == 1
    finally:
        context.close()
