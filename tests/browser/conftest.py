"""Headless Chromium for the site's browser tests: Debian's `chromium`, driven by Playwright.

Playwright (a Python package, in the `test` extra) drives a browser over the DevTools protocol;
it is pointed at the system's Chromium with `executable_path`, so Playwright's own browser
download (not reachable from our machines) is never needed. bin/test installs Debian's chromium
when it is missing and it can (root or passwordless sudo, apt-get present).

Where no browser can be had the tests skip, saying why; under CI=true they fail instead, so a CI
machine without a browser cannot pass by skipping. Screenshots go to test-artifacts/browser/ (or
$DLBENCH_ARTIFACTS), printed at the end of the run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_executable() -> str | None:
    explicit = os.environ.get("DLBENCH_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    return next((found for name in BROWSER_NAMES if (found := shutil.which(name))), None)


def artifacts_dir() -> Path:
    return Path(os.environ.get("DLBENCH_ARTIFACTS") or ROOT / "test-artifacts" / "browser")


def _unavailable(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"browser tests cannot run under CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def browser():
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (it is in the `test` extra: bin/test installs it)")
    executable = chromium_executable()
    if executable is None:
        _unavailable("no Chromium found (tried $DLBENCH_CHROMIUM, " + ", ".join(BROWSER_NAMES)
                     + "); bin/test installs Debian's chromium where it can, or: apt-get install chromium")
    with sync_playwright() as p:
        try:
            # --no-sandbox: Chromium refuses to start its sandbox as root, which CI and these machines are
            launched = p.chromium.launch(executable_path=executable, headless=True, args=["--no-sandbox"])
        except Error as e:
            _unavailable(f"{executable} did not start under Playwright: {e}")
        yield launched
        launched.close()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    out = artifacts_dir()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    return out


def pytest_terminal_summary(terminalreporter):
    out = artifacts_dir()
    shots = sorted(out.glob("*.png")) if out.is_dir() else []
    if shots:
        terminalreporter.write_line(f"browser screenshots ({len(shots)}): {out}")
