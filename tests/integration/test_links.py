"""A shaped link for real (root): torch's DDP on 2 workers of a tiny network through
`dlbench run --link`, and, by name, nothing of the link left after a normal end, SIGTERM, Ctrl-C
(SIGINT), and SIGKILL of the controller followed by another dlbench command (the sweep): no
namespace, no device or qdisc in the host's namespace, no owner file, no process inside."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

# CI runs this file again as root (.github/workflows/ci.yml) with DLBENCH_REQUIRE_LINKS=1: there a
# skip would hide that it never ran, so it fails instead
CANNOT = None if os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc") else \
    "--link needs root and iproute2 (ip, tc)"
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(CANNOT is not None and not os.environ.get("DLBENCH_REQUIRE_LINKS"), reason=str(CANNOT)),
]


@pytest.fixture(autouse=True)
def _required():
    if CANNOT is not None:
        pytest.fail(f"DLBENCH_REQUIRE_LINKS is set, but {CANNOT}")

DLBENCH = [sys.executable, "-m", "dlbench.cli"]
NAMESPACES = re.compile(r"workers in namespaces (dlb([0-9a-f]{6}))-w0")


def suite(tmp_path: Path, measure_iters: int) -> Path:
    """A distributed suite of one tiny network (16-64-4, 1.4k parameters)."""
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump({
        "name": "tiny", "description": "16-64-4", "input": {"kind": "tensor", "shape": [16], "classes": 4},
        "layers": [{"type": "dense", "units": 64}, {"type": "relu"}, {"type": "dense", "units": 4}]}))
    path = tmp_path / f"tiny-{measure_iters}.yaml"
    path.write_text(yaml.safe_dump({
        "name": "tinylink", "kind": "distributed", "description": "a tiny network on a shaped link",
        "scaling": "strong", "defaults": {"learning_rate": 0.01, "momentum": 0.9},
        "policy": {p: {"warmup_iters": 2, "measure_iters": measure_iters, "repeats": 1}
                   for p in ("smoke", "default", "paper")},
        "benchmarks": [{"network": "tiny.yaml", "batch_sizes": {p: [8] for p in ("smoke", "default", "paper")}}]}))
    return path


def endless_comm_suite(tmp_path: Path) -> Path:
    """A comm suite whose one job (no one-worker baseline before it) runs until it is stopped."""
    path = tmp_path / "endless.yaml"
    path.write_text(yaml.safe_dump({
        "name": "endless", "kind": "comm", "description": "all-reduce until stopped", "collectives": ["all_reduce"],
        "dtype": "float32", "sizes": {p: [4096] for p in ("smoke", "default", "paper")},
        "policy": {p: {"warmup_iters": 2, "measure_iters": 10**7, "repeats": 1} for p in ("smoke", "default", "paper")}}))
    return path


def command(tmp_path: Path, suite_path: Path) -> list[str]:
    return DLBENCH + ["run", "--suite", str(suite_path), "--framework", "torch", "--workers", "2", "--profile",
                      "smoke", "--device", "cpu", "--store", str(tmp_path / "store"), "--link", "100mbit"]


def left_of(name: str) -> list[str]:
    """Everything named after the link `name` (dlb<token>) that is still there."""
    left = [n for n in os.listdir("/run/netns") if n.startswith(name)] if os.path.isdir("/run/netns") else []
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True, check=True).stdout
    left += [f"link {line.split(':')[1].strip()}" for line in links.splitlines() if name in line]
    left += [f"qdisc {line}" for line in qdiscs.splitlines() if name in line]
    if Path(f"/run/dlbench/links/{name[3:]}.json").exists():
        left.append("owner file")
    return left


def test_ddp_on_a_shaped_link_records_it_and_leaves_nothing(tmp_path):
    # 200 iterations: the window spans many of the counters' 10 ms samples (interpolated at its ends)
    done = subprocess.run(command(tmp_path, suite(tmp_path, 200)), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    name = NAMESPACES.search(done.stderr).group(1)
    assert left_of(name) == []
    records = {r["benchmark"]: r for r in (json.loads(p.read_text()) for p in (tmp_path / "store/runs").glob("*.json"))}
    assert set(records) == {"tiny-train-w1", "tiny-train-w2@100mbit"}  # the baseline on loopback
    record = records["tiny-train-w2@100mbit"]
    assert record["status"] == "ok" and record["distributed"]["backend"] == "gloo"
    link = record["link"]
    assert link["asked"] == "100mbit" and link["rate_bps"] == 10**8 and link["shaping"].startswith("tbf rate")
    assert 0.5e8 < link["measured"]["bandwidth_bps"] < 1.05e8  # at most the rate (it is the payload's)
    assert record["distributed"]["hosts"][0].startswith(link["subnet"].rsplit(".", 1)[0])
    wire = link["wire"]
    grad = record["distributed"]["grad_bytes"]
    assert wire["ring_allreduce_bytes"] == grad  # 2(n-1)/n = 1 at two workers
    # every gradient crossed the wire (5.4 KB per iteration), with its packets' headers and acks
    assert all(grad < sent < 1.3 * grad for sent in wire["sent_per_iter"]), wire
    assert records["tiny-train-w1"]["link"] is None


def _started(proc: subprocess.Popen, tmp_path: Path) -> str:
    """The link's name once its job's ranks run inside its namespaces."""
    deadline = time.monotonic() + 180
    err = tmp_path / "err.txt"
    while time.monotonic() < deadline:
        assert proc.poll() is None, err.read_text()[-4000:]
        found = NAMESPACES.search(err.read_text())
        if found:
            pids = subprocess.run(["ip", "netns", "pids", f"{found.group(1)}-w1"], capture_output=True, text=True)
            if pids.stdout.split():
                time.sleep(1.0)  # a moment in the job
                return found.group(1)
        time.sleep(0.2)
    raise AssertionError("the job on the link never started")


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGKILL, -9)])
def test_nothing_is_left_after_a_signal(tmp_path, sig, status):
    with open(tmp_path / "err.txt", "w") as err:
        proc = subprocess.Popen(command(tmp_path, endless_comm_suite(tmp_path)), stdout=subprocess.DEVNULL, stderr=err)
    try:
        name = _started(proc, tmp_path)
        inside = [int(p) for ns in ("w0", "w1") for p in subprocess.run(
            ["ip", "netns", "pids", f"{name}-{ns}"], capture_output=True, text=True).stdout.split()]
        proc.send_signal(sig)
        assert proc.wait(timeout=120) == status
        if sig == signal.SIGKILL:
            # nobody removed it: the next dlbench command does (run nothing else meanwhile: any
            # dlbench command, a unit test's included, would remove it first)
            assert left_of(name)
            listing = subprocess.run(DLBENCH + ["list"], capture_output=True, text=True, timeout=120)
            assert listing.returncode == 0 and name in listing.stderr, listing.stderr
        assert left_of(name) == []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in inside):
            time.sleep(0.1)
        assert not [p for p in inside if Path(f"/proc/{p}").exists()]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run(DLBENCH + ["list"], capture_output=True, timeout=120)  # whatever a failure left
