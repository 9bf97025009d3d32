"""The report's run page of a docker-backend run shows how its container was had and run: the engine,
the image (id, digest, base image) and the options it ran with, its CPU placement among them."""

from __future__ import annotations

import json
from pathlib import Path

from dlbench.reporting.site import render_runs
from dlbench.store.document import checksum_of

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "records"


def rendered(tmp_path: Path, data: dict) -> str:
    store = tmp_path / "store"
    (store / "runs").mkdir(parents=True)
    path = store / "runs" / f"{data['run_id']}.json"
    path.write_text(json.dumps(data))
    out = tmp_path / "site"
    views, problems = render_runs(str(store), [str(path)], str(out), "2026-12-07T00:00:00Z", False)
    assert not problems and len(views) == 1
    return next((out / "runs").glob("*.html")).read_text()


def row(page: str, key: str) -> str:
    """The value beside `key` in the page's key-value tables."""
    start = page.index(f">{key}<")
    cell = page.index("<td", start)
    return page[page.index(">", cell) + 1:page.index("</td>", cell)]


def test_the_run_page_shows_the_container_facts(tmp_path):
    data = json.loads((FIXTURES / "v15.json").read_text())  # a real docker record (README there)
    container = data["environment"]["container"]
    page = rendered(tmp_path, data)
    assert row(page, "container.engine.engine") == container["engine"]["engine"] == "docker"
    assert row(page, "container.engine.api") == "docker-api"
    assert row(page, "container.engine.builder") == "classic"
    assert row(page, "image_id") == data["environment"]["image_id"]
    assert row(page, "container.image_digest") == "null"  # built here, never pushed: the image id is its address
    assert row(page, "container.base_image") == "dlbench/base:bookworm-local"
    assert row(page, "container.run_options") == ", ".join(container["run_options"])
    assert "--init" in row(page, "container.run_options")
    assert row(page, "container.stop").startswith("SIGTERM")


def test_the_run_page_shows_where_the_container_competed_for_the_cpu(tmp_path):
    data = json.loads((FIXTURES / "v15.json").read_text())
    data.pop("checksum")
    data["environment"]["container"]["cpu"] = {
        "placement": "caller", "cgroup_parent": "/",
        "cpu_shares": "the weight of the caller's session (autogroup, nice 0)"}
    data["checksum"] = checksum_of(data)
    page = rendered(tmp_path, data)
    assert row(page, "container.cpu.placement") == "caller"
    assert row(page, "container.cpu.cgroup_parent") == "/"
    assert "autogroup" in row(page, "container.cpu.cpu_shares")
